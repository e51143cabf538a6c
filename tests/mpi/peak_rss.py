"""Run `python -m psgd ARGS` as this rank and print ``PEAK_RSS RANK BYTES``: the child's peak
resident set (this wrapper imports no MPI, so the child is the rank mpiexec started)."""
import os
import resource
import subprocess
import sys


def main():
    pmi = [int(os.environ["PMI_FD"])] if "PMI_FD" in os.environ else []   # hydra's socket
    code = subprocess.call([sys.executable, "-m", "psgd", *sys.argv[1:]], pass_fds=pmi)
    peak = 1024 * resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss    # Linux: KiB
    print(f"\nPEAK_RSS {os.environ.get('PMI_RANK', '0')} {peak}", flush=True)
    sys.exit(code)


if __name__ == "__main__":
    main()
