# Every target does its own setup and is idempotent: a second run reuses the
# virtualenv, the Go caches under .cache/ and the binaries under bin/.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
SETUP_STAMP := $(VENV)/.setup-done

.PHONY: help setup debian-packages testenv up down demo test unit crd manifests lock bench-sim bench-tuning bench-calibration bench-scale

GO ?= $(shell command -v go 2>/dev/null || echo /usr/local/go/bin/go)
# Root installs directly; anyone else needs sudo for the Debian package.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

# The versions stamped into the binaries are read from the go.mod files, so
# that bumping a version is a one-line change there.
K8S_VERSION := $(shell awk '$$1 == "k8s.io/kubernetes" {print $$2}' hack/testenv/go.mod)
K8S_SEMVER := $(subst ., ,$(patsubst v%,%,$(K8S_VERSION)))
K8S_VERSION_PKG := k8s.io/component-base/version
TESTENV_LDFLAGS := -X $(K8S_VERSION_PKG).gitVersion=$(K8S_VERSION) \
	-X $(K8S_VERSION_PKG).gitMajor=$(word 1,$(K8S_SEMVER)) \
	-X $(K8S_VERSION_PKG).gitMinor=$(word 2,$(K8S_SEMVER)) \
	-X $(K8S_VERSION_PKG).gitTreeState=clean
HELM_VERSION := $(shell awk '$$1 == "helm.sh/helm/v3" {print $$2}' hack/helm/go.mod)
# As helm's own Makefile does: the Kubernetes version helm assumes when it
# has no cluster to ask is the one of the client-go it is built with.
HELM_K8S_MINOR := $(word 2,$(subst ., ,$(shell awk '$$1 == "k8s.io/client-go" {print $$2}' hack/helm/go.mod)))
HELM_LDFLAGS := -X helm.sh/helm/v3/internal/version.version=$(HELM_VERSION) \
	-X helm.sh/helm/v3/internal/version.gitTreeState=clean \
	-X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1 \
	-X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=$(HELM_K8S_MINOR) \
	-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 \
	-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$(HELM_K8S_MINOR)

help: ## List the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-14s %s\n", $$1, $$2}'

setup: $(SETUP_STAMP) debian-packages ## Create .venv, install the project with its test extras, and Debian's packages

# Debian's packages: prometheus, of which only the binary is used (the tests
# and `make up` start their own server, so whether the package's service runs
# does not matter), and the inits tini, dumb-init and catatonit, which the
# tests run as PID 1 of a PID namespace to see what a SIGTERM does to the vLLM
# behind them (tests/unit/test_cmdline_sigterm.py). Each installs
# /usr/bin/<its name>; one apt-get for whichever are missing.
DEBIAN_PACKAGES := prometheus tini dumb-init catatonit
debian-packages:
	@missing=""; for p in $(DEBIAN_PACKAGES); do test -x /usr/bin/$$p || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
		echo "==> installing Debian's packages:" $$missing; \
		$(SUDO) apt-get update -q && \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing; \
	fi

$(SETUP_STAMP): pyproject.toml
	@test -x $(PY) || { echo "==> creating $(VENV)"; $(PYTHON) -m venv $(VENV); }
	@echo "==> installing vllm-autotuner[test] into $(VENV)"
	@$(PY) -m pip install -q --upgrade pip
	@$(PY) -m pip install -q -e '.[test]'
	@touch $@

# prometheus-operator's CRDs of the kinds the chart renders, at the version hack/monitoring-crds/go.mod pins: the
# tests validate the chart's ServiceMonitor and PrometheusRule against them on the testenv's apiserver.
MONITORING_CRDS := $(addprefix bin/crds/monitoring.coreos.com_,servicemonitors.yaml prometheusrules.yaml)

testenv: bin/testenv bin/kubectl bin/helm $(MONITORING_CRDS) ## Build the local control plane (+ kubectl) and helm, and copy prometheus-operator's CRDs, into bin/

$(MONITORING_CRDS) &: hack/go-env.sh hack/go-module-files.sh hack/monitoring-crds/go.mod hack/monitoring-crds/go.sum
	@GO=$(GO) hack/go-module-files.sh hack/monitoring-crds github.com/prometheus-operator/prometheus-operator \
		example/prometheus-operator-crd $(MONITORING_CRDS)

bin/testenv: hack/go-env.sh hack/go-build.sh hack/testenv/go.mod hack/testenv/go.sum $(wildcard hack/testenv/*.go)
	@GO=$(GO) hack/go-build.sh hack/testenv . $@ '$(TESTENV_LDFLAGS)'

# bin/testenv is also kubectl when called by that name.
bin/kubectl: bin/testenv
	@ln -sfn testenv $@

bin/helm: hack/go-env.sh hack/go-build.sh hack/helm/go.mod hack/helm/go.sum
	@GO=$(GO) hack/go-build.sh hack/helm helm.sh/helm/v3/cmd/helm $@ '$(HELM_LDFLAGS)'

up: setup testenv ## Start the control plane, Prometheus and the simulated GPU fleet in the background; settings in .local/env
	@$(VENV)/bin/vllm-autotuner sim up

down: setup ## Stop everything `make up` started
	@$(VENV)/bin/vllm-autotuner sim down

# A simulated day squeezed into DURATION of wall-clock time (3m at the least).
DURATION ?= 10m

demo: setup bin/testenv bin/kubectl ## One compressed day, tuned vs static, on the local cluster; report in demo-report/ (DURATION=3m: shorter)
	@$(VENV)/bin/vllm-autotuner sim demo --duration $(DURATION)

CRD := vllmtunings.autotuner.vllm-tuning.io.yaml

crd: setup ## Regenerate crds/ (and its copies in the chart and deploy/) from the pydantic models
	@$(VENV)/bin/vllm-autotuner crd | tee charts/vllm-autotuner/crds/$(CRD) deploy/crds/$(CRD) > crds/$(CRD)

manifests: bin/helm ## Regenerate deploy/vllm-autotuner.yaml from the chart's default values
	@hack/render-manifests.sh

# The image's runtime dependencies (no extras), pinned with the hashes of every file of
# each release, for any platform and Python >= 3.11: the image runs 3.11 and
# tests/integration installs the same set on this machine's python3. BUILD_LOCK pins the
# same way what builds the operator's own wheel, pyproject.toml's [build-system] requires.
# uv itself is pinned, in its own virtualenv, so that the same resolver rewrites the locks.
# A re-run keeps the pins pyproject.toml still allows; UPGRADE=1 moves every one to the
# newest allowed.
LOCK := hack/operator-requirements.txt
BUILD_LOCK := hack/build-requirements.txt
UV_VERSION := 0.13.9
UV_VENV := .cache/uv-$(UV_VERSION)
UV_COMPILE = $(UV_VENV)/bin/uv pip compile --quiet --universal --python-version 3.11 --generate-hashes \
	--custom-compile-command 'make lock' $(if $(UPGRADE),--upgrade)

lock: $(UV_VENV)/bin/uv ## Re-pin the image's dependencies and build backend in hack/*-requirements.txt from pyproject.toml (UPGRADE=1: newest allowed)
	@$(UV_COMPILE) --output-file $(LOCK) pyproject.toml
	@set -o pipefail; $(UV_VENV)/bin/python -c 'import tomllib; print(*tomllib.load(open("pyproject.toml", "rb"))["build-system"]["requires"], sep="\n")' \
		| $(UV_COMPILE) --output-file $(BUILD_LOCK) -

$(UV_VENV)/bin/uv:
	@echo "==> installing uv $(UV_VERSION) into $(UV_VENV)"
	@$(PYTHON) -m venv $(UV_VENV)
	@$(UV_VENV)/bin/pip install -q uv==$(UV_VERSION)

unit: setup ## Unit tests only (no cluster, no Prometheus)
	@$(PY) -m pytest tests/unit

test: setup testenv ## Everything: unit, integration and e2e tests against real servers
	@$(PY) -m pytest

bench-sim: setup ## Real-time factor of the engine simulator per profile (prints figures)
	@$(PY) bench/sim_speed.py

bench-tuning: $(SETUP_STAMP) ## Tuning quality of the decision core on simulated fleets (QUICK=1: a reduced run under 3 minutes)
	@nice -n 10 $(PY) -m bench.tuning $(if $(QUICK),--quick)

bench-calibration: $(SETUP_STAMP) ## The decision core's predictions (utilisation, SLO attainment) against the simulator: bench/results/calibration.md
	@$(PY) -m bench.tuning.calibration

bench-scale: setup testenv ## Operator at 100 and 1000 VllmTunings, batched (also with rollouts capped) vs naive queries: bench/results/scale.md (QUICK=1: a toy run)
	@nice $(PY) -m bench.scale $(if $(QUICK),--quick --out .local/bench-scale/quick)
