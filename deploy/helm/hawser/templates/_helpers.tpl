{{/* Common names and labels. */}}
{{- define "hawser.name" -}}hawser{{- end -}}

{{- define "hawser.labels" -}}
app.kubernetes.io/name: hawser
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end -}}

{{- define "hawser.image" -}}{{ .Values.image.repository }}:{{ .Values.image.tag }}{{- end -}}

{{/* The controller's URL as agents and engines (host network) reach it. */}}
{{- define "hawser.controllerURL" -}}
https://{{ .Release.Name }}-controller.{{ .Release.Namespace }}.svc:{{ .Values.controller.port }}
{{- end -}}
