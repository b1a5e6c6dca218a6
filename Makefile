# Everyday commands. `make help` lists them; each is one line you can also type yourself.
PYTHON ?= python
CONFIG ?= configs/default.yaml

.PHONY: help install install-locked train test test-fast lint format tensorboard benchmark

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-15s %s\n", $$1, $$2}'

install:  ## editable install with the test tools and every feature's extra
	$(PYTHON) -m pip install -e ".[dev]"

install-locked:  ## the exact versions the tests passed with (requirements.lock), then the project
	$(PYTHON) -m pip install -r requirements.lock
	$(PYTHON) -m pip install --no-deps -e .

train:  ## train with $(CONFIG)
	$(PYTHON) -m project fit --config $(CONFIG)

test:  ## the whole test suite (needs PATH_DATASETS for the real-MNIST test)
	$(PYTHON) -m pytest

test-fast:  ## the offline tests only
	$(PYTHON) -m pytest -m "not slow"

lint:  ## ruff lint and format check, and the type check
	ruff check .
	ruff format --check .
	mypy

format:  ## fix what ruff can
	ruff check --fix .
	ruff format .

tensorboard:  ## TensorBoard on the runs in logs/
	tensorboard --logdir logs

# >>> notebooks
.PHONY: notebooks
notebooks:  ## execute both notebooks (needs PATH_DATASETS)
	$(PYTHON) -m pytest --nbmake -n 0 notebooks/  # in order: 02 inspects the checkpoint 01 trained
# <<< notebooks

benchmark:  ## the benchmark against the plain PyTorch loop (needs PATH_DATASETS); writes BENCHMARKS.md
	$(PYTHON) benchmarks/run.py
