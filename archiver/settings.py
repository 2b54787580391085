"""The configuration: the option table (what each command accepts), the TOML file's checks, and the
conversion and validation of raw values into the frozen Settings.

Which raw value wins (flag > env > file > default) is click's business: archiver.cli declares every
option with its env var and gives the file to click as its `default_map`, then hands each value with
its source to `build_settings`.
"""

from __future__ import annotations

import math
import os
import re
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from archiver import inputs
from archiver.credentials import Token
from archiver.errors import ConfigError
from archiver.evidence import LOCK_MODES, NO_EVIDENCE, SSE_MODES, Evidence
from archiver.sharding import Shard, ordinal_from_pod_name, pod_name, shard_from_ordinal

ENV_PREFIX = "ARCHIVER_"
TOKEN_ENV = "ARCHIVER_API_TOKEN"

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
#: The longest duration accepted (ten years): anything longer is a typo, and would overflow the
#: datetime and timeout arithmetic far from where it was given.
MAX_DURATION: Final = 3650 * 86400.0
#: The most parallel fetch or upload workers (one thread each) accepted.
MAX_WORKERS: Final = 256
#: The largest size or count accepted (2**53: exact as a float, far inside SQLite's 64-bit integers).
MAX_COUNT: Final = 2**53


def _bounded_duration(seconds: float, value: object, limit: float) -> float:
    if seconds > limit:
        raise ValueError(f"duration too long (at most {int(limit // 86400)}d): {value!r}")
    return seconds


def parse_duration(value: str | float | int, *, limit: float = MAX_DURATION) -> float:
    """Seconds from `90`, `90s`, `10m`, `4h`, `2h30m`, `1d` (a plain number is seconds), at most
    `limit` (a setting's bound; the retrieval commands bound the time it leads to instead)."""
    if isinstance(value, bool):
        raise ValueError(f"not a duration: {value!r}")
    if isinstance(value, int | float):
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"not a duration: {value!r}")
        return _bounded_duration(float(value), value, limit)
    text = value.strip().lower()
    try:
        seconds = float(text)
    except ValueError:
        pos, total = 0, 0.0
        for match in _DURATION.finditer(text):
            if match.start() != pos:
                break
            total += float(match.group(1)) * _UNITS[match.group(2)]
            pos = match.end()
        if pos != len(text) or not text:
            raise ValueError(f"not a duration (use e.g. 30s, 10m, 4h, 2h30m): {value!r}") from None
        return _bounded_duration(total, value, limit)
    if not math.isfinite(seconds) or seconds < 0:  # float() accepts "nan" and "inf"
        raise ValueError(f"not a duration (use e.g. 30s, 10m, 4h, 2h30m): {value!r}")
    return _bounded_duration(seconds, value, limit)


def parse_listen(value: str) -> tuple[str, int]:
    """`HOST:PORT`, `:PORT` (all interfaces) or `[::1]:PORT`."""
    text = value.strip()
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"expected HOST:PORT, got {value!r}")
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port)


def parse_size(value: str | int) -> int:
    """Bytes from `1048576`, `100MB`, `100MiB`, `2GiB`."""
    if isinstance(value, int) and not isinstance(value, bool):
        return _bounded_count(value, value)
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]i?b?|b)?\s*", str(value).lower())
    if not match:
        raise ValueError(f"not a size (use e.g. 100MB, 512MiB): {value!r}")
    number, unit = float(match.group(1)), (match.group(2) or "b")
    base = 1024 if "i" in unit else 1000
    power = "bkmgt".index(unit[0])
    total = number * base**power
    if not math.isfinite(total) or total > MAX_COUNT:
        raise ValueError(f"size too large (at most {MAX_COUNT} bytes): {value!r}")
    return int(total)


def _bounded_count(number: int, value: object) -> int:
    if not 0 <= number <= MAX_COUNT:
        raise ValueError(f"out of range (0 to {MAX_COUNT}): {value!r}")
    return number


def _as_list(value: Any) -> tuple[str, ...]:
    """A list from a TOML array, a repeated flag, or a comma-separated env var."""
    if value is None:
        return ()
    if isinstance(value, str):
        return tuple(part.strip() for part in value.split(",") if part.strip())
    if isinstance(value, list | tuple):
        items: list[str] = []
        for item in value:
            if not isinstance(item, str):
                raise ValueError(f"expected strings, got {item!r}")
            items.extend(_as_list(item))  # a repeated flag may itself be comma-separated
        return tuple(items)
    raise ValueError(f"expected a list of strings, got {value!r}")


def _as_int(value: Any) -> int:
    if isinstance(value, bool):
        raise ValueError(f"expected an integer, got {value!r}")
    if isinstance(value, int):
        number = value
    elif isinstance(value, str) and value.strip().lstrip("-").isdigit() and len(value.strip()) <= 30:
        number = int(value.strip())
    else:
        raise ValueError(f"expected an integer, got {value!r}")
    if abs(number) > MAX_COUNT:
        raise ValueError(f"integer out of range: {value!r}")
    return number


#: `--upload-workers auto` is stored as 0; the pipeline sizes it to the store (`auto_upload_workers`).
AUTO_WORKERS = 0


def _as_workers(value: Any) -> int:
    """A worker count, or `auto` (AUTO_WORKERS)."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        return AUTO_WORKERS
    count = _as_int(value)
    if count < 1:
        raise ValueError(f"expected `auto` or an integer of at least 1, got {value!r}")
    return count


def _as_str(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"expected a string, got {value!r}")
    return value


def _as_choice(*choices: str) -> Callable[[Any], str]:
    def convert(value: Any) -> str:
        if value not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}, got {value!r}")
        return str(value)

    return convert


@dataclass(frozen=True, slots=True)
class Option:
    """One setting: its name (flag `--name`, env `ARCHIVER_NAME`, TOML key `name` with underscores)."""

    name: str
    help: str
    default: Any
    convert: Callable[[Any], Any]
    multiple: bool = False
    metavar: str = "TEXT"
    #: Which commands take it: "store" (every command that reads the store), "state" (`status` too),
    #: "daemon" (`run`, `archive`, `check` only).
    scope: str = "daemon"

    @property
    def shown_default(self) -> str:
        """The default as --help and the README show it."""
        default = self.default
        if isinstance(default, tuple):
            return ", ".join(default) if default else "(none)"
        return "(none)" if default is None else str(default)

    @property
    def key(self) -> str:
        return self.name.replace("-", "_")

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.key.upper()

    @property
    def flag(self) -> str:
        return "--" + self.name


def _url(value: Any) -> str:
    text = _as_str(value).strip()
    if not re.match(r"^https?://[^/\s]+", text):
        raise ValueError(f"expected an http(s):// URL, got {text!r}")
    return text.rstrip("/")


def _store_url(value: Any) -> str:
    text = _as_str(value).strip()
    if not (text.startswith("s3://") or text.startswith("file://")):
        raise ValueError(f"expected s3://bucket/prefix or file:///dir, got {text!r}")
    return text


def _shard_index(value: Any) -> int | str:
    """A shard index (0, 1, ...) or `auto` (from the StatefulSet pod name)."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    try:
        index = _as_int(value)
    except ValueError:
        index = -1
    if index < 0:
        raise ValueError(f"expected a shard index (0, 1, ...) or auto, got {value!r}")
    return index


def _positive(convert: Callable[[Any], float]) -> Callable[[Any], float]:
    def wrapped(value: Any) -> float:
        result = convert(value)
        if result <= 0:
            raise ValueError(f"must be greater than zero, got {value!r}")
        return result

    return wrapped


#: Every option of `archiver run` (and the commands that share its configuration), in --help order.
OPTIONS: tuple[Option, ...] = (
    Option("api-url", "Base URL of the session hosting API.", None, _url, metavar="URL"),
    Option(
        "api-token-file",
        "File holding the API token (else the ARCHIVER_API_TOKEN env var; never a plain flag).",
        None,
        _as_str,
        metavar="PATH",
    ),
    Option(
        "store",
        "Where archives go: s3://bucket/prefix or file:///dir. Without it `run` only exports.",
        None,
        _store_url,
        metavar="URL",
        scope="store",
    ),
    Option(
        "s3-endpoint-url",
        "Endpoint of an S3-compatible store (MinIO, Ceph, ...).",
        None,
        _url,
        metavar="URL",
        scope="store",
    ),
    Option(
        "s3-checksum",
        "botocore request checksums: when_supported or when_required (some S3-compatibles reject CRC32).",
        "when_supported",
        _as_choice("when_supported", "when_required"),
        metavar="MODE",
        scope="store",
    ),
    Option(
        "s3-sse",
        "Server-side encryption of every archived object: none (the bucket's default), aes256 (SSE-S3) or aws:kms.",
        "none",
        _as_choice(*SSE_MODES),
        metavar="MODE",
    ),
    Option(
        "s3-sse-kms-key-id",
        "KMS key (id, ARN or alias) for --s3-sse aws:kms (else the account's AWS-managed key).",
        None,
        _as_str,
        metavar="KEY",
    ),
    Option(
        "s3-storage-class",
        "Storage class of every archived object (STANDARD_IA, GLACIER_IR, ...; else the bucket's default).",
        None,
        _as_str,
        metavar="CLASS",
    ),
    Option(
        "s3-object-tag",
        "Tag every archived object with KEY=VALUE (repeatable or comma-separated; at most 10).",
        (),
        _as_list,
        multiple=True,
        metavar="KEY=VALUE",
    ),
    Option(
        "s3-object-lock-mode",
        "S3 Object Lock retention of every archived object: none, governance or compliance (bucket needs Object Lock).",
        "none",
        _as_choice(*LOCK_MODES),
        metavar="MODE",
    ),
    Option(
        "s3-object-lock-days",
        "Days of Object Lock retention from each object's upload (with --s3-object-lock-mode).",
        0,
        _as_int,
        metavar="DAYS",
    ),
    Option(
        "kms-endpoint-url",
        "Endpoint of the KMS that `check` asks whether --s3-sse-kms-key-id is usable (else AWS's).",
        None,
        _url,
        metavar="URL",
    ),
    Option(
        "listen",
        "Address of the /metrics server.",
        "0.0.0.0:9877",
        lambda v: parse_listen(_as_str(v)),
        metavar="HOST:PORT",
    ),
    Option(
        "state-dir",
        "Directory of the durable state DB and the spool.",
        ".archiver-state",
        lambda value: str(inputs.local_path(_as_str(value), "state directory")),
        metavar="DIR",
        scope="state",
    ),
    Option(
        "poll-interval",
        "How often to poll the upstream.",
        "10s",
        _positive(parse_duration),
        metavar="DURATION",
    ),
    Option(
        "retention",
        "How long the upstream keeps an ended session's logs and artifacts.",
        "4h",
        _positive(parse_duration),
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
        _positive(parse_duration),
        metavar="DURATION",
    ),
    Option(
        "on-first-start",
        "On the very first start (new state DB): archive the ended sessions the upstream still holds, or skip them.",
        "archive",
        _as_choice("archive", "skip"),
        metavar="MODE",
    ),
    Option(
        "prune-after",
        "Forget archived sessions in the state DB after this long (the store is the record; at least 2x retention).",
        "7d",
        _positive(parse_duration),
        metavar="DURATION",
    ),
    Option(
        "artifact-path",
        "Absolute path inside every session's container to archive (repeatable).",
        (),
        _as_list,
        multiple=True,
        metavar="PATH",
    ),
    Option(
        "session-label-allowlist",
        "Caller labels exported on sessionhost_session_labels (repeatable or comma-separated).",
        (),
        _as_list,
        multiple=True,
        metavar="KEY",
    ),
    Option(
        "max-sessions",
        "Cap on sessions with per-session series (aggregates stay exact).",
        10000,
        _as_int,
        metavar="N",
    ),
    Option(
        "max-artifact-size",
        "Artifacts larger than this are stopped while streaming and recorded as too_large.",
        "110MB",
        parse_size,
        metavar="SIZE",
    ),
    Option("fetch-workers", "Parallel fetches from the upstream.", 4, _as_int, metavar="N"),
    Option(
        "upload-workers",
        "Parallel uploads to the store (`auto`: sized to the store, 4 for S3, 2 for a directory).",
        "auto",
        _as_workers,
        metavar="N|auto",
    ),
    Option("log-format", "Log line format.", "text", _as_choice("text", "json"), metavar="FORMAT"),
    Option("log-level", "Log level.", "info", _as_choice("debug", "info", "warning", "error"), metavar="LEVEL"),
    Option(
        "web-config-file",
        "Exporter-toolkit web config (TLS, basic auth) for the /metrics server.",
        None,
        _as_str,
        metavar="PATH",
    ),
    Option(
        "shard",
        "This daemon's shard (0..total-shards - 1), or auto: from the StatefulSet pod name in POD_NAME or HOSTNAME.",
        "0",
        _shard_index,
        metavar="I|auto",
    ),
    Option("total-shards", "How many shards split the sessions (by a stable hash of the id).", 1, _as_int, metavar="N"),
    Option(
        "replicas-per-shard",
        "Redundant daemons per shard; with --shard auto, pod ordinal o is shard o // R, replica o % R.",
        1,
        _as_int,
        metavar="R",
    ),
)
OPTIONS_BY_KEY: Mapping[str, Option] = {opt.key: opt for opt in OPTIONS}
#: Option scopes per kind of command: retrieval (ls/show/logs/get/verify), `status`, the daemon's.
STORE_SCOPES = frozenset({"store"})
STATUS_SCOPES = frozenset({"state"})
DAEMON_SCOPES = frozenset({"store", "state", "daemon"})
#: Tables of the TOML file that are not plain options.
_FILE_TABLES = frozenset({"images"})


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything the daemon and the CLI commands need, resolved once (flag > env > file > default)."""

    api_url: str | None = None
    api_token: Token | None = None
    store: str | None = None
    s3_endpoint_url: str | None = None
    s3_checksum: str = "when_supported"
    listen: tuple[str, int] = ("0.0.0.0", 9877)
    state_dir: Path = Path(".archiver-state")
    poll_interval: float = 10.0
    retention: float = 4 * 3600.0
    deadline_margin: float = 600.0
    reconcile_interval: float = 300.0
    on_first_start: str = "archive"
    prune_after: float = 7 * 86400.0
    artifact_paths: tuple[str, ...] = ()
    image_artifact_paths: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    session_label_allowlist: tuple[str, ...] = ()
    max_sessions: int = 10000
    max_artifact_size: int = 110_000_000
    fetch_workers: int = 4
    #: AUTO_WORKERS (0): sized to the store by the pipeline.
    upload_workers: int = AUTO_WORKERS
    log_format: str = "text"
    log_level: str = "info"
    web_config_file: Path | None = None
    #: This daemon's shard and replica (the default owns every session).
    shard: Shard = field(default_factory=Shard)
    replicas_per_shard: int = 1

    #: Encryption, storage class, tags and Object Lock of every archived object (S3 stores only).
    evidence: Evidence = NO_EVIDENCE
    kms_endpoint_url: str | None = None

    def artifact_paths_for(self, image: str) -> tuple[str, ...]:
        """Global paths plus the image's own, without duplicates, in a stable order."""
        extra = self.image_artifact_paths.get(image, ())
        return tuple(dict.fromkeys((*self.artifact_paths, *extra)))

    def require_api(self) -> tuple[str, Token]:
        if not self.api_url:
            raise ConfigError(
                "no upstream configured: set --api-url (or ARCHIVER_API_URL, or api_url in the config file)"
            )
        if self.api_token is None:
            raise ConfigError(f"no API token: set {TOKEN_ENV} or --api-token-file")
        return self.api_url, self.api_token

    def require_store(self) -> str:
        if not self.store:
            raise ConfigError("no store configured: set --store s3://bucket/prefix or file:///dir (or ARCHIVER_STORE)")
        return self.store


def read_config_file(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as handle:
            data = tomllib.load(handle)
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except OSError as exc:
        raise ConfigError(f"config file {path} cannot be read: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config file {path} is not UTF-8 (byte {exc.start}); TOML files are UTF-8") from None
    if "api_token" in data:
        raise ConfigError(f"config file {path}: the token never goes in the config file; use api_token_file")
    for key in data:
        if key not in OPTIONS_BY_KEY and key not in _FILE_TABLES:
            raise ConfigError(f"config file {path}: unknown key {key!r}")
    return data


def _image_paths(raw: Any, source: str) -> dict[str, tuple[str, ...]]:
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: [images] must be a table of image names")
    result: dict[str, tuple[str, ...]] = {}
    for image, table in raw.items():
        if not isinstance(table, dict):
            raise ConfigError(f"{source}: [images.{image!r}] must be a table")
        for key in table:
            if key != "artifact_path":
                raise ConfigError(f"{source}: unknown key {key!r} in [images.{image!r}] (only artifact_path)")
        try:
            result[str(image)] = _check_paths(_as_list(table.get("artifact_path")))
        except ValueError as exc:
            raise ConfigError(f"{source}: images.{image}.artifact_path: {exc}") from None
    return result


def _check_paths(paths: tuple[str, ...]) -> tuple[str, ...]:
    for path in paths:
        inputs.artifact_path(path)
    return paths


def load_settings(
    values: Mapping[str, Any],
    env: Mapping[str, str] | None = None,
    config_file: str | Path | None = None,
) -> Settings:
    """Settings from option values keyed as in OPTIONS (None/empty: not given) over the TOML file, for
    embedding and tests; `env` is read for the token only. The CLI's flags and env vars go through
    click and `build_settings` instead."""
    file_data = read_config_file(Path(config_file)) if config_file else {}
    file_name = str(config_file) if config_file else ""
    raw: dict[str, tuple[Any, str]] = {}
    for opt in OPTIONS:
        value = values.get(opt.key)
        if value is not None and value != ():
            raw[opt.key] = (value, opt.flag)
        elif opt.key in file_data:
            raw[opt.key] = (file_data[opt.key], f"{file_name}: {opt.key}")
    return build_settings(raw, file_data=file_data, file_name=file_name, env=os.environ if env is None else env)


def build_settings(
    raw: Mapping[str, tuple[Any, str]],
    *,
    file_data: Mapping[str, Any],
    file_name: str,
    env: Mapping[str, str],
) -> Settings:
    """Convert and validate the chosen raw values (key → (value, where it came from, for errors));
    options not in `raw` take their default. `file_data` gives the per-image tables; `env` the token."""
    values: dict[str, Any] = {}
    for opt in OPTIONS:
        value, source = raw.get(opt.key, (None, ""))
        if value is None or value == ():
            value, source = opt.default, f"default of {opt.flag}"
            if value is None:
                values[opt.key] = None
                continue
        try:
            values[opt.key] = opt.convert(value)
        except ValueError as exc:
            raise ConfigError(f"{source}: {exc}") from None

    try:
        artifact_paths = _check_paths(values["artifact_path"])
    except ValueError as exc:
        raise ConfigError(f"artifact-path: {exc}") from None
    image_paths = _image_paths(file_data["images"], file_name) if "images" in file_data else {}
    token = _load_token(values["api_token_file"], env)
    for key, low in (("fetch_workers", 1), ("upload_workers", 0)):  # upload_workers 0: auto
        if not low <= values[key] <= MAX_WORKERS:
            flag = OPTIONS_BY_KEY[key].flag
            auto = " (or auto)" if low == 0 else ""
            raise ConfigError(f"{flag} must be between 1 and {MAX_WORKERS}{auto}, got {values[key]}")
    if values["max_sessions"] < 0:
        raise ConfigError(f"--max-sessions must be at least 0, got {values['max_sessions']}")
    if values["deadline_margin"] >= values["retention"]:
        # Fetch deadline = last seen + retention - margin: no fetch could ever meet it.
        raise ConfigError(
            f"--retention ({values['retention']:g}s) must be longer than --deadline-margin "
            f"({values['deadline_margin']:g}s): every fetch deadline would already have passed"
        )
    if values["prune_after"] < 2 * values["retention"]:
        # A pruned row whose session the upstream still lists as ended would be archived again.
        raise ConfigError("prune-after must be at least twice --retention")
    shard = _resolve_shard(values["shard"], values["total_shards"], values["replicas_per_shard"], env)

    evidence = _evidence(values)
    return Settings(
        api_url=values["api_url"],
        api_token=token,
        store=values["store"],
        s3_endpoint_url=values["s3_endpoint_url"],
        s3_checksum=values["s3_checksum"],
        listen=values["listen"],
        state_dir=Path(values["state_dir"]),
        poll_interval=values["poll_interval"],
        retention=values["retention"],
        deadline_margin=values["deadline_margin"],
        reconcile_interval=values["reconcile_interval"],
        on_first_start=values["on_first_start"],
        prune_after=values["prune_after"],
        artifact_paths=artifact_paths,
        image_artifact_paths=image_paths,
        session_label_allowlist=values["session_label_allowlist"],
        max_sessions=values["max_sessions"],
        max_artifact_size=values["max_artifact_size"],
        fetch_workers=values["fetch_workers"],
        upload_workers=values["upload_workers"],
        log_format=values["log_format"],
        log_level=values["log_level"],
        web_config_file=Path(values["web_config_file"]) if values["web_config_file"] else None,
        shard=shard,
        replicas_per_shard=values["replicas_per_shard"],
        evidence=evidence,
        kms_endpoint_url=values["kms_endpoint_url"],
    )


def _resolve_shard(index: int | str, total: int, replicas: int, env: Mapping[str, str]) -> Shard:
    """The daemon's (shard, replica): given, or from the pod name's ordinal with `--shard auto`."""
    if total < 1 or replicas < 1:
        raise ConfigError("total-shards and replicas-per-shard must be at least 1")
    if index == "auto":
        name = pod_name(env)
        if name is None:
            raise ConfigError("--shard auto needs the pod name in POD_NAME or HOSTNAME (e.g. archiver-3)")
        try:
            return shard_from_ordinal(ordinal_from_pod_name(name), total, replicas)
        except ValueError as exc:
            raise ConfigError(f"--shard auto: {exc}") from None
    assert isinstance(index, int)
    if not 0 <= index < total:
        raise ConfigError(f"--shard must be within 0..{total - 1} (--total-shards {total}), got {index}")
    return Shard(index, total, 0)


def _evidence(values: Mapping[str, Any]) -> Evidence:
    """The evidence settings as one validated value (ConfigError naming the options otherwise)."""
    tags: dict[str, str] = {}
    for text in values["s3_object_tag"]:
        key, sep, value = text.partition("=")
        if not sep or not key:
            raise ConfigError(f"s3-object-tag: expected KEY=VALUE, got {text!r}")
        tags[key] = value
    try:
        return Evidence(
            sse=SSE_MODES[values["s3_sse"]],
            kms_key_id=values["s3_sse_kms_key_id"] or None,
            storage_class=values["s3_storage_class"] or None,
            tags=tags,
            lock_mode=LOCK_MODES[values["s3_object_lock_mode"]],
            lock_days=values["s3_object_lock_days"],
        )
    except ValueError as exc:
        raise ConfigError(f"evidence settings (--s3-sse, --s3-storage-class, --s3-object-*): {exc}") from None


def _load_token(token_file: str | None, env: Mapping[str, str]) -> Token | None:
    try:
        if token_file:
            try:
                return Token.from_file(Path(token_file))
            except OSError as exc:
                raise ConfigError(f"--api-token-file {token_file}: {exc.strerror}") from None
        if env.get(TOKEN_ENV):
            return Token(env[TOKEN_ENV])
    except ValueError as exc:
        # The message names the problem, never the value.
        raise ConfigError(f"API token: {exc}") from None
    return None


def option_table(options: Sequence[Option] = OPTIONS) -> list[tuple[str, str, str, str]]:
    """(flag, env var, default, help) rows for the README's configuration table."""
    return [(opt.flag, opt.env, opt.shown_default, opt.help) for opt in options]
