{{/* Chart name, truncated to a DNS label. */}}
{{- define "lockstep.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Full name: <release>-<chart>, or the release name alone when it already contains the chart name.
Kept to 40 characters so suffixes (-agent-pod, -results, -test-metrics) stay valid names; a longer
name keeps its first 31 characters and a hash of the whole, so two long names stay different.
*/}}
{{- define "lockstep.fullname" -}}
{{- $full := "" }}
{{- if .Values.fullnameOverride }}
{{- $full = .Values.fullnameOverride }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- $full = .Release.Name }}
{{- else }}
{{- $full = printf "%s-%s" .Release.Name $name }}
{{- end }}
{{- end }}
{{- if gt (len $full) 40 }}
{{- printf "%s-%s" ($full | trunc 31 | trimSuffix "-") ($full | sha256sum | trunc 8) }}
{{- else }}
{{- $full }}
{{- end }}
{{- end }}

{{- define "lockstep.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels that never change over a release's life: safe in selectors. */}}
{{- define "lockstep.selectorLabels" -}}
app.kubernetes.io/name: {{ include "lockstep.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Every label of the chart's resources. */}}
{{- define "lockstep.labels" -}}
helm.sh/chart: {{ include "lockstep.chart" . }}
{{ include "lockstep.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* The labels the Kubernetes launcher gives this release's agent pods (controller/launchers/kubernetes.py). */}}
{{- define "lockstep.agentSelectorLabels" -}}
app.kubernetes.io/name: lockstep
app.kubernetes.io/component: agent
app.kubernetes.io/instance: {{ .Release.Name | quote }}
app.kubernetes.io/managed-by: lockstep
{{- end }}

{{- define "lockstep.tlsSecretName" -}}
{{- default (printf "%s-tls" (include "lockstep.fullname" .)) .Values.tls.secretName }}
{{- end }}

{{/* The controller's ServiceAccount: controller.serviceAccountName, else serviceAccount.name, else the full name. */}}
{{- define "lockstep.serviceAccountName" -}}
{{- if .Values.controller.serviceAccountName }}
{{- .Values.controller.serviceAccountName }}
{{- else if .Values.serviceAccount.create }}
{{- default (include "lockstep.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "lockstep.tokenSecretName" -}}
{{- default (include "lockstep.fullname" .) .Values.auth.existingSecret }}
{{- end }}

{{/* repository@digest when a digest is set, else repository:tag. */}}
{{- define "lockstep.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* The agents' image: their own repository/tag/digest, each defaulting to the controller's. */}}
{{- define "lockstep.agentImage" -}}
{{- $a := .Values.agents.image }}
{{- $repo := default .Values.image.repository $a.repository }}
{{- $digest := $a.digest }}
{{- if and (not $digest) (not $a.repository) (not $a.tag) }}
{{- $digest = .Values.image.digest }}
{{- end }}
{{- if $digest }}
{{- printf "%s@%s" $repo $digest }}
{{- else }}
{{- printf "%s:%s" $repo (default (default .Chart.AppVersion .Values.image.tag) $a.tag) }}
{{- end }}
{{- end }}

{{/* The run id: experiment.runId, else the release name. */}}
{{- define "lockstep.runId" -}}
{{- default .Release.Name .Values.experiment.runId }}
{{- end }}

{{/* The run directory: <mountPath>/<sweep>/<release>, or <mountPath>/<release> outside a sweep. */}}
{{- define "lockstep.runDir" -}}
{{- if .Values.experiment.sweep }}
{{- printf "%s/%s/%s" (trimSuffix "/" .Values.results.mountPath) .Values.experiment.sweep .Release.Name }}
{{- else }}
{{- printf "%s/%s" (trimSuffix "/" .Values.results.mountPath) .Release.Name }}
{{- end }}
{{- end }}

{{/* "true" when the object's own `enabled` says so, or it is null and monitoring.enabled is true. */}}
{{- define "lockstep.monitoringOn" -}}
{{- $own := index .Values .key "enabled" }}
{{- if kindIs "invalid" $own }}{{ .Values.monitoring.enabled }}{{ else }}{{ $own }}{{ end }}
{{- end }}

{{/* DNS name the agents dial: the Service, fully qualified within the cluster domain. */}}
{{- define "lockstep.controllerAddress" -}}
{{- printf "%s.%s.svc:%d" (include "lockstep.fullname" .) .Release.Namespace (int .Values.controller.port) }}
{{- end }}

{{- define "lockstep.resultsClaim" -}}
{{- default (printf "%s-results" (include "lockstep.fullname" .)) .Values.results.persistence.existingClaim }}
{{- end }}

{{/* Environment for a read-only root filesystem: everything writable lives under /tmp. */}}
{{- define "lockstep.writableEnv" -}}
- name: HOME
  value: /tmp
- name: XDG_CACHE_HOME
  value: /tmp/.cache
- name: MPLCONFIGDIR
  value: /tmp/.cache/matplotlib
- name: LOCKSTEP_DATA_CACHE  # every pod starts afresh: a decoded-data cache would be written, never read
  value: "off"
- name: LOCKSTEP_PROFILE_DB
  value: /tmp/lockstep-profile.db
- name: PYTHONDONTWRITEBYTECODE
  value: "1"
{{- end }}

{{/*
Relabelings that give every series of the release the labels the dashboard filters on: `release`
(app.kubernetes.io/instance) and `run_id` (lockstep.io/run-id) from the scraped pod's labels; the
operator adds `namespace` itself. `job` becomes controller or agent, as for a local run.
*/}}
{{- define "lockstep.runRelabelings" -}}
- sourceLabels: [__meta_kubernetes_pod_label_app_kubernetes_io_instance]
  targetLabel: release
- sourceLabels: [__meta_kubernetes_pod_label_lockstep_io_run_id]
  targetLabel: run_id
- sourceLabels: [__meta_kubernetes_pod_label_app_kubernetes_io_component]
  targetLabel: job
{{- end }}
