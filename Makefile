# `make test` and `make run` set up .venv themselves; only python3 and make are needed.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: test run bench fuzz lint clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $@

$(BIN)/.installed-bench: $(BIN)/.installed
	$(BIN)/python -m pip install -q -e '.[bench]'
	touch $@

test: $(BIN)/.installed
	$(BIN)/ruff check .
	$(BIN)/python -m pytest

run: $(BIN)/.installed
	$(BIN)/python -m orchestration.demo

bench: $(BIN)/.installed-bench
	$(BIN)/python -m pytest bench --benchmark-only --benchmark-columns=min,median,mean,ops,rounds

# Differential fuzzing against the serial executor: FUZZ_EXAMPLES programs (Ctrl-C stops it),
# from a fresh random seed each time (hypothesis prints how to reproduce a failure).
FUZZ_EXAMPLES ?= 1000000
fuzz: $(BIN)/.installed
	FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) FUZZ_SEED=random $(BIN)/python -m pytest tests/test_fuzz.py -x -q

lint: $(BIN)/.installed
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) .pytest_cache .benchmarks
