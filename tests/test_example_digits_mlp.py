"""The README's main job runs end to end in a short smoke mode."""

import json

import numpy as np

from tests.example_loader import load_example


def test_smoke_run_learns_and_writes_outputs(tmp_path, torch):
    example = load_example("digits_mlp")
    metrics = example.main(["--steps", "60", "--out", str(tmp_path)])
    assert metrics["history"]["loss"][-1] < metrics["history"]["loss"][0]
    assert metrics["test_accuracy"] > 0.5
    for name in ("model.safetensors", "metrics.json", "curves.png"):
        assert (tmp_path / name).stat().st_size > 0
    assert json.loads((tmp_path / "metrics.json").read_text())["steps"] == 60

    from safetensors.torch import load_file

    module = torch.nn.Sequential(
        torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Dropout(0.1), torch.nn.Linear(256, 10)
    ).eval()
    module.load_state_dict(load_file(tmp_path / "model.safetensors"), strict=True)
    x, y = example.common.digits()[2:]
    with torch.no_grad():
        acc = (module(torch.tensor(x)).argmax(-1).numpy() == y).mean()
    np.testing.assert_allclose(acc, metrics["test_accuracy"], atol=1e-6)
