{{/*
Name of the chart (no nameOverride: the chart name is fixed).
*/}}
{{- define "amd-gpu.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
Full name: the release name, plus the chart name unless the release name
already contains it ("amd-gpu" for `helm install amd-gpu`). Used for every
object, including the cluster-scoped ones (ClusterRole, binding, policy).
*/}}
{{- define "amd-gpu.fullname" -}}
{{- if contains (include "amd-gpu.name" .) .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (include "amd-gpu.name" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "amd-gpu.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels of every object. */}}
{{- define "amd-gpu.labels" -}}
helm.sh/chart: {{ include "amd-gpu.chart" . }}
{{ include "amd-gpu.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: device-plugin
{{- end -}}

{{/* Labels the DaemonSet selects its pods by (immutable once installed). */}}
{{- define "amd-gpu.selectorLabels" -}}
app.kubernetes.io/name: {{ include "amd-gpu.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* The plugin's ServiceAccount (one per release). */}}
{{- define "amd-gpu.serviceAccountName" -}}
{{- include "amd-gpu.fullname" . -}}
{{- end -}}

{{/* The user name the API server gives the ServiceAccount's tokens. */}}
{{- define "amd-gpu.serviceAccountUser" -}}
{{- printf "system:serviceaccount:%s:%s" .Release.Namespace (include "amd-gpu.serviceAccountName" .) -}}
{{- end -}}

{{- define "amd-gpu.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* Host paths derived from kubeletRootDir. */}}
{{- define "amd-gpu.devicePluginDir" -}}
{{- printf "%s/device-plugins" .Values.kubeletRootDir -}}
{{- end -}}

{{- define "amd-gpu.podResourcesDir" -}}
{{- printf "%s/pod-resources" .Values.kubeletRootDir -}}
{{- end -}}

{{/* The node installer's image (nodeInstaller.image; tag defaults to appVersion). */}}
{{- define "amd-gpu.nodeInstallerImage" -}}
{{- printf "%s:%s" .Values.nodeInstaller.image.repository (default .Chart.AppVersion .Values.nodeInstaller.image.tag) -}}
{{- end -}}

{{/*
Labels of the node installer. Its own app.kubernetes.io/name, so that neither
DaemonSet's selector (nor the NetworkPolicy's) matches the other's pods.
*/}}
{{- define "amd-gpu.nodeInstallerSelectorLabels" -}}
app.kubernetes.io/name: {{ include "amd-gpu.name" . }}-node-installer
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "amd-gpu.nodeInstallerLabels" -}}
helm.sh/chart: {{ include "amd-gpu.chart" . }}
{{ include "amd-gpu.nodeInstallerSelectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: node-installer
{{- end -}}
