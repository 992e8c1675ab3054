"""The interop example crosses torch -> JAX -> torch with matching logits."""

from tests.example_loader import load_example


def test_round_trip_logits_agree(tmp_path, torch):
    example = load_example("from_torch")
    result = example.main(["--torch-steps", "5", "--steps", "5", "--out", str(tmp_path)])
    assert result["gap_in"] < 1e-4 and result["gap_out"] < 1e-4
    assert (tmp_path / "to_torch.safetensors").stat().st_size > 0
