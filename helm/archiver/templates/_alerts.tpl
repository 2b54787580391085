{{/*
The alert rules: the single source of grafana/alerts/archiver.rules.yml (generated from the default
rendering by `make rules`; a test keeps them equal) and of the chart's PrometheusRule. Each rule's
enabled / severity / for / threshold come from .Values.prometheusRule.rules.<AlertName>.
Prometheus template syntax inside annotations is written as Go raw strings ({{`...`}}) so Helm
leaves it alone. Every selector of every rule carries archiver.ruleSelector ($s), mixin style, so a
release's rules see its own targets only in a Prometheus shared by several releases and teams.
*/}}

{{/*
Where an alert is, as its texts name it: namespace/pod (the ServiceMonitor's target labels), else the
instance (a Prometheus without Kubernetes service discovery).
*/}}
{{- define "archiver.alertWhere" -}}
{{`{{ if $labels.pod }}{{ $labels.namespace }}/{{ $labels.pod }}{{ else }}{{ $labels.instance }}{{ end }}`}}
{{- end -}}

{{/*
Bytes of a Kubernetes quantity (10Gi, 500Mi, 2G, 1000000): the spool alert follows persistence.size.
*/}}
{{- define "archiver.quantityBytes" -}}
{{- $q := toString . -}}
{{- $number := regexFind "^[0-9]+(\\.[0-9]+)?" $q -}}
{{- $suffix := trimPrefix $number $q -}}
{{- $units := dict "" 1 "k" 1000 "M" 1000000 "G" 1000000000 "T" 1000000000000 "Ki" 1024 "Mi" 1048576 "Gi" 1073741824 "Ti" 1099511627776 -}}
{{- if or (not $number) (not (hasKey $units $suffix)) -}}
{{- fail (printf "cannot read %q as a size (e.g. 10Gi, 500Mi, 2G)" $q) -}}
{{- end -}}
{{- mulf (float64 $number) (index $units $suffix) | floor | int64 -}}
{{- end -}}

{{/*
One rule's settings merged over the defaults; fails on an unknown alert name.
Called with (dict "ctx" $ "name" "ArchiverDown").
*/}}
{{- define "archiver.ruleSettings" -}}
{{- $rules := .ctx.Values.prometheusRule.rules -}}
{{- if not (hasKey $rules .name) -}}
{{- fail (printf "prometheusRule.rules.%s is missing" .name) -}}
{{- end -}}
{{- toYaml (index $rules .name) -}}
{{- end -}}

{{/*
The rule's common tail: for, labels (severity plus prometheusRule.alertLabels), and the start of
the annotations with runbook_url. Called with (dict "ctx" $ "name" ... "rule" <settings>).
*/}}
{{- define "archiver.ruleHead" -}}
{{- $rule := .rule -}}
{{- with $rule.for }}
for: {{ . }}
{{- end }}
labels:
  severity: {{ $rule.severity }}
  {{- with .ctx.Values.prometheusRule.alertLabels }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
annotations:
  runbook_url: {{ printf "%s#%s" .ctx.Values.prometheusRule.runbookBaseUrl (lower .name) }}
{{- end -}}

{{/*
The rule groups (a YAML list), with disabled rules left out.
*/}}
{{- define "archiver.alertGroups" -}}
{{- $ := . -}}
{{- $s := include "archiver.ruleSelector" . -}}
{{- $where := include "archiver.alertWhere" . -}}
{{- $r := dict -}}
{{- range $name := list "ArchiverDown" "ArchiverUpstreamDown" "ArchiverStoreDown" "ArchiverDetectionFailing" "ArchiverUpstreamInvalidEntries" "ArchiverFetchDeadlineNear" "ArchiverItemsExpired" "ArchiverItemsFailed" "ArchiverItemsConflict" "ArchiverItemsTooLarge" "ArchiverSessionsFailed" "ArchiverLiveCaptureGaps" "ArchiverLiveCaptureWriteFailed" "ArchiverCreateOnceEmulated" "ArchiverErrors" "ArchiverUploadBacklog" "ArchiverSpoolLarge" "ArchiverNoRecentArchive" "ArchiverSessionsDropped" "ArchiverLiveUnfollowed" "ArchiverLogInconsistent" "ArchiverLogLagging" -}}
{{- $_ := set $r $name (include "archiver.ruleSettings" (dict "ctx" $ "name" $name) | fromYaml) -}}
{{- end -}}
- name: session-archiver
  rules:
    {{- with $r.ArchiverDown }}{{ if .enabled }}
    - alert: ArchiverDown
      # A target of the selector that exported archiver_build_info in the last day and now fails
      # its scrape, or no archiver target at all (deleted, scaled to 0, or the ServiceMonitor
      # selects nothing): the absent() branch, which stays quiet while the first branch speaks.
      expr: |-
        (up{ {{- $s }}} == 0 and on (job, instance) max_over_time(archiver_build_info{ {{- $s }}}[1d]))
        or
        (absent(archiver_build_info{ {{- $s }}}) unless on () (up{ {{- $s }}} == 0 and on (job, instance) max_over_time(archiver_build_info{ {{- $s }}}[1d])))
      {{- include "archiver.ruleHead" (dict "ctx" $ "name" "ArchiverDown" "rule" .) | trim | nindent 6 }}
        summary: {{`"Archiver {{ if $labels.instance }}`}}{{ $where }}{{` is down{{ else }}is not running{{ with $labels.namespace }} in {{ . }}{{ end }}: no target{{ with $labels.job }} of job {{ . }}{{ end }} exports archiver_build_info{{ end }}"`}}
        description: >-
          {{`No archiver has been scraped successfully for`}} {{ .for }}{{`{{ if $labels.instance }} (job {{ $labels.job }},`}} {{ $where }}{{`){{ end }}.
          While the archiver is down, ended sessions are neither confirmed nor fetched; their
          logs and artifacts are removed upstream 4 hours after the session ends.`}}
    {{- end }}{{ end }}

    {{- with $r.ArchiverUpstreamDown }}{{ if .enabled }}

    - alert: ArchiverUpstreamDown
      # The session list only: some accounts' /metrics answers 404 for good, and exporting and
      # archiving both depend on the list, not on the upstream's own metrics.
      expr: archiver_upstream_up{ {{- $s }}, endpoint="sessions"} == 0
      {{- include "archiver.ruleHead" (dict "ctx" $ "name" "ArchiverUpstreamDown" "rule" .) | trim | nindent 6 }}
        summary: {{`"Archiver`}} {{ $where }} {{`cannot reach the session hosting API ({{ $labels.endpoint }})"`}}
        description: >-
          {{ $where }}{{`: the polls of upstream endpoint {{ $labels.endpoint }} failed for`}} {{ .for }}.
          Session metrics are stale and ended sessions are not detected; the 4-hour fetch window
          keeps running.
    {{- end }}{{ end }}

    {{- with $r.ArchiverStoreDown }}{{ if .enabled }}

    - alert: ArchiverStoreDown
      # Set by every store operation and by a probe each poll interval, so a dead endpoint or a
      # wrong IAM role shows within one poll, not when the spool or the deadlines run out.
      expr: archiver_store_up{ {{- $s }}} == 0
      {{- include "archiver.ruleHead" (dict "ctx" $ "name" "ArchiverStoreDown" "rule" .) | trim | nindent 6 }}
        summary: {{`"Archiver`}} {{ $where }} {{`cannot write to its archive store"`}}
        description: >-
          {{ $where }}{{`: store operations and probes have failed for`}} {{ .for }}.
          Fetched logs and artifacts wait in the local spool (nothing is lost while the volume has
          room), but no session is archived until the store accepts writes again.
    {{- end }}{{ end }}

    {{- with $r.ArchiverDetectionFailing }}{{ if .enabled }}

    - alert: ArchiverDetectionFailing
      expr: archiver_detection_up{ {{- $s }}} == 0
      {{- include "archiver.ruleHead" (dict "ctx" $ "name" "ArchiverDetectionFailing" "rule" .) | trim | nindent 6 }}
        summary: {{`"Archiver`}} {{ $where }} {{`cannot process ended sessions"`}}
        description: >-
          {{ $where }}{{`: the end detection of every poll has failed for`}} {{ .for }},
          although the session list is fetched. Ended sessions are not queued for archiving; their
          logs and artifacts are removed upstream 4 hours after the session ends.
    {{- end }}{{ end }}

    {{- with $r.ArchiverUpstreamInvalidEntries }}{{ if .enabled }}

    - alert: ArchiverUpstreamInvalidEntries
      expr: increase(archiver_upstream_invalid_entries_total{ {{- $s }}}[{{ .window }}]) > 0
      {{- include "archiver.ruleHead" (dict "ctx" $ "name" "ArchiverUpstreamInvalidEntries" "rule" .) | trim | nindent 6 }}
        summary: {{`"The session list has entries archiver`}} {{ $where }} {{`cannot read"`}}
        description: >-
          {{ $where }}{{`: about {{ $value | humanize }} session list entries were left out of
          polls in the last`}} {{ .window }} {{`because a value failed its range checks. Those sessions are
          neither exported nor archived while their entries stay invalid.`}}
    {{- end }}{{ end }}

    {{- with $r.ArchiverFetchDeadlineNear }}{{ if .enabled }}

    - alert: ArchiverFetchDeadlineNear
      expr: archiver_next_fetch_deadline_timestamp_seconds{ {{- $s }}} - time() < {{ int64 .threshold }}
      {{- include "archiver.ruleHead" (dict "ctx" $ "name" "ArchiverFetchDeadlineNear" "rule" .) | trim | nindent 6 }}
        summary: {{`"An ended session's logs/artifacts are about to be removed upstream (`}}{{ $where }}{{`)"`}}
        description: >-
          {{ $where }}{{`: the earliest pending fetch deadline is
          {{ $value | humanizeDuration }} away. When it passes, the provider removes the
          session's logs and artifacts and they can no longer be archived.`}}
    {{- end }}{{ end }}

    {{- with $r.ArchiverItemsExpired }}{{ if .enabled }}

    - alert: ArchiverItemsExpired
      expr: increase(archiver_items_total{ {{- $s }}, outcome="expired"}[{{ .window }}]) > 0
      {{- include "archiver.ruleHead" (dict "ctx" $ "name" "ArchiverItemsExpired" "rule" .) | trim | nindent 6 }}
        summary: {{`"Evidence lost: {{ $labels.kind }} items of ended sessions expired before archiving (`}}{{ $where }}{{`)"`}}
        description: >-
          {{ $where }}{{`: about {{ $value | humanize }} {{ $labels.kind }} items passed
          their fetch deadline in the last`}} {{ .window }} {{`without being fetched. They are gone upstream;
          their manifests record the outcome "expired".`}}
    {{- end }}{{ end }}

    {{- with $r.ArchiverItemsFailed }}{{ if .enabled }}

    - alert: ArchiverItemsFailed
      # An item that can never be stored (its reason is in the manifest and the log): the session's
      # archive is complete without it.
      expr: increase(archiver_items_total{ {{- $s }}, outcome="failed"}[{{ .window }}]) > 0
      {{- include "archiver.ruleHead" (dict "ctx" $ "name" "ArchiverItemsFailed" "rule" .) | trim | nindent 6 }}
        summary: {{`"Evidence not archived: {{ $labels.kind }} items of ended sessions failed (`}}{{ $where }}{{`)"`}}
        description: >-
          {{ $where }}{{`: about {{ $value | humanize }} {{ $labels.kind }} items ended "failed" in
          the last`}} {{ .window }}{{`: they could not be fetched or stored, and their manifests
          record the outcome with its reason. Find out why while the upstream still holds the data.`}}
    {{- end }}{{ end }}

    {{- with $r.ArchiverItemsConflict }}{{ if .enabled }}

    - alert: ArchiverItemsConflict
      # The store holds other bytes under an item's create-once key: ours are only in the pod's
      # state volume (conflicts/), one copy, until someone looks.
      expr: increase(archiver_items_total{ {{- $s }}, outcome="conflict"}[{{ .window }}]) > 0
      {{- include "archiver.ruleHead" (dict "ctx" $ "name" "ArchiverItemsConflict" "rule" .) | trim | nindent 6 }}
        summary: {{`"Evidence in danger: the store holds other bytes for {{ $labels.kind }} items (`}}{{ $where }}{{`)"`}}
        description: >-
          {{ $where }}{{`: about {{ $value | humanize }} {{ $labels.kind }} items ended "conflict" in
          the last`}} {{ .window }}{{`: the store already held a different object at their key. The
          archiver's own bytes are kept only in the pod's state volume, under conflicts/.`}}
    {{- end }}{{ end }}

    {{- with $r.ArchiverItemsTooLarge }}{{ if .enabled }}

    - alert: ArchiverItemsTooLarge
      expr: increase(archiver_items_total{ {{- $s }}, outcome="too_large"}[{{ .window }}]) > 0
      {{- include "archiver.ruleHead" (dict "ctx" $ "name" "ArchiverItemsTooLarge" "rule" .) | trim | nindent 6 }}
        summary: {{`"Evidence cut off: {{ $labels.kind }} items larger than the size limit (`}}{{ $where }}{{`)"`}}
        description: >-
          {{ $where }}{{`: about {{ $value | humanize }} {{ $labels.kind }} items ended "too_large" in
          the last`}} {{ .window }}{{`: they were bigger than max_artifact_size and are not archived.
          Raise the limit before the upstream removes them, if they are wanted.`}}
    {{- end }}{{ end }}

    {{- with $r.ArchiverSessionsFailed }}{{ if .enabled }}

    - alert: ArchiverSessionsFailed
      expr: increase(archiver_sessions_failed_total{ {{- $s }}}[{{ .window }}]) > 0
      {{- include "archiver.ruleHead" (dict "ctx" $ "name" "ArchiverSessionsFailed" "rule" .) | trim | nindent 6 }}
        summary: {{`"Sessions left without an archive (`}}{{ $where }}{{`)"`}}
        description: >-
          {{ $where }}{{`: about {{ $value | humanize }} sessions were given up on in the last`}}
          {{ .window }}{{`: their manifest could not be written before the fetch deadline, so no
          archive of them exists for retrieval.`}}
    {{- end }}{{ end }}

    {{- with $r.ArchiverLiveCaptureGaps }}{{ if .enabled }}

    - alert: ArchiverLiveCaptureGaps
      # A capture whose follow never saw the log's end: its last lines may be missing where the
      # service keeps no logs after the end.
      expr: increase(archiver_live_captures_total{ {{- $s }}, state="gap"}[{{ .window }}]) > {{ int64 .threshold }}
      {{- include "archiver.ruleHead" (dict "ctx" $ "name" "ArchiverLiveCaptureGaps" "rule" .) | trim | nindent 6 }}
        summary: {{`"Live log captures ended with a gap (`}}{{ $where }}{{`)"`}}
        description: >-
          {{ $where }}{{`: about {{ $value | humanize }} live log captures ended in the last`}}
          {{ .window }} {{`without seeing the end of the log. Where the service drops a session's
          log at its end, the lines after the gap are lost.`}}
    {{- end }}{{ end }}

    {{- with $r.ArchiverLiveCaptureWriteFailed }}{{ if .enabled }}

    - alert: ArchiverLiveCaptureWriteFailed
      expr: increase(archiver_live_reconnects_total{ {{- $s }}, reason="write_failed"}[{{ .window }}]) > 0
      {{- include "archiver.ruleHead" (dict "ctx" $ "name" "ArchiverLiveCaptureWriteFailed" "rule" .) | trim | nindent 6 }}
        summary: {{`"Live log captures cannot be written to the volume (`}}{{ $where }}{{`)"`}}
        description: >-
          {{ $where }}{{`: a capture file could not be written about {{ $value | humanize }} times in
          the last`}} {{ .window }}{{` (a full or failing state volume). Lines that arrive meanwhile are
          not kept.`}}
    {{- end }}{{ end }}

    {{- with $r.ArchiverCreateOnceEmulated }}{{ if .enabled }}

    - alert: ArchiverCreateOnceEmulated
      # Probed at start-up: without If-None-Match the archiver HEADs first, which a concurrent
      # writer (another replica, another tool) can still race.
      expr: archiver_store_guarantee{ {{- $s }}, guarantee=~"create_once_put|create_once_complete"} == 0
      {{- include "archiver.ruleHead" (dict "ctx" $ "name" "ArchiverCreateOnceEmulated" "rule" .) | trim | nindent 6 }}
        summary: {{`"The archive store ignores create-once writes ({{ $labels.guarantee }},`}} {{ $where }}{{`)"`}}
        description: >-
          {{ $where }}{{`: the store ignores If-None-Match ({{ $labels.guarantee }}); every write
          checks first instead, and a concurrent writer could still overwrite an archived object.`}}
    {{- end }}{{ end }}

    {{- with $r.ArchiverErrors }}{{ if .enabled }}

    - alert: ArchiverErrors
      expr: increase(archiver_errors_total{ {{- $s }}}[{{ .window }}]) > 0
      {{- include "archiver.ruleHead" (dict "ctx" $ "name" "ArchiverErrors" "rule" .) | trim | nindent 6 }}
        summary: {{`"Unexpected errors in the archiver ({{ $labels.where }},`}} {{ $where }}{{`)"`}}
        description: >-
          {{ $where }}{{`: about {{ $value | humanize }} unexpected errors were caught at the
          "{{ $labels.where }}" edge in the last`}} {{ .window }}{{`. The loop went on, but the work it
          was doing may be retried late or not at all: read the pod's log.`}}
    {{- end }}{{ end }}

    {{- with $r.ArchiverUploadBacklog }}{{ if .enabled }}

    - alert: ArchiverUploadBacklog
      expr: archiver_pending_items{ {{- $s }}, stage="upload"} > {{ int64 .threshold }}
      {{- include "archiver.ruleHead" (dict "ctx" $ "name" "ArchiverUploadBacklog" "rule" .) | trim | nindent 6 }}
        summary: {{`"Archiver upload backlog: {{ $value }} items waiting for the store (`}}{{ $where }}{{`)"`}}
        description: >-
          {{ $where }}{{`: more than`}} {{ int64 .threshold }} {{`fetched items have been waiting for
          upload to the archive store for`}} {{ .for }}. Nothing is lost (the bytes are spooled on
          the volume), but the spool grows until the store accepts writes again.
    {{- end }}{{ end }}

    {{- with $r.ArchiverSpoolLarge }}{{ if .enabled }}
    {{- $bytes := .thresholdBytes }}
    {{- if not $bytes }}
    {{- $bytes = mulf (include "archiver.quantityBytes" $.Values.persistence.size | float64) .volumeFraction | floor | int64 }}
    {{- end }}

    - alert: ArchiverSpoolLarge
      # Default: a fraction (volumeFraction) of the state volume, persistence.size.
      expr: archiver_spool_bytes{ {{- $s }}} > {{ int64 $bytes }}
      {{- include "archiver.ruleHead" (dict "ctx" $ "name" "ArchiverSpoolLarge" "rule" .) | trim | nindent 6 }}
        summary: {{`"Archiver spool holds {{ $value | humanize1024 }}B (`}}{{ $where }}{{`)"`}}
        description: >-
          {{ $where }}{{`: the local spool holds more than {{`}} {{ int64 $bytes }} {{`| humanize1024 }}B of
          fetched, not yet uploaded data (the state volume is`}} {{ $.Values.persistence.size }}{{`). If the
          volume fills up, fetches fail and fetch deadlines can be missed.`}}
    {{- end }}{{ end }}

    {{- with $r.ArchiverNoRecentArchive }}{{ if .enabled }}

    - alert: ArchiverNoRecentArchive
      expr: |-
        increase(archiver_sessions_ended_total{ {{- $s }}}[1h]) > 0
        unless on (job, instance)
        (time() - archiver_last_archive_success_timestamp_seconds{ {{- $s }}} < {{ int64 .threshold }})
      {{- include "archiver.ruleHead" (dict "ctx" $ "name" "ArchiverNoRecentArchive" "rule" .) | trim | nindent 6 }}
        summary: {{`"Sessions ended but`}} {{ $where }} {{`archived nothing for a while"`}}
        description: >-
          {{ $where }}{{`: sessions ended in the last hour, yet no session archive
          completed in the last`}} {{ int64 .threshold }} {{`seconds. Without a store (export-only mode) this
          alert is expected; disable it or set config.store.`}}
    {{- end }}{{ end }}

    {{- with $r.ArchiverSessionsDropped }}{{ if .enabled }}

    - alert: ArchiverSessionsDropped
      expr: archiver_sessions_dropped{ {{- $s }}} > 0
      {{- include "archiver.ruleHead" (dict "ctx" $ "name" "ArchiverSessionsDropped" "rule" .) | trim | nindent 6 }}
        summary: {{`"Per-session series capped: {{ $value }} sessions not exported (`}}{{ $where }}{{`)"`}}
        description: >-
          {{ $where }}{{`: more active sessions than --max-sessions; the per-session
          series (sessionhost_session_*) of {{ $value }} sessions are dropped. Aggregates
          (sessionhost_sessions, sessionhost_players) stay exact and archiving is unaffected.`}}
    {{- end }}{{ end }}

    {{- with $r.ArchiverLiveUnfollowed }}{{ if .enabled }}

    - alert: ArchiverLiveUnfollowed
      expr: archiver_live_unfollowed_sessions{ {{- $s }}} > 0
      {{- include "archiver.ruleHead" (dict "ctx" $ "name" "ArchiverLiveUnfollowed" "rule" .) | trim | nindent 6 }}
        summary: {{`"{{ $value }} active sessions without a live log follow (`}}{{ $where }}{{`)"`}}
        description: >-
          {{ $where }}{{`: more active sessions than --follow-logs-max; the logs of {{ $value }}
          sessions are read only after they end, and lost where the service drops them at the end.
          Raise --follow-logs-max (each follow is one open connection to the service) or add shards.`}}
    {{- end }}{{ end }}

    {{- with $r.ArchiverLogInconsistent }}{{ if .enabled }}

    - alert: ArchiverLogInconsistent
      # The stored transparency log no longer extends the checkpoints this pod signed or kept:
      # tiles rewritten, the checkpoint rolled back, or a second writer of the same log.
      expr: archiver_log_consistency_ok{ {{- $s }}} == 0
      {{- include "archiver.ruleHead" (dict "ctx" $ "name" "ArchiverLogInconsistent" "rule" .) | trim | nindent 6 }}
        summary: {{`"Transparency log of`}} {{ $where }} {{`failed its consistency check"`}}
        description: >-
          {{ $where }}{{`: the stored log does not extend the last checkpoint this pod signed. Someone
          with write access to the store changed or rolled back the log, or two pods write the same
          log. Appending has stopped; archives queue in the state DB. Keep the store as it is and
          investigate (archiver verify --log).`}}
    {{- end }}{{ end }}

    {{- with $r.ArchiverLogLagging }}{{ if .enabled }}

    - alert: ArchiverLogLagging
      expr: |-
        (time() - archiver_log_last_checkpoint_timestamp_seconds{ {{- $s }}}) > {{ .threshold }}
        and on (namespace, job, instance)
        archiver_log_pending{ {{- $s }}} > 0
      {{- include "archiver.ruleHead" (dict "ctx" $ "name" "ArchiverLogLagging" "rule" .) | trim | nindent 6 }}
        summary: {{`"{{ $value }} s since the last transparency log checkpoint (`}}{{ $where }}{{`)"`}}
        description: >-
          {{ $where }}{{`: archives are waiting for the transparency log and no checkpoint was signed
          for {{ $value }} s (the store refuses the log's writes, or the log failed a check).`}}
    {{- end }}{{ end }}
# Sharded and redundant fleets (shards x replicasPerShard pods): every pod exports its own shard's
# sessions, and the replicas of a shard export the same ones. These series count each session once:
# join archiver_shard_info for the shard, take the max over a shard's replicas, sum over shards.
# One pod (the default) has shard="0": the same numbers as summing the pod's own series. Scoped by
# the selector and kept apart by namespace and job, so two releases never write the same series.
- name: session-archiver-fleet
  rules:
    - record: archiver:sessionhost_sessions:sum
      expr: |-
        sum by (namespace, job, location, image, tag, status) (
          max by (namespace, job, shard, location, image, tag, status) (
            sessionhost_sessions{ {{- $s }}} * on (namespace, job, instance) group_left (shard) archiver_shard_info{ {{- $s }}}
          )
        )
    - record: archiver:sessionhost_players:sum
      expr: |-
        sum by (namespace, job, location, image, tag) (
          max by (namespace, job, shard, location, image, tag) (
            sessionhost_players{ {{- $s }}} * on (namespace, job, instance) group_left (shard) archiver_shard_info{ {{- $s }}}
          )
        )
    - record: archiver:sessions_ended:rate5m
      expr: |-
        sum by (namespace, job) (
          max by (namespace, job, shard) (
            rate(archiver_sessions_ended_total{ {{- $s }}}[5m]) * on (namespace, job, instance) group_left (shard) archiver_shard_info{ {{- $s }}}
          )
        )
    # Pods up per shard: 0 means a shard's sessions are neither exported nor archived.
    - record: archiver:shard_replicas_up:count
      expr: |-
        count by (namespace, job, shard, total_shards) (archiver_shard_info{ {{- $s }}} * on (namespace, job, instance) group_left () (up{ {{- $s }}} == 1))
{{- end -}}
