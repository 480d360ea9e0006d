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

{{/* "true" when the chart runs the snapshotter and makes its VolumeSnapshotClass. */}}
{{- define "hawser.snapshots" -}}
{{- $on := .Values.snapshots.enabled -}}
{{- if eq (toString $on) "auto" -}}
{{- .Capabilities.APIVersions.Has "snapshot.storage.k8s.io/v1" -}}
{{- else -}}
{{- $on -}}
{{- end -}}
{{- end -}}

{{/*
Whether the sidecars pass VolumeAttributesClass parameters (the volume limits, docs/qos.md):
`volumeAttributesClasses.enabled`, with "auto" meaning the cluster serves the API.
*/}}
{{- define "hawser.attributesClasses" -}}
{{- $on := .Values.volumeAttributesClasses.enabled -}}
{{- if eq (toString $on) "auto" -}}
{{- or (.Capabilities.APIVersions.Has "storage.k8s.io/v1/VolumeAttributesClass") (.Capabilities.APIVersions.Has "storage.k8s.io/v1beta1/VolumeAttributesClass") -}}
{{- else -}}
{{- $on -}}
{{- end -}}
{{- end -}}
