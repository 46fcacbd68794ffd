{{/* Chart name, truncated to a DNS label. */}}
{{- define "lockstep-kuberay.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Full name: <release>-lockstep, or the release name alone when it already contains "lockstep".
Kept to 40 characters: KubeRay derives the cluster's, pods' and submitter Job's names from it.
*/}}
{{- define "lockstep-kuberay.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" }}
{{- else if contains "lockstep" .Release.Name }}
{{- .Release.Name | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-lockstep" .Release.Name | trunc 40 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "lockstep-kuberay.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels that never change over a release's life: safe in selectors. */}}
{{- define "lockstep-kuberay.selectorLabels" -}}
app.kubernetes.io/name: {{ include "lockstep-kuberay.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Every label of the chart's resources. */}}
{{- define "lockstep-kuberay.labels" -}}
helm.sh/chart: {{ include "lockstep-kuberay.chart" . }}
{{ include "lockstep-kuberay.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "lockstep-kuberay.tokenSecretName" -}}
{{- default (include "lockstep-kuberay.fullname" .) .Values.auth.existingSecret }}
{{- end }}

{{- define "lockstep-kuberay.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* Everything lockstep, torch, matplotlib and Ray write goes under /tmp (an emptyDir). */}}
{{- define "lockstep-kuberay.writableEnv" -}}
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

{{/* Scheduling and security settings shared by the head and worker pod specs: (dict "root" $ "group" .Values.head). */}}
{{- define "lockstep-kuberay.podSpec" -}}
{{- with .root.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .root.Values.podSecurityContext }}
securityContext:
  {{- toYaml . | nindent 2 }}
{{- end }}
enableServiceLinks: false
{{- with .group.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .group.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .group.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}
