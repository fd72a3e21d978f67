# `make test` and `make run` set up .venv themselves; only python3 and make are needed.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# With an NVIDIA GPU, CuPy for the driver's CUDA major version too; nothing GPU-related without.
CUDA_MAJOR := $(filter 12 13,$(shell nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9]*\).*/\1/p'))
comma := ,
CUDA_EXTRA := $(if $(CUDA_MAJOR),$(comma)cuda$(CUDA_MAJOR))
# `make run` installs what the demo needs; `make test` the test extra too (NVRTC, mpich, ...).
RUN_EXTRAS := progress$(CUDA_EXTRA)
EXTRAS := test$(CUDA_EXTRA)

.PHONY: test run bench fuzz fuzz-native mutate lint clean gpu-check

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(BIN)/.installed-run: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[$(RUN_EXTRAS)]'
	touch $@

$(BIN)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[$(EXTRAS)]'
	touch $@

# numba caches each function with the helpers it inlines, but checks only its own file: after a
# change to the core's shared helpers (the header's layout, the lock), a cached caller in another
# file would run the old code (a run spun for ever on the lock word at its old offset). So every
# target that runs numba code first drops the tree's caches when those sources have changed: the
# files jit.source_fingerprint covers for generated orchestrations, whose hand-written twins in
# tests/ inline the jit API too, and native_call.py, which the native workers' loop and the CUDA
# emulator's CPU-code entry inline, and the instance keys and driver calls that the native
# workers' and the driver stream executor's loops inline, and the BLAS gemm the tile kernels
# inline (the routine's name is in their code).
INLINED := $(wildcard pto_gpu/core/*.py pto_gpu/jit/*.py) pto_gpu/overlap.py pto_gpu/layout.py \
	pto_gpu/native_call.py pto_gpu/executors/instance_keys.py pto_gpu/backends/launches.py \
	kernels/blas.py
$(BIN)/.caches-checked: $(INLINED) | $(BIN)/python
	find pto_gpu kernels orchestration tests bench \( -name '*.nbi' -o -name '*.nbc' \) -delete
	touch $@

$(BIN)/.installed-bench: $(BIN)/.installed
	$(BIN)/python -m pip install -q -e '.[bench]'
	touch $@

# Two test processes (pytest-xdist), each taking whole files: most of the suite's time is numba
# compiling code, once per process, which the two cores then do side by side (warm, on this
# 2-core machine: 6:49 in one process, 5:01 in two). `.venv/bin/python -m pytest` runs one.
TEST_WORKERS ?= 2

test: $(BIN)/.installed $(BIN)/.caches-checked
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile

run: $(BIN)/.installed-run $(BIN)/.caches-checked
	$(BIN)/python -m pto_gpu.orchestration.demo

bench: $(BIN)/.installed-bench $(BIN)/.caches-checked
	$(BIN)/python -m pytest bench --benchmark-only --benchmark-columns=min,median,mean,ops,rounds

# Differential fuzzing against the serial executor: FUZZ_EXAMPLES programs (Ctrl-C stops it),
# from a fresh random seed each time (hypothesis prints how to reproduce a failure); fuzz-native:
# a tenth as many programs of generated kernels, on native workers.
FUZZ_EXAMPLES ?= 1000000
fuzz: $(BIN)/.installed $(BIN)/.caches-checked
	FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) FUZZ_SEED=random $(BIN)/python -m pytest tests/test_fuzz.py -k "not native" -x -q

fuzz-native: $(BIN)/.installed $(BIN)/.caches-checked
	FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) FUZZ_SEED=random $(BIN)/python -m pytest tests/test_fuzz.py -k native -x -q

# The curated mutants of tests/mutants.py, each in a copy of the repository against the tests
# that should kill it (docs/MUTANTS.md); fails if one survives.
mutate: $(BIN)/.installed
	$(BIN)/python tests/mutants.py

# On a lent GPU with no network (the device image has the dependencies): the gpu tests and the
# GPU benchmarks in one command, figures into $$GPU_CHECK_OUT or $$OUT (bench/gpu_check.py).
# Without a GPU it says so and fails at once.
gpu-check:
	$(PYTHON) bench/gpu_check.py

lint: $(BIN)/.installed
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) .pytest_cache .benchmarks
