"""The CNN example trains with BatchNorm state and its checkpoint loads into torch."""

import importlib.util
from pathlib import Path

import numpy as np

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "digits_cnn.py"


def load_example():
    spec = importlib.util.spec_from_file_location("digits_cnn", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_smoke_run_and_torch_loads_checkpoint(tmp_path, torch):
    example = load_example()
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
