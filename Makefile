# psgd: every target that runs code depends on `install`, so on a fresh machine
# `make test` or `make demo` alone does all set-up.
#   MPI=pypi   (default) MPICH from PyPI (the `mpich` wheel) with mpi4py's wheel
#   MPI=system build mpi4py against the mpicc on PATH (a cluster's own MPI)
PYTHON ?= python3
MPI ?= pypi
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.psgd-installed-$(MPI)

ifeq ($(MPI),system)
EXTRAS := plot,test
else
EXTRAS := mpich,plot,test
endif

.PHONY: install install-peer bench-peer test test-all test-slurm test-openmpi soak demo bench bench-quick bench-kernels bench-ps bench-allreduce bench-compress bench-compress-accuracy bench-compress-time bench-async bench-gossip bench-net bench-stragglers bench-sparse clean

install: $(STAMP)

$(STAMP): setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
ifeq ($(MPI),system)
	$(PY) -m pip install -q --no-binary mpi4py mpi4py
endif
	$(PY) -m pip install -q -e '.[$(EXTRAS)]'
	rm -f $(VENV)/.psgd-installed-*
	touch $(STAMP)

# PyTorch (CPU) for the peer harness and bench-peer; not part of `install` (test-all may depend on it)
PEER_STAMP := $(VENV)/.psgd-peer
install-peer: $(PEER_STAMP)

$(PEER_STAMP): $(STAMP)
	$(PY) -m pip install -q -e '.[peer]'
	touch $(PEER_STAMP)

bench-peer: install-peer
	$(PY) bench/bench_peer.py $(ARGS)

test: install
	$(PY) -m pytest -q tests

# the batch files on a real one-node Slurm (root; installs slurm-wlm and munge when missing)
test-slurm: install
	$(PY) -m pytest -q -m slurm tests

# every protocol under Debian's Open MPI, mpi4py built against it in .venv-openmpi (MPI=system)
test-openmpi:
	tests/openmpi/check.sh

# the soak test (several minutes) is not part of the quick suite
soak: install
	$(PY) -m pytest -q -m soak tests

demo: install
	$(PY) -m psgd.demo

bench-kernels: install
	$(PY) bench/bench_kernels.py

bench-ps: install
	$(PY) bench/bench_ps.py

bench-allreduce: install
	$(PY) bench/bench_allreduce.py

bench-compress: install
	$(PY) bench/bench_compress.py $(ARGS)

bench-compress-accuracy: install
	$(PY) bench/bench_compress_accuracy.py $(ARGS)

bench-compress-time: install
	$(PY) bench/bench_compress_time.py $(ARGS)

# the protocols on 2 and 4 emulated nodes at 1 and 10 Gbit/s, measured beside psgd plan's
# prediction, and the all-reduce's bus bandwidth there (root: psgd net; about 10 minutes)
bench-net: install
	$(PY) bench/bench_net.py $(ARGS)

# staleness compensation x protocols x W x seeds, LeNet and MLP: about two hours on 2 cores
# (ARGS=--quick: a smoke run; ARGS="--models lenet --seeds 0,1": the README table, 35 min)
bench-async: install
	$(PY) bench/bench_async.py $(ARGS)

# gossip and adpsgd against allreduce, LeNet on Fashion-MNIST, W = 4, two seeds: about 10 min
# on 2 cores (W = 8: about 10 min more) (ARGS=--quick: a smoke run; ARGS="--workers 4,8": also W = 8)
# (ARGS="--net 1gbit --straggler 1,3 --seeds 0,1,2 --epochs 1 --log-every 10": on 4 emulated
# nodes at 1 Gbit/s, with and without a 3x straggler, root: about 17 min)
bench-gossip: install
	$(PY) bench/bench_gossip.py $(ARGS)

# stragglers (none, one 3x slower, transient pauses) x bsp, ssp s=1,3,8, asp, ssp auto x W=2,4 x 3
# seeds, LeNet on Fashion-MNIST: time to a target test accuracy (ARGS=--quick: a smoke run;
# ARGS=--seeds 0,1: the README table)
bench-stragglers: install
	$(PY) bench/bench_stragglers.py $(ARGS)

# sparse hogwild against dense hogwild (bytes per update, 1 vs 2 workers) and scikit-learn's
# SGDClassifier (the peer, installed into the venv here; psgd never needs it): about 2 min on 2
# cores (ARGS=--quick)
bench-sparse: install
	$(PY) -c "import sklearn" 2>/dev/null || $(PY) -m pip install -q scikit-learn
	$(PY) bench/bench_sparse.py $(ARGS)

bench: install
	$(PY) bench/run_all.py

bench-quick: install
	$(PY) bench/run_all.py --quick

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
	find . -name __pycache__ -prune -exec rm -rf {} +
