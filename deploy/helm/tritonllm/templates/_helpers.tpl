{{- define "tritonllm.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "tritonllm.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "tritonllm.labels" -}}
{{ include "tritonllm.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* The LLMs served beside model.path, and how many may be loaded at once: the same flags for serve and shim. */}}
{{- define "tritonllm.moreModels" -}}
{{- range .Values.model.more }}
- --model-dir=/models/{{ . }}
{{- end }}
{{- with .Values.model.modelsMax }}
- --models-max={{ . }}
{{- end }}
{{- end -}}
