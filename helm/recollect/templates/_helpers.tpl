{{/* Chart name, truncated to the 63 characters Kubernetes allows in names. */}}
{{- define "recollect.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Release-qualified name; components append "-<component>", so keep room for it. */}}
{{- define "recollect.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 48 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 48 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 48 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "recollect.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels every object carries. */}}
{{- define "recollect.labels" -}}
helm.sh/chart: {{ include "recollect.chart" . }}
{{ include "recollect.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: recollect
{{- end }}

{{- define "recollect.selectorLabels" -}}
app.kubernetes.io/name: {{ include "recollect.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
Per-component labels. Call with (dict "root" $ "component" "gateway").
app.kubernetes.io/component is also the Prometheus job label (ServiceMonitor jobLabel), the
same job names deploy/prometheus/prometheus.yml uses, so dashboard and alerts match both.
*/}}
{{- define "recollect.componentLabels" -}}
{{ include "recollect.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "recollect.componentSelectorLabels" -}}
{{ include "recollect.selectorLabels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* The services of the pipeline, in data-flow order; the store is optional. */}}
{{- define "recollect.components" -}}
gateway extractor embedder graph-writer consolidator query
{{- end }}

{{- define "recollect.enabledComponents" -}}
{{- $out := list }}
{{- range (include "recollect.components" . | splitList " ") }}
{{- if (index $.Values .).enabled }}{{ $out = append $out . }}{{ end }}
{{- end }}
{{- if .Values.store.enabled }}{{ $out = append $out "store" }}{{ end }}
{{- join " " $out }}
{{- end }}

{{- define "recollect.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{- define "recollect.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "recollect.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "recollect.secretName" -}}
{{- default (printf "%s-secrets" (include "recollect.fullname" .)) .Values.secrets.existingSecret }}
{{- end }}

{{/* The config file, refusing secrets in it: they belong in the Secret. */}}
{{- define "recollect.configToml" -}}
{{- $server := default dict .Values.config.server }}
{{- if hasKey $server "api_keys" }}
{{- fail "config.server.api_keys is a secret: use secrets.apiKeys or secrets.existingSecret" }}
{{- end }}
{{- if hasKey $server "admin_key" }}
{{- fail "config.server.admin_key: the operator backup is the single binary's; a distributed deployment is backed up with Kafka's, Neo4j's and Qdrant's own tools" }}
{{- end }}
{{- $graph := default dict .Values.config.graph }}
{{- if hasKey $graph "password" }}
{{- fail "config.graph.password is a secret: use secrets.neo4jPassword or secrets.existingSecret" }}
{{- end }}
{{- $llm := default dict .Values.config.llm }}
{{- if hasKey $llm "api_key" }}
{{- fail "config.llm.api_key is a secret: use secrets.llmApiKey or secrets.existingSecret" }}
{{- end }}
{{- $bus := default dict .Values.config.bus }}
{{- if hasKey $bus "sasl_password" }}
{{- fail "config.bus.sasl_password is a secret: use secrets.kafkaSaslPassword or secrets.existingSecret" }}
{{- end }}
{{- $vectors := default dict .Values.config.vectors }}
{{- if hasKey $vectors "api_key" }}
{{- fail "config.vectors.api_key is a secret: use secrets.qdrantApiKey or secrets.existingSecret" }}
{{- end }}
{{- if and .Values.caCertificates.secret .Values.caCertificates.configMap }}
{{- fail "caCertificates: set secret or configMap, not both" }}
{{- end }}
{{- if hasKey $server "listen" }}
{{- fail "config.server.listen is set by the chart from .Values.port" }}
{{- end }}
{{- range $section, $entries := .Values.config }}
{{- if not (kindIs "map" $entries) }}
{{- fail (printf "config.%s must be a table of keys (see shared/config/config/default.toml)" $section) }}
{{- end }}
[{{ $section }}]
{{- range $key, $value := $entries }}
{{ $key }} = {{ include "recollect.tomlValue" $value }}
{{- end }}
{{ end }}
{{- end }}

{{/*
One TOML value. Helm reads every number in values as a float, so whole numbers are written
as integers: the services' config wants integers there (bus.partitions = 8, not 8.0).
*/}}
{{- define "recollect.tomlValue" -}}
{{- if kindIs "string" . }}{{ toJson . }}
{{- else if kindIs "bool" . }}{{ . }}
{{- else if or (kindIs "float64" .) (kindIs "int64" .) (kindIs "int" .) }}
{{- if eq (float64 .) (floor .) }}{{ int64 . }}{{ else }}{{ . }}{{ end }}
{{- else if kindIs "slice" . }}[{{ range $i, $v := . }}{{ if $i }}, {{ end }}{{ include "recollect.tomlValue" $v }}{{ end }}]
{{- else if kindIs "map" . }}{{ $m := . }}{ {{- range $i, $k := keys $m | sortAlpha }}{{ if $i }},{{ end }} {{ $k }} = {{ include "recollect.tomlValue" (index $m $k) }}{{ end }} }
{{- else }}{{ fail (printf "config value %v: only strings, numbers, booleans, lists and tables of them belong in config" .) }}
{{- end }}
{{- end }}
