{{/*
The evidence browser's names, labels, credentials and URL. The URL is computed here once and used by
the Deployment (--web.external-url), the probes (its path is the route prefix), NOTES.txt and the
dashboards' browser_url variable.
*/}}

{{- define "archiver.browser.fullname" -}}
{{- printf "%s-browser" (include "archiver.fullname" . | trunc 55 | trimSuffix "-") -}}
{{- end -}}

{{/*
The browser's pods keep the chart's name and instance labels (what users select on) with their own
component; everything that selects archiver pods adds component=archiver (archiver.podSelectorLabels).
*/}}
{{- define "archiver.browser.selectorLabels" -}}
{{ include "archiver.selectorLabels" . }}
app.kubernetes.io/component: browser
{{- end -}}

{{- define "archiver.browser.labels" -}}
{{ include "archiver.browser.selectorLabels" . }}
{{ include "archiver.baseLabels" . }}
{{- end -}}

{{/*
The browser's web config as YAML: browser.webConfig, else the archiver's webConfig ("{}" for none).
*/}}
{{- define "archiver.browser.webConfig" -}}
{{- toYaml (.Values.browser.webConfig | default .Values.webConfig | default dict) -}}
{{- end -}}

{{/*
The Secret holding the browser's web config: its own when browser.webConfig is set, else the
archiver's; empty when there is none.
*/}}
{{- define "archiver.browser.webConfigSecret" -}}
{{- if .Values.browser.webConfig -}}
{{- printf "%s-web-config" (include "archiver.browser.fullname" .) -}}
{{- else if .Values.webConfig -}}
{{- printf "%s-web-config" (include "archiver.fullname" .) -}}
{{- end -}}
{{- end -}}

{{/*
Service account of the browser, least privilege: its own (created by default, or an existing
name), else the namespace's "default" account; never the archiver's, whose role can write,
unless browser.serviceAccount.name names it.
*/}}
{{- define "archiver.browser.serviceAccountName" -}}
{{- $sa := .Values.browser.serviceAccount -}}
{{- if $sa.create -}}
{{- default (include "archiver.browser.fullname" .) $sa.name -}}
{{- else -}}
{{- default "default" $sa.name -}}
{{- end -}}
{{- end -}}

{{/*
The browser's environment (a list of EnvVar): the config path, its read-only keys and its own
extraEnv. Never the archiver's extraEnv, which may hold static write keys.
*/}}
{{- define "archiver.browser.env" -}}
{{- $b := .Values.browser -}}
- name: ARCHIVER_CONFIG
  value: {{ include "archiver.configPath" . }}
{{- with $b.s3Credentials.existingSecret }}
- name: AWS_ACCESS_KEY_ID
  valueFrom:
    secretKeyRef:
      name: {{ . }}
      key: {{ $b.s3Credentials.accessKeyIdKey }}
- name: AWS_SECRET_ACCESS_KEY
  valueFrom:
    secretKeyRef:
      name: {{ . }}
      key: {{ $b.s3Credentials.secretAccessKeyKey }}
{{- end }}
{{- with $b.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/*
The archiver's extraVolumeMounts the browser needs, least privilege: only those a file of its web
config lives in (tls_server_config's cert_file, key_file, client_ca_file), and none the browser
mounts itself (same name or path in browser.extraVolumeMounts). A YAML list.
*/}}
{{- define "archiver.browser.inheritedMounts" -}}
{{- $web := include "archiver.browser.webConfig" . | fromYaml -}}
{{- $tls := $web.tls_server_config | default dict -}}
{{- $files := list -}}
{{- range $key := list "cert_file" "key_file" "client_ca_file" -}}
{{- with index $tls $key }}{{ $files = append $files (toString .) }}{{ end -}}
{{- end -}}
{{- $ownNames := list -}}
{{- $ownPaths := list -}}
{{- range .Values.browser.extraVolumeMounts -}}
{{- $ownNames = append $ownNames .name -}}
{{- $ownPaths = append $ownPaths (trimSuffix "/" .mountPath) -}}
{{- end -}}
{{- $mounts := list -}}
{{- range $mount := .Values.extraVolumeMounts -}}
{{- $dir := trimSuffix "/" $mount.mountPath -}}
{{- $needed := false -}}
{{- range $files -}}
{{- if or (eq . $dir) (hasPrefix (printf "%s/" $dir) .) }}{{ $needed = true }}{{ end -}}
{{- end -}}
{{- if and $needed (not (has $mount.name $ownNames)) (not (has $dir $ownPaths)) -}}
{{- $mounts = append $mounts $mount -}}
{{- end -}}
{{- end -}}
{{- toYaml $mounts -}}
{{- end -}}

{{/*
The browser container's extra volume mounts: those inherited for its web config, then its own.
*/}}
{{- define "archiver.browser.extraVolumeMounts" -}}
{{- $mounts := concat (include "archiver.browser.inheritedMounts" . | fromYamlArray) .Values.browser.extraVolumeMounts -}}
{{- if $mounts }}{{ toYaml $mounts }}{{ end -}}
{{- end -}}

{{/*
The browser pod's extra volumes: the archiver's extraVolumes its inherited mounts read, then
browser.extraVolumes (which wins on a name both have).
*/}}
{{- define "archiver.browser.extraVolumes" -}}
{{- $names := list -}}
{{- range (include "archiver.browser.inheritedMounts" . | fromYamlArray) }}{{ $names = append $names .name }}{{ end -}}
{{- $own := list -}}
{{- range .Values.browser.extraVolumes }}{{ $own = append $own .name }}{{ end -}}
{{- $volumes := list -}}
{{- range .Values.extraVolumes -}}
{{- if and (has .name $names) (not (has .name $own)) }}{{ $volumes = append $volumes . }}{{ end -}}
{{- end -}}
{{- $volumes = concat $volumes .Values.browser.extraVolumes -}}
{{- if $volumes }}{{ toYaml $volumes }}{{ end -}}
{{- end -}}

{{/*
The browser's public URL, without a trailing slash; its path is the route prefix. In order:
the Ingress (first host, path, https when a tls entry covers that host; browser.externalUrl may
replace scheme and host, e.g. TLS terminated by a load balancer, never the path), then
browser.externalUrl, then the in-cluster Service URL.
*/}}
{{- define "archiver.browser.url" -}}
{{- $b := .Values.browser -}}
{{- $explicit := trimSuffix "/" $b.externalUrl -}}
{{- if $b.ingress.enabled -}}
{{- if not $b.ingress.hosts -}}
{{- fail "browser.ingress.hosts: give at least one host name (the first one is the browser's URL)" -}}
{{- end -}}
{{- $host := first $b.ingress.hosts -}}
{{- if contains "*" $host -}}
{{- fail (printf "browser.ingress.hosts: the first host %q is the browser's URL and cannot be a wildcard" $host) -}}
{{- end -}}
{{- $scheme := "http" -}}
{{- range $b.ingress.tls -}}
{{- if or (not .hosts) (has $host .hosts) }}{{ $scheme = "https" }}{{ end -}}
{{- end -}}
{{- $path := trimSuffix "/" $b.ingress.path -}}
{{- if $explicit -}}
{{- $own := trimSuffix "/" (urlParse $explicit).path -}}
{{- if ne $own $path -}}
{{- fail (printf "browser.externalUrl %q: its path must be the Ingress path %q (the browser's route prefix), or leave it empty" $b.externalUrl (default "/" $path)) -}}
{{- end -}}
{{- $explicit -}}
{{- else -}}
{{- printf "%s://%s%s" $scheme $host $path -}}
{{- end -}}
{{- else if $explicit -}}
{{- $explicit -}}
{{- else -}}
{{- $web := include "archiver.browser.webConfig" . | fromYaml -}}
{{- printf "%s://%s.%s.svc:%d" (include "archiver.schemeOf" $web | lower) (include "archiver.browser.fullname" .) (include "archiver.namespace" .) (int $b.port) -}}
{{- end -}}
{{- end -}}

{{/*
The route prefix: the path of the browser's URL ("" at the root, else "/prefix").
*/}}
{{- define "archiver.browser.routePrefix" -}}
{{- trimSuffix "/" (urlParse (include "archiver.browser.url" .)).path -}}
{{- end -}}

{{/*
The URL the dashboards link session ids to: the browser's when it runs, else browser.externalUrl
(a browser run elsewhere); empty leaves the dashboards' own default.
*/}}
{{- define "archiver.dashboards.browserUrl" -}}
{{- if .Values.browser.enabled -}}
{{- include "archiver.browser.url" . -}}
{{- else -}}
{{- trimSuffix "/" .Values.browser.externalUrl -}}
{{- end -}}
{{- end -}}

{{/*
"true" when the chart can see that the browser asks for authentication: basic auth in its web
config, or an Ingress annotation of a known authenticating controller setup (ingress-nginx external
auth such as oauth2-proxy, ingress-nginx basic/digest auth, AWS Load Balancer Controller
Cognito/OIDC).
*/}}
{{- define "archiver.browser.authenticated" -}}
{{- $web := include "archiver.browser.webConfig" . | fromYaml -}}
{{- $ann := .Values.browser.ingress.annotations | default dict -}}
{{- $nginxAuthType := index $ann "nginx.ingress.kubernetes.io/auth-type" | default "" -}}
{{- $albAuthType := index $ann "alb.ingress.kubernetes.io/auth-type" | default "" -}}
{{- if or $web.basic_auth_users (index $ann "nginx.ingress.kubernetes.io/auth-url") (and (has $nginxAuthType (list "basic" "digest")) (index $ann "nginx.ingress.kubernetes.io/auth-secret")) (has $albAuthType (list "cognito" "oidc")) -}}
true
{{- end -}}
{{- end -}}
