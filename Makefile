# The three commands of README.md: `make setup`, `make demo`, `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# A GPU install: `make setup TORCH=cu128` (PyTorch's tag of a CUDA version: cu126, cu128...)
# takes torch from PyTorch's index for it; constraints.txt's pin still holds (PEP 440:
# `==2.13.0` matches `2.13.0+cu128`). `make setup TORCH=pypi` takes PyPI's own wheel of the
# pinned version, PyTorch's default build (on Linux x86_64 a CUDA build, of the CUDA version
# PyTorch chose for that release), where PyTorch's index is out of reach: `===` asks for
# that exact release, with no local label, which PEP 440 ranks below a CPU build
# (2.13.0+cpu) pip's configuration may offer too. Empty: the CPU build, as before.
TORCH  ?=
TORCH_FROM = $(if $(filter pypi,$(TORCH)),--index-url https://pypi.org/simple,--index-url https://download.pytorch.org/whl/$(TORCH) --extra-index-url https://pypi.org/simple)
TORCH_REQ  = $(if $(filter pypi,$(TORCH)),torch===$(shell sed -n 's/^torch==//p' constraints.txt),torch)

.PHONY: setup demo test test-fast lint bench bundle compare-env clean

setup:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip
	@# torch first, alone, so that only torch comes from PyTorch's index; --upgrade replaces
	@# a CPU build already there (PEP 440 ranks 2.13.0+cu128 above 2.13.0+cpu; for pypi,
	@# 2.13.0+cpu does not match `===2.13.0`)
	$(if $(TORCH),$(BIN)/python -m pip install --upgrade -c constraints.txt $(TORCH_FROM) $(TORCH_REQ))
	$(BIN)/python -m pip install -c constraints.txt -e ".[dev,owner]"
	@# trio-typing (a libp2p dependency) ships stale stubs for trio that hide trio's own
	@# inline types from mypy; trio is typed by itself since 0.23.
	$(BIN)/python -c "import shutil, sysconfig; shutil.rmtree(sysconfig.get_paths()['purelib'] + '/trio-stubs', ignore_errors=True)"

demo:
	$(BIN)/moehome demo

lint:
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

# the slowest tests listed at the end: the suite must stay well under 20 minutes.
# PYTHONDONTWRITEBYTECODE emptied: where the environment sets it (these machines do),
# every process compiled moehome's modules from source and pytest rewrote every test
# module again, each run (the fast tier: 66 s, 55-59 s with the caches written).
# Two workers, a test file (the NAT lab's files: one group) at a time each, the files
# with slow tests first (tests/parallel.py): in one process the suite kept 1.08 of two
# cores busy, 24:14 on a 2-core machine; on two workers 17:37, both cores ~85% busy.
# One torch thread per process, as the fast tier: two workers' torch pools on two
# cores (OpenMP spins while it waits) made one unit file 7 times slower (14 s -> 96 s).
test: lint
	PYTHONDONTWRITEBYTECODE= OMP_NUM_THREADS=1 QT_QPA_PLATFORM=offscreen $(BIN)/python -m pytest -n 2 --dist loadgroup --no-loadscope-reorder --durations=25

# The fast tier alone (pure functions, decoders, models; no sockets, no processes): < 1 min,
# on two workers (one process, about 65 s on 2 cores), each with one torch thread (two
# workers of two threads each on two cores: 118 s against 95 s on a slow machine). The
# whole suite stays in one process: its bundle build takes the idle core
# (tests/bundle/building.py).
test-fast:
	PYTHONDONTWRITEBYTECODE= OMP_NUM_THREADS=1 QT_QPA_PLATFORM=offscreen $(BIN)/python -m pytest tests/unit -n 2

bundle:
	$(BIN)/python installer/build.py

bench:
	$(BIN)/python benchmarks/net_rpc.py
	$(BIN)/python benchmarks/expert_rpc.py
	$(BIN)/python benchmarks/aggregator.py

# A separate environment with hivemind 1.1.12 for benchmarks/expert_rpc.py's comparison
# (hivemind and py-libp2p cannot be imported into one process: both define crypto.pb).
compare-env:
	$(PYTHON) -m venv .venv-compare
	.venv-compare/bin/python -m pip install -c constraints.txt -e . hivemind==1.1.12

clean:
	rm -rf $(VENV) build dist *.egg-info .mypy_cache .ruff_cache .pytest_cache
