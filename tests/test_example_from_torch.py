"""The interop example crosses torch -> JAX -> torch with matching logits."""

import importlib.util
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "from_torch.py"


def test_round_trip_logits_agree(tmp_path, torch):
    spec = importlib.util.spec_from_file_location("from_torch", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    result = example.main(["--torch-steps", "5", "--steps", "5", "--out", str(tmp_path)])
    assert result["gap_in"] < 1e-4 and result["gap_out"] < 1e-4
    assert (tmp_path / "to_torch.safetensors").stat().st_size > 0
