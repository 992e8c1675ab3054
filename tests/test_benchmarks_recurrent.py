"""The recurrent benchmark's smoke mode runs (no timing is asserted)."""

from benchmarks import recurrent


def test_quick_mode_runs(capsys):
    result = recurrent.main(["--quick"])
    out = capsys.readouterr().out
    assert "compile time" in out and "purelayers (unroll" in out
    assert set(result["compile"]) == {4, 16}
    assert all(ms > 0 for ms in result["step_ms"].values())
