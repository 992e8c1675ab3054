"""examples/sharded_gpt.py runs end to end on 4 host devices and reloads its checkpoint
onto the mesh unchanged (a subprocess: the device count is fixed when JAX starts)."""

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).parents[1] / "examples" / "sharded_gpt.py"


def test_sharded_gpt_trains_saves_and_reloads(tmp_path):
    args = "--mesh data=2,model=2 --steps 3 --dim 32 --layers 1 --batch-size 8 --seq 16"
    run = subprocess.run(
        [sys.executable, str(SCRIPT), *args.split(), "--chars", "20000", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "mesh {'data': 2, 'model': 2} on 4 cpu devices" in run.stdout
    assert "step time: median" in run.stdout
    assert "reloaded onto the mesh: identical" in run.stdout
    assert (tmp_path / "model.safetensors").is_file()
    # written in the model's (torch's) order, not sorted: its own table, then children
    import purelayers as pl

    names = list(pl.params.load(tmp_path / "model.safetensors"))
    assert names[:4] == ["pos_emb", "embed.weight", "blocks.0.ln1.weight", "blocks.0.ln1.bias"]
