"""The CNN example trains with BatchNorm state and its checkpoint loads into torch."""

import numpy as np

from tests.example_loader import load_example


def test_smoke_run_and_torch_loads_checkpoint(tmp_path, torch):
    example = load_example("digits_cnn")
    metrics = example.main(["--steps", "40", "--width", "8", "--out", str(tmp_path), "--no-plot"])
    history = metrics["history"]
    assert history["loss"][-1] < history["loss"][0]
    assert metrics["test_accuracy"] > 0.5
    assert (tmp_path / "model.safetensors").stat().st_size > 0

    from safetensors.torch import load_file

    module = example.torch_equivalent(torch, width=8).eval()
    flat = load_file(tmp_path / "model.safetensors")
    assert flat["1.num_batches_tracked"].dtype == torch.int64
    assert int(flat["1.num_batches_tracked"]) == 40
    module.load_state_dict(flat, strict=True)
    x, y = example.common.digits(images=True)[2:]
    with torch.no_grad():
        acc = (module(torch.tensor(x)).argmax(-1).numpy() == y).mean()
    np.testing.assert_allclose(acc, metrics["test_accuracy"], atol=1e-6)
