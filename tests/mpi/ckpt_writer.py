"""Write checkpoints of a large model into DIR over and over (a test SIGKILLs it mid-write).

Usage: python ckpt_writer.py DIR MODEL_SPEC N_PARAMS; prints "saved STEP" after each save.
"""
import sys

import numpy as np

from psgd.run.checkpoint import Checkpoint, list_checkpoints, load_checkpoint, save_checkpoint


def main():
    directory, spec, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    found = list_checkpoints(directory)
    step = load_checkpoint(found[-1]).step if found else 0
    rng = np.random.default_rng(step)
    params = rng.standard_normal(n, dtype=np.float32) * 0.01
    while True:
        step += 1
        params[step % n] = step  # each checkpoint differs
        save_checkpoint(directory, Checkpoint(params=params, model_spec=spec, step=step,
                                              optimizer="sgd", protocol="allreduce"))
        print(f"saved {step}", flush=True)


if __name__ == "__main__":
    main()
