# psgd: every target that runs code depends on `install`, so on a fresh machine
# `make test` or `make demo` alone does all set-up.
#   MPI=pypi   (default) MPICH from PyPI (the `mpich` wheel) with mpi4py's wheel
#   MPI=system build mpi4py against the mpicc on PATH (a cluster's own MPI)
PYTHON ?= python3
MPI ?= pypi
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.psgd-installed-$(MPI)
# bench/common.py finds mpiexec from these: MPIEXEC if set, else (MPI=system) the one on PATH
export MPI

ifeq ($(MPI),system)
EXTRAS := plot,test,tensorboard
else
EXTRAS := mpich,plot,test,tensorboard
endif

.PHONY: install docs check-wheel test test-all test-slurm test-openmpi soak demo bench bench-quick bench-kernels bench-ps bench-allreduce bench-compress bench-compress-accuracy bench-compress-time bench-async bench-gossip bench-net bench-stragglers bench-sparse clean bench-hogwild bench-rma bench-winograd bench-hier-chunks bench-sparse-sharing bench-data-order bench-stragglers-merge coverage install-peer bench-peer bench-peer-swap bench-peer-float64 bench-peer-kinks bench-simulate bench-pipeline bench-tensor bench-elastic bench-elastic-pairs bench-plan

install: $(STAMP)

$(STAMP): pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
ifeq ($(MPI),system)
	$(PY) -m pip install -q --no-binary mpi4py mpi4py
endif
	$(PY) -m pip install -q -e '.[$(EXTRAS)]'
	rm -f $(VENV)/.psgd-installed-*
	touch $(STAMP)

# the peers (PyTorch CPU, scikit-learn) for tests/test_peer_torch.py, the text converter's
# check and bench-peer; not part of `install`: make test-all installs them
PEER_STAMP := $(VENV)/.psgd-peer
install-peer: $(PEER_STAMP)

$(PEER_STAMP): $(STAMP)
	$(PY) -m pip install -q -e '.[peer]'
	touch $(PEER_STAMP)

bench-peer: install-peer
	$(PY) bench/bench_peer.py $(ARGS)

# the init swap that found #43's cause (ARGS="--data FILE.h5 [--model cifar-cnn]")
bench-peer-swap: install-peer
	$(PY) bench/peer_swap.py $(ARGS)

# how far float32 trajectories stray from PyTorch in float64 (the harness's tolerance)
bench-peer-float64: install-peer
	$(PY) bench/peer_float64.py $(ARGS)

# the first step where a ReLU sign or a max-pool arg-max differs from PyTorch float64 (#43's kinks)
bench-peer-kinks: install-peer
	$(PY) bench/peer_kinks.py $(ARGS)

# the tiers (docs/guide/testing.md). make test: every in-process test and one combined end-to-end
# run per protocol family, about 4 minutes on 2 cores; starts no daemon, installs nothing
FAST := (not mpi or e2e) and not slow and not root and not slurm and not soak
test: install
	$(PY) -m pytest -q -m "$(FAST)" tests

# everything but the soak: every launch, the slow runs, root (namespaces) and Slurm tests (as
# root these apt-get install slurm-wlm and munge and start their daemons), then Open MPI
test-all: install install-peer
	$(PY) -m pytest -q -m "not soak" tests
	tests/openmpi/check.sh

# the batch files on a real one-node Slurm (root; installs slurm-wlm and munge when missing)
test-slurm: install
	$(PY) -m pytest -q -m slurm tests

# every protocol under Debian's Open MPI, mpi4py built against it in .venv-openmpi (MPI=system)
test-openmpi:
	tests/openmpi/check.sh

# the soak test (several minutes) is in neither tier
soak: install
	$(PY) -m pytest -q -m soak tests

# line coverage of psgd/ and kernels/, the ranks mpiexec starts included (.coveragerc):
# make coverage (test-all's pytest part) or make coverage TIER=fast (make test's selection)
TIER ?= all
coverage: install
	$(PY) -m pytest -q -m "$(if $(filter fast,$(TIER)),$(FAST),not soak)" tests --cov \
		--cov-report=term --durations=0

demo: install
	$(PY) -m psgd.demo

# the docs site (docs/, mkdocs.yml) into site/, failing on any broken link or anchor
docs: $(VENV)/.psgd-docs
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

$(VENV)/.psgd-docs: $(STAMP)
	$(PY) -m pip install -q -e '.[$(EXTRAS),docs]'
	touch $@

# a wheel built from the tree, installed into a fresh venv outside it, trains from elsewhere
check-wheel:
	PYTHON=$(PYTHON) MPI=$(MPI) .ci/wheel-check

# Every bench-* target writes its results into runs/bench/NAME-TIME/ (git-ignored), each file
# stamped with commit, machine, command, UTC time and data set; ARGS=--publish writes them into
# bench/results/ instead, from which docs/results/ is made.
bench-kernels: install
	$(PY) bench/bench_kernels.py $(ARGS)

bench-ps: install
	$(PY) bench/bench_ps.py $(ARGS)

bench-allreduce: install
	$(PY) bench/bench_allreduce.py $(ARGS)

bench-hogwild: install
	$(PY) bench/bench_hogwild.py $(ARGS)

# Conv2D's im2col/Winograd choice, per layer (one thread)
bench-winograd: install
	$(PY) bench/bench_winograd.py $(ARGS)

# hogwild's one-sided ops across emulated nodes (root: psgd net)
bench-rma: install
	$(PY) bench/bench_rma.py $(ARGS)

# the hierarchical all-reduce's chunk sizes on 2 emulated nodes (root: psgd net)
bench-hier-chunks: install
	$(PY) bench/bench_hier_chunks.py $(ARGS)

# a worker's load time and memory: rows dealt by a permutation against a contiguous slice
bench-data-order: install
	$(PY) bench/bench_data_order.py $(ARGS)

# rows two sparse hogwild workers share (ARGS="--data SPARSE.h5" or ARGS=--line-transfer)
bench-sparse-sharing: install
	$(PY) bench/sparse_sharing.py $(ARGS)

# bench-stragglers runs made one per invocation, merged (ARGS="OUT.json RUN_DIR...")
bench-stragglers-merge: install
	$(PY) bench/merge_straggler_runs.py $(ARGS)

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

# pipeline parallelism: bubble vs (K-1)/(M+K-1), 1f1b vs gpipe memory, vs allreduce (a few minutes)
bench-pipeline: install
	$(PY) bench/bench_pipeline.py $(ARGS)

# staleness compensation x protocols x W x seeds, LeNet and MLP: about two hours on 2 cores
# (ARGS=--quick: a smoke run; ARGS="--models lenet --seeds 0,1": the table of docs/results/staleness.md, 35 min)
bench-async: install
	$(PY) bench/bench_async.py $(ARGS)

# psgd simulate: its speed at 1,024 workers, validation against real runs at W = 2, 4, and
# the W = 16..1024 table (training along the order up to W = 256): a few minutes
bench-simulate: install
	$(PY) bench/bench_simulate.py $(ARGS)

# gossip and adpsgd against allreduce, LeNet on Fashion-MNIST, W = 4, two seeds: about 10 min
# on 2 cores (W = 8: about 10 min more) (ARGS=--quick: a smoke run; ARGS="--workers 4,8": also W = 8)
# (ARGS="--net 1gbit --straggler 1,3 --seeds 0,1,2 --epochs 1 --log-every 10": on 4 emulated
# nodes at 1 Gbit/s, with and without a 3x straggler, root: about 17 min)
bench-gossip: install
	$(PY) bench/bench_gossip.py $(ARGS)

# a wide MLP split over T ranks (--tensor) against D data replicas and the grid (a few minutes)
bench-tensor: install
	$(PY) bench/bench_tensor.py $(ARGS)

bench-plan: install   # the plans psgd plan --auto keeps, run on 2 ranks (ARGS="--net 1gbit,10gbit --ranks 2,4": on psgd net, root): a few minutes
	$(PY) bench/bench_plan.py $(ARGS)

bench-elastic: install   # a run that loses a worker and gains one, against an uninterrupted one
	$(PY) bench/bench_elastic.py $(ARGS)

bench-elastic-pairs: install   # elastic adpsgd: 4 workers losing one at 30 %, against 3 from the start
	$(PY) bench/bench_elastic_pairs.py $(ARGS)

# stragglers (none, one 3x slower, transient pauses) x bsp, ssp s=1,3,8, asp, ssp auto x W=2,4 x 3
# seeds, LeNet on Fashion-MNIST: time to a target test accuracy (ARGS=--quick: a smoke run;
# ARGS=--seeds 0,1: the table of docs/results/stragglers.md)
bench-stragglers: install
	$(PY) bench/bench_stragglers.py $(ARGS)

# sparse hogwild against dense hogwild (bytes per update, 1 vs 2 workers) and scikit-learn's
# SGDClassifier (the peer, installed into the venv here; psgd never needs it): about 2 min on 2
# cores (ARGS=--quick); then psgd's sparse defaults against SGDClassifier's on a man-page TF-IDF
# set built here and on the synthetic set (bench_sparse_defaults.py, about 5 min)
bench-sparse: install
	$(PY) -c "import sklearn" 2>/dev/null || $(PY) -m pip install -q scikit-learn
	$(PY) bench/bench_sparse.py $(ARGS)
	$(PY) bench/bench_sparse_defaults.py $(ARGS)

bench: install
	$(PY) bench/run_all.py $(ARGS)

bench-quick: install
	$(PY) bench/run_all.py --quick $(ARGS)

clean:
	rm -rf $(VENV) build site *.egg-info .pytest_cache
	find . -name __pycache__ -prune -exec rm -rf {} +
