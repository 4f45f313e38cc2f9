// Pins prometheus-operator, whose CRDs of the kinds the chart renders (ServiceMonitor, PrometheusRule) `make
// testenv` copies into bin/crds/ for the tests (hack/go-module-files.sh); go.sum pins its hash. No Go is built.
module vllm-autotuner/hack/monitoring-crds

go 1.26.0

require github.com/prometheus-operator/prometheus-operator v0.85.0
