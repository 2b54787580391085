"""The option table: every setting of `archiver run` (and the commands that share its configuration)
declared once, as an `archiver.config.option.Option`, and the scopes that say which commands take it.

`archiver.cli` builds the click options from it, `archiver.config.settings` converts and checks the values
and fills `Settings` from it, and docs/configuration.md's table is checked against it. Adding an
option is one entry here plus (at most) one typed field of `Settings`; renaming one gives the old
spelling as an `Alias` (`archiver.config.option`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from archiver.config.evidence import LOCK_MODES, SSE_MODES
from archiver.config.option import Alias, Option, check_options
from archiver.config.values import (
    as_bool,
    as_choice,
    as_int,
    as_list,
    as_listen,
    as_optional_path,
    as_path,
    as_shard_index,
    as_store_url,
    as_str,
    as_url,
    as_workers,
    parse_duration,
    parse_size,
    positive,
)

#: Every option of `archiver run` (and the commands that share its configuration), in --help order.
OPTIONS: tuple[Option, ...] = (
    Option("api-url", "Base URL of the session hosting API.", None, as_url, metavar="URL"),
    Option(
        "api-token-file",
        "File holding the API token (else the ARCHIVER_API_TOKEN env var; never a plain flag).",
        None,
        as_str,
        metavar="PATH",
        field="api_token",
    ),
    Option(
        "store",
        "Where archives go: s3://bucket/prefix or file:///dir. Without it `run` only exports.",
        None,
        as_store_url,
        metavar="URL",
        scope="store",
    ),
    Option(
        "s3-endpoint-url",
        "Endpoint of an S3-compatible store (MinIO, Ceph, ...).",
        None,
        as_url,
        metavar="URL",
        scope="store",
    ),
    Option(
        "s3-checksum",
        "botocore request checksums: when_supported or when_required (some S3-compatibles reject CRC32).",
        "when_supported",
        as_choice("when_supported", "when_required"),
        metavar="MODE",
        scope="store",
    ),
    Option(
        "s3-sse",
        "Server-side encryption of every archived object: none (the bucket's default), aes256 (SSE-S3) or aws:kms.",
        "none",
        as_choice(*SSE_MODES),
        field="evidence",
        metavar="MODE",
    ),
    Option(
        "s3-sse-kms-key-id",
        "KMS key (id, ARN or alias) for --s3-sse aws:kms (else the account's AWS-managed key).",
        None,
        as_str,
        field="evidence",
        metavar="KEY",
    ),
    Option(
        "s3-storage-class",
        "Storage class of every archived object (STANDARD_IA, GLACIER_IR, ...; else the bucket's default).",
        None,
        as_str,
        field="evidence",
        metavar="CLASS",
    ),
    Option(
        "s3-object-tag",
        "Tag every archived object with KEY=VALUE (repeatable or comma-separated; at most 10).",
        (),
        as_list,
        multiple=True,
        field="evidence",
        metavar="KEY=VALUE",
    ),
    Option(
        "s3-object-lock-mode",
        "S3 Object Lock retention of every archived object: none, governance or compliance (bucket needs Object Lock).",
        "none",
        as_choice(*LOCK_MODES),
        field="evidence",
        metavar="MODE",
    ),
    Option(
        "s3-object-lock-days",
        "Days of Object Lock retention from each object's upload (with --s3-object-lock-mode).",
        0,
        as_int,
        field="evidence",
        metavar="DAYS",
    ),
    Option(
        "kms-endpoint-url",
        "Endpoint of the KMS that `check` asks whether --s3-sse-kms-key-id is usable (else AWS's).",
        None,
        as_url,
        metavar="URL",
    ),
    Option(
        "web.listen-address",
        "Address of the /metrics server.",
        "0.0.0.0:9877",
        as_listen,
        metavar="HOST:PORT",
        field="listen",
        aliases=(Alias("listen"),),
    ),
    Option(
        "state-dir",
        "Directory of the durable state DB and the spool.",
        ".archiver-state",
        as_path,
        metavar="DIR",
        scope="state",
    ),
    Option(
        "poll-interval",
        "How often to poll the upstream.",
        "10s",
        positive(parse_duration),
        metavar="DURATION",
    ),
    Option(
        "retention",
        "How long the upstream keeps an ended session's logs and artifacts.",
        "4h",
        positive(parse_duration),
        metavar="DURATION",
    ),
    Option(
        "deadline-margin",
        "Safety margin: fetches must finish this long before the retention window closes.",
        "10m",
        parse_duration,
        metavar="DURATION",
    ),
    Option(
        "reconcile-interval",
        "How often to list recently ended sessions (GET /session?all=true) and archive any the polls missed.",
        "5m",
        positive(parse_duration),
        metavar="DURATION",
    ),
    Option(
        "index-compact-interval",
        "How often shard 0 compacts the last two days' closed index hours into the columnar index (every replica).",
        "15m",
        positive(parse_duration),
        metavar="DURATION",
    ),
    Option(
        "on-first-start",
        "On the very first start (new state DB): archive the ended sessions the upstream still holds, or skip them.",
        "archive",
        as_choice("archive", "skip"),
        metavar="MODE",
    ),
    Option(
        "prune-after",
        "Forget archived sessions in the state DB after this long (the store is the record; at least 2x retention).",
        "7d",
        positive(parse_duration),
        metavar="DURATION",
    ),
    Option(
        "artifact-path",
        "Absolute path inside every session's container to archive (repeatable).",
        (),
        as_list,
        multiple=True,
        metavar="PATH",
        field="artifact_paths",
    ),
    Option(
        "session-label-allowlist",
        "Caller labels exported on sessionhost_session_labels (repeatable or comma-separated).",
        (),
        as_list,
        multiple=True,
        metavar="KEY",
    ),
    Option(
        "max-sessions",
        "Cap on sessions with per-session series (aggregates stay exact).",
        10000,
        as_int,
        metavar="N",
    ),
    Option(
        "max-artifact-size",
        "Artifacts larger than this are stopped while streaming and recorded as too_large.",
        "110MB",
        parse_size,
        metavar="SIZE",
    ),
    Option(
        "follow-logs",
        "Follow active sessions' logs live (GET /logs?follow=true): kept where the service drops them at the end.",
        "true",
        as_bool,
        switch=True,
    ),
    Option(
        "follow-logs-max",
        "Most sessions one daemon follows at once (one open stream each; oldest first).",
        5000,
        as_int,
        metavar="N",
    ),
    Option(
        "follow-logs-first-byte-timeout",
        "A follow stream that brings no byte (not even its answer's headers) this long after it was "
        "opened is reopened (an idle but connected game server is the 300s stall timeout's).",
        "5s",
        positive(parse_duration),
        metavar="DURATION",
    ),
    Option(
        "follow-logs-scratch-dir",
        "A memory-backed directory (tmpfs) for running sessions' captured lines: they reach the disk "
        "only as the seal made when a capture finishes (unset: the state dir). A stop moves them to "
        "the state dir; a machine crash loses them (running sessions' replays bring their lines again).",
        None,
        as_optional_path,
        metavar="DIR",
    ),
    Option(
        "follow-logs-scratch-size",
        "Most bytes of running captures kept in --follow-logs-scratch-dir; a capture that would take "
        "it past this (or finds it full) moves to the state dir.",
        "256MiB",
        parse_size,
        metavar="SIZE",
    ),
    Option(
        "follow-logs-seal-sync-delay",
        "How long a finished capture's seal waits unsynced for its upload: one stored sooner never "
        "reaches the disk; a machine crash loses those not yet synced (the read after the end may "
        "still find their logs). 0: synced at once.",
        "0s",
        parse_duration,
        metavar="DURATION",
    ),
    Option("fetch-workers", "Parallel fetches from the upstream.", 4, as_int, metavar="N"),
    Option(
        "upload-workers",
        "Parallel uploads to the store (`auto`: sized to the store, 4 for S3, 2 for a directory).",
        "auto",
        as_workers,
        metavar="N|auto",
    ),
    # The 0.x names (--log-format, --log-level, --web-config-file) had these env vars and keys too:
    # only their flags are aliases. `text`, the 0.x log format, is logfmt; `warning` is `warn`.
    Option(
        "log.format",
        "Log line format: logfmt or json.",
        "logfmt",
        as_choice("logfmt", "json", synonyms={"text": "logfmt"}),
        metavar="FORMAT",
        scope="log",
        aliases=(Alias("log-format", env=None, key=None),),
    ),
    Option(
        "log.level",
        "Log level: debug, info, warn or error.",
        "info",
        as_choice("debug", "info", "warn", "error", synonyms={"warning": "warn"}),
        metavar="LEVEL",
        scope="log",
        aliases=(Alias("log-level", env=None, key=None),),
    ),
    Option(
        "web.config.file",
        "Exporter-toolkit web config (TLS, basic auth) for the /metrics server.",
        None,
        as_optional_path,
        metavar="PATH",
        aliases=(Alias("web-config-file", env=None, key=None),),
    ),
    Option(
        "shard",
        "This daemon's shard (0..total-shards - 1), or auto: from the StatefulSet pod name in POD_NAME or HOSTNAME.",
        "0",
        as_shard_index,
        metavar="I|auto",
    ),
    Option(
        "total-shards",
        "How many shards split the sessions (by a stable hash of the id).",
        1,
        as_int,
        metavar="N",
        field="shard",
    ),
    Option(
        "replicas-per-shard",
        "Redundant daemons per shard; with --shard auto, pod ordinal o is shard o // R, replica o % R.",
        1,
        as_int,
        metavar="R",
    ),
    Option(
        "tlog-key-file",
        "Signing key of the transparency log (from `archiver keygen`); set: every archive is appended "
        "to this daemon's log under {prefix}log/ and checkpoints are signed with it.",
        None,
        as_optional_path,
        metavar="PATH",
        scope="store",
    ),
    Option(
        "tlog-witness-store",
        "A second store (another account, its own Object Lock) keeping a copy of every checkpoint: the log "
        "must always extend the newest copy (checked at start, at each checkpoint and by verify --log).",
        None,
        as_store_url,
        metavar="URL",
        scope="store",
    ),
    Option(
        "tlog-tsa-url",
        "An RFC 3161 timestamp authority: each checkpoint of the transparency log is timestamped there "
        "and the reply kept beside it (and put into proof bundles).",
        None,
        as_url,
        metavar="URL",
    ),
    Option(
        "tlog-interval",
        "How often the transparency log appends the archives committed since its last checkpoint.",
        "10s",
        positive(parse_duration),
        metavar="DURATION",
    ),
)


OPTIONS = check_options(OPTIONS)

OPTIONS_BY_KEY: Mapping[str, Option] = {opt.key: opt for opt in OPTIONS}
#: Option scopes per kind of command: retrieval (ls/show/logs/get/verify), `status`, the daemon's,
#: the evidence browser's (the store and how it logs), the demo's and the fake service's (how they log).
STORE_SCOPES = frozenset({"store"})
STATUS_SCOPES = frozenset({"state"})
DAEMON_SCOPES = frozenset({"store", "state", "daemon", "log"})
BROWSE_SCOPES = frozenset({"store", "log"})
LOG_SCOPES = frozenset({"log"})


def option_table(options: Iterable[Option] = OPTIONS) -> list[tuple[str, str, str, str]]:
    """(flag, env var, default, help) rows for docs/configuration.md's option tables."""
    return [(opt.flag, opt.env, opt.shown_default, opt.help) for opt in options]
