{{/*
Name of the chart, or nameOverride.
*/}}
{{- define "vllm-autotuner.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Full name of the release's resources: the release name when it already
contains the chart name, else "<release>-<chart>"; at most 63 characters.
It names the Service, so it may hold no dot (Helm allows one in a release
name); the cluster-scoped and dashboard names below rely on that too.
*/}}
{{- define "vllm-autotuner.fullname" -}}
{{- $fullname := "" }}
{{- if .Values.fullnameOverride }}
{{- $fullname = .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- $fullname = .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $fullname = printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- if contains "." $fullname }}
{{- fail (printf "release %s makes the full name %s, which names the Service and may hold no dot: set fullnameOverride" .Release.Name $fullname) }}
{{- end }}
{{- $fullname }}
{{- end }}

{{/*
Name of the release's cluster-scoped resources (ClusterRole, ClusterRoleBinding):
"<fullname>:<release namespace>", e.g. vllm-autotuner:ops. Neither part can hold a ':' (a
DNS label each), so two releases get one name only if they have the same full name in the
same namespace; RBAC names are path segments, with no length limit, so nothing is cut.
*/}}
{{- define "vllm-autotuner.clusterName" -}}
{{- printf "%s:%s" (include "vllm-autotuner.fullname" .) .Release.Namespace }}
{{- end }}

{{/*
Name of metricsAuth's ClusterRole that lets a scraper get /metrics: "<fullname>-metrics-reader:<release namespace>".
*/}}
{{- define "vllm-autotuner.metricsReaderName" -}}
{{- printf "%s-metrics-reader:%s" (include "vllm-autotuner.fullname" .) .Release.Namespace }}
{{- end }}

{{/*
Name of the scraper's ServiceAccount and of its token Secret (serviceMonitor.scraperServiceAccount.create).
*/}}
{{- define "vllm-autotuner.scraperName" -}}
{{- printf "%s-metrics-scraper" (include "vllm-autotuner.fullname" .) }}
{{- end }}

{{/*
Name of the dashboard ConfigMap: "<fullname>-dashboard" in the release namespace;
"<fullname>-dashboard.<release namespace>" in another (dashboard.namespace), which releases
of other namespaces may share. A namespace holds no dot and a full name none either, so the
part after the one dot names the release namespace: no two releases' names meet.
*/}}
{{- define "vllm-autotuner.dashboardName" -}}
{{- $name := printf "%s-dashboard" (include "vllm-autotuner.fullname" .) }}
{{- if eq (default .Release.Namespace .Values.dashboard.namespace) .Release.Namespace }}
{{- $name }}
{{- else }}
{{- printf "%s.%s" $name .Release.Namespace }}
{{- end }}
{{- end }}

{{/*
Chart name and version, for the helm.sh/chart label.
*/}}
{{- define "vllm-autotuner.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Labels of every resource.
*/}}
{{- define "vllm-autotuner.labels" -}}
helm.sh/chart: {{ include "vllm-autotuner.chart" . }}
{{ include "vllm-autotuner.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: operator
app.kubernetes.io/part-of: vllm-autotuner
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/*
Labels that select the operator's pods (never change them: a Deployment's selector is immutable).
*/}}
{{- define "vllm-autotuner.selectorLabels" -}}
app.kubernetes.io/name: {{ include "vllm-autotuner.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
Name of the ServiceAccount the operator runs as.
*/}}
{{- define "vllm-autotuner.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "vllm-autotuner.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
Name of the leader-election Lease.
*/}}
{{- define "vllm-autotuner.leaseName" -}}
{{- default (include "vllm-autotuner.fullname" .) .Values.leaderElection.leaseName }}
{{- end }}

{{/*
The operator image: pinned by image.digest when set (the tag is then ignored), else by the
tag, which defaults to the chart's appVersion.
*/}}
{{- define "vllm-autotuner.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/*
A RoleBinding or ClusterRoleBinding subject: the operator's ServiceAccount.
*/}}
{{- define "vllm-autotuner.subject" -}}
- kind: ServiceAccount
  name: {{ include "vllm-autotuner.serviceAccountName" . }}
  namespace: {{ .Release.Namespace }}
{{- end }}

{{/*
What the operator does in a namespace it watches; a ClusterRole's rules when it
watches all of them, a Role's in each namespace of watchNamespaces otherwise.
*/}}
{{- define "vllm-autotuner.watchRules" -}}
# VllmTunings: kopf lists and watches them into memory; one is read by name before a patch of its target (the
# watch's copy may be one deleted or edited while the watch was down).
- apiGroups: [autotuner.vllm-tuning.io]
  resources: [vllmtunings]
  verbs: [get, list, watch]
# Each evaluation's result: merge-patched into the status subresource only (never the spec).
- apiGroups: [autotuner.vllm-tuning.io]
  resources: [vllmtunings/status]
  verbs: [patch]
# Target Deployments: watched into memory; read again and patched (args, annotations) to roll out knobs.
- apiGroups: [apps]
  resources: [deployments]
  verbs: [get, list, watch, patch]
# ReplicaSets: watched to find a Deployment's current pods (their name prefix in the metrics); one is read
# to roll back to its exact pod template, so the pods still running it are not restarted.
- apiGroups: [apps]
  resources: [replicasets]
  verbs: [get, list, watch]
# Pods: listed to follow a rollout (Ready, crash loops) and to find the node a vLLM pod runs on.
- apiGroups: [""]
  resources: [pods]
  verbs: [list]
# Events on VllmTunings and target Deployments (RolloutStarted, RolledBack, ...).
- apiGroups: [""]
  resources: [events]
  verbs: [create]
{{- end }}

{{/*
Cluster-scoped grants, whatever the namespaces: a node's GPU labels, the VllmTuning CRD; the reviews of metricsAuth.
*/}}
{{- define "vllm-autotuner.nodeRules" -}}
# Nodes: the GPU product and memory labels of the node a vLLM pod runs on, to know vLLM's
# default knobs when the flags are absent. Cluster-scoped, so never in a Role.
- apiGroups: [""]
  resources: [nodes]
  verbs: [get]
# The VllmTuning CRD, read at start-up: an operator newer than it (Helm never upgrades crds/) says so and
# exits, as the apiserver would drop the fields it lacks from every status write.
- apiGroups: [apiextensions.k8s.io]
  resources: [customresourcedefinitions]
  resourceNames: [vllmtunings.autotuner.vllm-tuning.io]
  verbs: [get]
{{- if .Values.metricsAuth.enabled }}
# metricsAuth: whether a /metrics caller's bearer token is valid, and whether RBAC lets it get /metrics.
- apiGroups: [authentication.k8s.io]
  resources: [tokenreviews]
  verbs: [create]
- apiGroups: [authorization.k8s.io]
  resources: [subjectaccessreviews]
  verbs: [create]
{{- end }}
{{- end }}
