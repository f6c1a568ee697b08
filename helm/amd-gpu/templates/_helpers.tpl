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

{{/*
The plugin's ServiceAccount: dp.serviceAccount.name (the Go chart's key), else
the full name. With dp.serviceAccount.create false the chart creates none and
binds its RBAC to that existing account, which must then be named.
*/}}
{{- define "amd-gpu.serviceAccountName" -}}
{{- $sa := .Values.dp.serviceAccount | default dict -}}
{{- if and (hasKey $sa "create") (not $sa.create) (not $sa.name) -}}
{{- fail "dp.serviceAccount.create is false: name the existing ServiceAccount in dp.serviceAccount.name (the plugin needs the chart's RBAC bound to it)" -}}
{{- end -}}
{{- default (include "amd-gpu.fullname" .) $sa.name -}}
{{- end -}}

{{/*
The host directory of the memory hook: <dp.hostHookPath>/vgpu, the Go chart's
place (its hostHookPath is a prefix).
*/}}
{{- define "amd-gpu.hookDir" -}}
{{- printf "%s/vgpu" (trimSuffix "/" .Values.dp.hostHookPath) -}}
{{- end -}}

{{/*
The hook installer's image: dp.image, HAMi's Go plugin image, which bundles
the hook. An empty tag is the Go chart's own appVersion there; here 0.0.1,
the Go plugin's release whose image this chart's default names.
*/}}
{{- define "amd-gpu.hookImage" -}}
{{- printf "%s:%s" .Values.dp.image.repository (.Values.dp.image.tag | default "0.0.1" | toString) -}}
{{- end -}}

{{/*
The DaemonSets' nodeSelector: nodeSelector, and node_selector when
node_selector_enabled (HAMi's Go chart's keys).
*/}}
{{- define "amd-gpu.nodeSelector" -}}
{{- $selector := deepCopy (.Values.nodeSelector | default dict) -}}
{{- if .Values.node_selector_enabled -}}
{{- $selector = merge (deepCopy (.Values.node_selector | default dict)) $selector -}}
{{- end -}}
{{- with $selector -}}
{{- toYaml . -}}
{{- end -}}
{{- end -}}

{{/*
AMDGPU_DP_LOG: dp.logLevel, else from dp.logVerbosity (the Go plugin's glog
-v): up to 2 info, 3-4 the plugin's debug lines, 5 and more its trace lines.
*/}}
{{- define "amd-gpu.logFilter" -}}
{{- if .Values.dp.logLevel -}}
{{- .Values.dp.logLevel -}}
{{- else -}}
{{- $v := int (.Values.dp.logVerbosity | default 2) -}}
{{- if ge $v 5 -}}info,plugin=trace{{- else if ge $v 3 -}}info,plugin=debug{{- else -}}info{{- end -}}
{{- end -}}
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

{{/*
The plugin's /metrics address (AMDGPU_DP_METRICS_ADDRESS): 0.0.0.0:<dp.metrics.port>
when that is set, else monitor.metricsBindAddress, the Go chart's key, whose
":<port>" form means every address of the pod's network namespace.
*/}}
{{- define "amd-gpu.metricsAddress" -}}
{{- if .Values.dp.metrics.port -}}
{{- printf "0.0.0.0:%d" (int .Values.dp.metrics.port) -}}
{{- else if hasPrefix ":" .Values.monitor.metricsBindAddress -}}
{{- printf "0.0.0.0%s" .Values.monitor.metricsBindAddress -}}
{{- else -}}
{{- .Values.monitor.metricsBindAddress -}}
{{- end -}}
{{- end -}}

{{/* The port of amd-gpu.metricsAddress. */}}
{{- define "amd-gpu.metricsPort" -}}
{{- regexReplaceAll "^.*:" (include "amd-gpu.metricsAddress" .) "" | int -}}
{{- end -}}
