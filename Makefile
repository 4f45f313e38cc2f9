# Every target does its own setup and is idempotent: a second run reuses the
# virtualenv, the Go caches under .cache/ and the binaries under bin/.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
SETUP_STAMP := $(VENV)/.setup-done

.PHONY: help setup test unit crd bench-sim bench-tuning

help: ## List the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-14s %s\n", $$1, $$2}'

setup: $(SETUP_STAMP) ## Create .venv and install the project with its test extras

$(SETUP_STAMP): pyproject.toml
	@test -x $(PY) || { echo "==> creating $(VENV)"; $(PYTHON) -m venv $(VENV); }
	@echo "==> installing vllm-autotuner[test] into $(VENV)"
	@$(PY) -m pip install -q --upgrade pip
	@$(PY) -m pip install -q -e '.[test]'
	@touch $@

crd: setup ## Regenerate crds/ from the pydantic models
	@$(VENV)/bin/vllm-autotuner crd > crds/vllmtunings.autotuner.vllm-tuning.io.yaml

unit: setup ## Unit tests only (no cluster, no Prometheus)
	@$(PY) -m pytest tests/unit

test: setup ## Everything: unit, integration and e2e tests against real servers
	@$(PY) -m pytest

bench-sim: setup ## Real-time factor of the engine simulator per profile (prints figures)
	@$(PY) bench/sim_speed.py

bench-tuning: setup ## Tuning quality of the decision core on simulated fleets (QUICK=1: a reduced run under 3 minutes)
	@nice -n 10 $(PY) -m bench.tuning $(if $(QUICK),--quick)
