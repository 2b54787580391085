{{/*
Expand the name of the chart.
*/}}
{{- define "archiver.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
Create a default fully qualified app name, truncated at 63 characters (DNS label limit). A release
name that already contains the chart name is used as is.
*/}}
{{- define "archiver.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
Chart name and version as used by the chart label.
*/}}
{{- define "archiver.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
Namespace of the release, overridable for umbrella charts.
*/}}
{{- define "archiver.namespace" -}}
{{- default .Release.Namespace .Values.namespaceOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
Selector labels: stable for the lifetime of the release (a StatefulSet selector is immutable).
*/}}
{{- define "archiver.selectorLabels" -}}
app.kubernetes.io/name: {{ include "archiver.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/*
Labels that select the archiver pods only. The StatefulSet's own selector (archiver.selectorLabels)
is immutable, so it stays as it was; the Service, PodDisruptionBudget, NetworkPolicy and spread add
the component, because the browser's pods share the name and instance labels.
*/}}
{{- define "archiver.podSelectorLabels" -}}
{{ include "archiver.selectorLabels" . }}
app.kubernetes.io/component: archiver
{{- end -}}

{{/*
Common labels: the selector labels, the chart's own, then commonLabels (which cannot override them).
*/}}
{{- define "archiver.labels" -}}
{{ include "archiver.podSelectorLabels" . }}
{{ include "archiver.baseLabels" . }}
{{- end -}}

{{/*
Labels of every object except the selector and component ones (the helm test pod must not match
the Service).
*/}}
{{- define "archiver.baseLabels" -}}
{{- $own := dict
  "helm.sh/chart" (include "archiver.chart" .)
  "app.kubernetes.io/version" (.Values.image.tag | default .Chart.AppVersion | trunc 63 | trimSuffix "-")
  "app.kubernetes.io/part-of" "session-archiver"
  "app.kubernetes.io/managed-by" .Release.Service
-}}
{{- range $k, $v := .Values.commonLabels }}
{{- if or (hasKey $own $k) (has $k (list "app.kubernetes.io/name" "app.kubernetes.io/instance" "app.kubernetes.io/component")) }}
{{- fail (printf "commonLabels.%s: the chart sets this label itself" $k) }}
{{- end }}
{{- end -}}
{{ toYaml (merge $own .Values.commonLabels) }}
{{- end -}}

{{/*
Name of the ServiceAccount to use.
*/}}
{{- define "archiver.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "archiver.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/*
Name of the Secret holding the API token, and the token's key in it (a chart-created Secret always
uses "api-token").
*/}}
{{- define "archiver.secretName" -}}
{{- default (printf "%s-token" (include "archiver.fullname" .)) .Values.existingSecret -}}
{{- end -}}

{{- define "archiver.secretKey" -}}
{{- if .Values.existingSecret -}}{{ .Values.existingSecretKey }}{{- else -}}api-token{{- end -}}
{{- end -}}

{{/*
Where the pods find the config file and the token file. The same paths go into the container
environment (ARCHIVER_CONFIG, ARCHIVER_API_TOKEN_FILE), so `kubectl exec <pod> -- archiver check`
(or status, ls, ...) runs with no flags.
*/}}
{{- define "archiver.configPath" -}}/etc/archiver/config.toml{{- end -}}
{{- define "archiver.tokenPath" -}}/etc/archiver/secret/api-token{{- end -}}
{{- define "archiver.webConfigPath" -}}/etc/archiver/web/web-config.yml{{- end -}}

{{/*
The archiver's environment (a list of EnvVar): the config and token file paths, then extraEnv.
*/}}
{{- define "archiver.env" -}}
- name: ARCHIVER_CONFIG
  value: {{ include "archiver.configPath" . }}
- name: ARCHIVER_API_TOKEN_FILE
  value: {{ include "archiver.tokenPath" . }}
{{- with .Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/*
Container image reference: [registry/]repository, then a digest that pins it, else the tag
(default: the chart's appVersion). global.imageRegistry wins over image.registry.
*/}}
{{- define "archiver.image" -}}
{{- $registry := (.Values.global).imageRegistry | default .Values.image.registry -}}
{{- $repository := .Values.image.repository -}}
{{- if $registry -}}
{{- $repository = printf "%s/%s" (trimSuffix "/" $registry) $repository -}}
{{- end -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" $repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" $repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}
{{- end -}}

{{/*
The port the daemon listens on, taken from config.web_listen_address (HOST:PORT, [v6]:PORT or
:PORT; config.listen, its deprecated name, when set) so the container port, probes and Service can
never disagree with the daemon.
*/}}
{{- define "archiver.port" -}}
{{- $listen := toString (required "config.web_listen_address is required (HOST:PORT)" (.Values.config.listen | default .Values.config.web_listen_address)) -}}
{{- $port := regexFind "[0-9]+$" $listen -}}
{{- if not (regexMatch ":[0-9]+$" $listen) -}}
{{- fail (printf "config.web_listen_address must be HOST:PORT, got %q" $listen) -}}
{{- end -}}
{{- $port -}}
{{- end -}}

{{/*
The state directory, where the persistent volume is mounted.
*/}}
{{- define "archiver.stateDir" -}}
{{- required "config.state_dir is required (the persistent volume is mounted there)" .Values.config.state_dir -}}
{{- end -}}

{{/*
Scheme of an HTTP server (HTTPS when its web config enables TLS). archiver.scheme is the daemon's;
archiver.schemeOf takes a web config (a map).
*/}}
{{- define "archiver.schemeOf" -}}
{{- if and . (hasKey . "tls_server_config") -}}HTTPS{{- else -}}HTTP{{- end -}}
{{- end -}}

{{- define "archiver.scheme" -}}
{{- include "archiver.schemeOf" .Values.webConfig -}}
{{- end -}}

{{/*
Probe: the values' timings plus the chart's check (httpGet on PATH; tcpSocket with basic auth, which
kubelet cannot pass), unless the values bring their own check. Called with
(dict "ctx" $ "probe" <values> "path" "/x") for the daemon, plus "port" <name> "web" <web config>
for another server (the browser).
*/}}
{{- define "archiver.probe" -}}
{{- $ctx := .ctx -}}
{{- $web := .ctx.Values.webConfig -}}
{{- if hasKey . "web" }}{{ $web = .web }}{{ end -}}
{{- $port := .port | default "http-metrics" -}}
{{- $probe := deepCopy (default (dict) .probe) -}}
{{- $hasCheck := or (hasKey $probe "httpGet") (hasKey $probe "tcpSocket") (hasKey $probe "exec") (hasKey $probe "grpc") -}}
{{- if not $hasCheck -}}
{{- if and $web (hasKey $web "basic_auth_users") -}}
{{- $_ := set $probe "tcpSocket" (dict "port" $port) -}}
{{- else -}}
{{- $_ := set $probe "httpGet" (dict "path" .path "port" $port "scheme" (include "archiver.schemeOf" $web)) -}}
{{- end -}}
{{- end -}}
{{- toYaml $probe -}}
{{- end -}}

{{/*
TOML rendering of .Values.config. Keys: bare when they only use [A-Za-z0-9_-], else quoted.
*/}}
{{- define "archiver.toml.key" -}}
{{- if regexMatch "^[A-Za-z0-9_-]+$" . -}}{{ . }}{{- else -}}{{ toJson . }}{{- end -}}
{{- end -}}

{{/*
One TOML value. Strings go through toJson: JSON string escapes (\" \\ \n \t \uXXXX ...) are all
valid TOML basic-string escapes. Numbers and booleans print the same in both languages. Lists
become arrays, maps inline tables. TOML has no null, so a null inside a list is an error.
*/}}
{{- define "archiver.toml.value" -}}
{{- $v := . -}}
{{- if kindIs "invalid" $v -}}
{{- fail "config: null is only allowed as a top-level or table value (to drop a key); TOML has no null inside lists" -}}
{{- else if kindIs "slice" $v -}}
[{{- range $i, $e := $v }}{{ if $i }}, {{ end }}{{ include "archiver.toml.value" $e }}{{- end -}}]
{{- else if kindIs "map" $v -}}
{ {{- range $i, $k := keys $v | sortAlpha }}{{ if $i }},{{ end }} {{ include "archiver.toml.key" $k }} = {{ include "archiver.toml.value" (index $v $k) }}{{- end }} }
{{- else -}}
{{- toJson $v -}}
{{- end -}}
{{- end -}}

{{/*
A TOML table body: its plain keys first (TOML requires them before any sub-table header), then
each map-valued key as a [sub.table] (its header omitted when it holds only sub-tables). Null
values are skipped, so `key: null` in values drops a default.
Called with (dict "path" (list ...) "table" <map>).
*/}}
{{- define "archiver.toml.table" -}}
{{- $path := .path -}}
{{- $tbl := .table -}}
{{- range $k := keys $tbl | sortAlpha }}
{{- $v := index $tbl $k }}
{{- if not (or (kindIs "map" $v) (kindIs "invalid" $v)) }}
{{ include "archiver.toml.key" $k }} = {{ include "archiver.toml.value" $v }}
{{- end }}
{{- end }}
{{- range $k := keys $tbl | sortAlpha }}
{{- $v := index $tbl $k }}
{{- if kindIs "map" $v }}
{{- $sub := append $path (include "archiver.toml.key" $k) }}
{{- $plain := false }}
{{- range $_, $vv := $v }}{{ if not (or (kindIs "map" $vv) (kindIs "invalid" $vv)) }}{{ $plain = true }}{{ end }}{{ end }}
{{- /* A header only where it carries keys or an empty table; sub-tables define their parents. */}}
{{- if or $plain (empty $v) }}
[{{ join "." $sub }}]
{{- end }}
{{- include "archiver.toml.table" (dict "path" $sub "table" $v) }}
{{- end }}
{{- end }}
{{- end -}}

{{/*
The whole config.toml. Refuses keys the chart manages itself: the token must never reach the
ConfigMap, and the token / web-config file flags are set by the chart.
*/}}
{{- define "archiver.configToml" -}}
{{- $cfg := .Values.config -}}
{{- range $forbidden := list "api_token" "api_token_file" "web_config_file" "config" }}
{{- if hasKey $cfg $forbidden }}
{{- fail (printf "config.%s must not be set: the API token comes from existingSecret/apiToken (mounted as a file), and the chart sets --api-token-file, --web.config.file and --config itself" $forbidden) }}
{{- end }}
{{- end }}
{{- if $cfg.listen }}
{{- /* The deprecated name, set by the user: the default of the new one must not outrank it. */}}
{{- $cfg = omit $cfg "web_listen_address" }}
{{- end }}
{{- if not $cfg.api_url }}
{{- fail "config.api_url is required: the base URL of the session hosting API" }}
{{- end }}
{{- include "archiver.toml.table" (dict "path" (list) "table" $cfg) | trimPrefix "\n" }}
{{- end -}}

{{/*
Pods of the StatefulSet when running: shards x replicasPerShard (ordinal o = shard o / R, replica o % R).
*/}}
{{- define "archiver.pods" -}}
{{- mul (int .Values.shards) (int .Values.replicasPerShard) -}}
{{- end -}}

{{/*
The `job` label Prometheus gives this release's targets through the chart's ServiceMonitor: the
value of the Service label serviceMonitor.jobLabel, else the Service's name.
*/}}
{{- define "archiver.job" -}}
{{- $jobLabel := .Values.serviceMonitor.jobLabel -}}
{{- if $jobLabel -}}
{{- $labels := merge (include "archiver.labels" . | fromYaml) (.Values.service.labels | default dict) -}}
{{- if not (hasKey $labels $jobLabel) -}}
{{- fail (printf "serviceMonitor.jobLabel %q: the metrics Service has no such label (add it with service.labels)" $jobLabel) -}}
{{- end -}}
{{- index $labels $jobLabel -}}
{{- else -}}
{{- include "archiver.fullname" . -}}
{{- end -}}
{{- end -}}

{{/*
The PromQL matchers (without braces) every rule selects with: prometheusRule.selector, else this
release's job and namespace as the chart's ServiceMonitor labels them. Without a ServiceMonitor the
chart cannot know the scrape job, so the selector is required.
*/}}
{{- define "archiver.ruleSelector" -}}
{{- $sel := trim .Values.prometheusRule.selector -}}
{{- if $sel -}}
{{- $sel -}}
{{- else if .Values.serviceMonitor.enabled -}}
{{- printf "job=%s, namespace=%s" (include "archiver.job" . | quote) (include "archiver.namespace" . | quote) -}}
{{- else -}}
{{- fail "prometheusRule.selector is required without serviceMonitor.enabled: the label matchers of your scrape job, e.g. job=\"archiver\"" -}}
{{- end -}}
{{- end -}}
