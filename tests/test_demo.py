"""`make demo` (psgd/demo.py): the run it launches, and a failed run ends it with exit 1."""
import os
import sys

from psgd import demo


def test_demo_launches_lenet_ssp_on_three_ranks_and_fails_when_the_run_fails(
        tmp_path, monkeypatch, capsys):
    launcher = tmp_path / "launcher"
    argv_file = tmp_path / "argv"
    launcher.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$@\" > {argv_file}\nexit 3\n")
    launcher.chmod(0o755)
    out = tmp_path / "demo"
    out.mkdir()
    (out / "synth.h5").touch()                  # present: the demo does not synthesize it again
    monkeypatch.setattr(demo, "OUT", out)
    monkeypatch.setenv("PSGD_MPIEXEC", str(launcher))
    assert demo.main() == 1
    argv = argv_file.read_text().splitlines()
    assert argv[:4] == ["-n", "3", sys.executable, "-m"]
    flags = " ".join(argv[4:])
    for words in ("psgd train", f"--data {out / 'synth.h5'}", "--model lenet", "--protocol ssp",
                  "--staleness 2", "--servers 1", f"--log {out / 'ssp.jsonl'}", "--overwrite"):
        assert words in flags, flags
    assert "psgd demo: training failed" in capsys.readouterr().err
    assert not (out / "ssp.png").exists() and os.listdir(out) == ["synth.h5"]
