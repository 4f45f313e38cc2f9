# Every target does its own setup and is idempotent: a second run reuses the
# virtualenv, the Go caches under .cache/ and the binaries under bin/.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
SETUP_STAMP := $(VENV)/.setup-done

.PHONY: help setup test unit crd manifests bench-sim

help: ## List the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-14s %s\n", $$1, $$2}'

setup: $(SETUP_STAMP) ## Create .venv and install the project with its test extras

$(SETUP_STAMP): pyproject.toml
	@test -x $(PY) || { echo "==> creating $(VENV)"; $(PYTHON) -m venv $(VENV); }
	@echo "==> installing vllm-autotuner[test] into $(VENV)"
	@$(PY) -m pip install -q --upgrade pip
	@$(PY) -m pip install -q -e '.[test]'
	@touch $@

CRD := vllmtunings.autotuner.vllm-tuning.io.yaml

crd: setup ## Regenerate crds/ (and its copies in the chart and deploy/) from the pydantic models
	@$(VENV)/bin/vllm-autotuner crd | tee charts/vllm-autotuner/crds/$(CRD) deploy/crds/$(CRD) > crds/$(CRD)

manifests: bin/helm ## Regenerate deploy/vllm-autotuner.yaml from the chart's default values
	@hack/render-manifests.sh

unit: setup ## Unit tests only (no cluster, no Prometheus)
	@$(PY) -m pytest tests/unit

test: setup ## Everything: unit, integration and e2e tests against real servers
	@$(PY) -m pytest

bench-sim: setup ## Real-time factor of the engine simulator per profile (prints figures)
	@$(PY) bench/sim_speed.py
