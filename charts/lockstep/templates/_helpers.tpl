{{/* Chart name, truncated to a DNS label. */}}
{{- define "lockstep.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Full name: <release>-<chart>, or the release name alone when it already contains the chart name.
Kept to 40 characters so suffixes (-agent-pod, -results, -test-metrics) stay valid names.
*/}}
{{- define "lockstep.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" }}
{{- end }}
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

{{- define "lockstep.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "lockstep.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "lockstep.tokenSecretName" -}}
{{- default (include "lockstep.fullname" .) .Values.auth.existingSecret }}
{{- end }}

{{- define "lockstep.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{- define "lockstep.agentImage" -}}
{{- $repo := default .Values.image.repository .Values.agents.image.repository }}
{{- $tag := default (default .Chart.AppVersion .Values.image.tag) .Values.agents.image.tag }}
{{- printf "%s:%s" $repo $tag }}
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
- name: LOCKSTEP_PROFILE_DB
  value: /tmp/lockstep-profile.db
- name: PYTHONDONTWRITEBYTECODE
  value: "1"
{{- end }}
