# The two commands of the README: `make demo` and `make test`. Both set up first (idempotent).
SHELL := /bin/bash
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.setup-stamp

.PHONY: setup demo test test-fast test-contract test-runs lint synth gpu-wheels clean

setup: $(STAMP)

$(STAMP): pyproject.toml package.json package-lock.json scripts/setup_env.sh
	bash scripts/setup_env.sh
	touch $(STAMP)

demo: setup
	$(BIN)/nvrx-eks demo

test: setup
	$(BIN)/python -m pytest -n 2 --dist loadgroup

# The three tiers of tests/ (README, "Development"): unit, then contract, then runs.
test-fast: setup
	$(BIN)/python -m pytest -n 2 --dist loadgroup tests/unit

test-contract: setup
	$(BIN)/python -m pytest -n 2 --dist loadgroup tests/contract

test-runs: setup
	$(BIN)/python -m pytest -n 2 --dist loadgroup tests/runs

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# The CDK CLI's own synth, offline; a missing context value fails instead of using dummies.
synth: setup
	$(BIN)/python -m nvrx_eks.deploy.cdk_cli synth --no-lookups --no-notices --quiet $(if $(PROFILE),-c profile=$(PROFILE))

# The wheels a bare GPU machine lacks for the GPU smoke (scripts/gpu-smoke-device.sh), for
# CPython 3.12 on manylinux x86_64, at the project's pins; lists them and fails over 64 MiB.
gpu-wheels: setup
	$(BIN)/python scripts/gpu_wheels.py download .gpu-wheels

clean:
	rm -rf cdk.out .pytest_cache
