"""`make demo`: synthesize the default dataset, train the CNN with SSP on 1 server + 2 workers, plot."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from psgd.run.metrics import read_log

OUT = Path(os.environ.get("PSGD_DEMO_DIR", "demo"))
TARGET_ACCURACY = 0.85


def _mpiexec() -> str:
    local = Path(sys.executable).parent / "mpiexec"
    return os.environ.get("PSGD_MPIEXEC") or (str(local) if local.exists() else "mpiexec")


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    data, log, ckpt, png = OUT / "synth.h5", OUT / "ssp.jsonl", OUT / "checkpoints", OUT / "ssp.png"
    py = sys.executable
    if not data.exists():
        subprocess.run([py, "-m", "psgd", "data", "synth", "-o", str(data)], check=True)
    cmd = [_mpiexec(), "-n", "3", py, "-m", "psgd", "train", "--data", str(data),
           "--model", "lenet", "--protocol", "ssp", "--staleness", "2", "--servers", "1",
           "--optimizer", "sgd", "--lr", "0.1", "--epochs", "3", "--eval-every", "50",
           "--log", str(log), "--checkpoint-dir", str(ckpt), "--checkpoint-every", "100",
           "--overwrite"]   # each `make demo` is a new run: it replaces the last one's files
    print("+ " + " ".join(cmd), flush=True)
    if subprocess.run(cmd).returncode != 0:
        print("psgd demo: training failed (see the message above)", file=sys.stderr)
        return 1
    subprocess.run([py, "-m", "psgd", "plot", str(log), "-o", str(png),
                    "--title", "psgd demo: lenet, ssp s=2, 1 server + 2 workers"], check=True)
    summary = next(r for r in read_log(log) if r["kind"] == "summary")
    acc = summary["test_accuracy"]
    print(f"\npsgd demo: final test accuracy {acc:.4f} "
          f"({summary['samples_per_s']:.0f} samples/s over {summary['wall_s']:.1f} s)")
    print(f"  data        {data}\n  log         {log}\n  checkpoints {ckpt}/\n  plot        {png}")
    if acc < TARGET_ACCURACY:
        print(f"psgd demo: FAILED: accuracy {acc:.3f} is below the target {TARGET_ACCURACY}: "
              f"the model did not learn", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
