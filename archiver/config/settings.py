"""The configuration's values: which value given for each option of the table (`archiver.config.options`)
wins, its conversion, the checks across options, and the frozen Settings they make (every default
comes from the table).

Where each raw value came from is click's business: archiver.cli declares every option (and each
deprecated alias) with its env var, gives the TOML file to click as its `default_map`, and hands
every value given, with its origin, to `build_settings`. `load_settings` does the same from a
mapping and a file, for embedding and tests.
"""

from __future__ import annotations

import enum
import logging
import os
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from archiver.config import inputs
from archiver.config.command_options import COMMAND_OPTIONS
from archiver.config.credentials import Token
from archiver.config.evidence import LOCK_MODES, SSE_MODES, Evidence
from archiver.config.option import Alias, Option, by_key
from archiver.config.options import OPTIONS, OPTIONS_BY_KEY
from archiver.config.sharding import Shard, ordinal_from_pod_name, pod_name, shard_from_ordinal
from archiver.config.values import MAX_WORKERS, as_list
from archiver.errors import ConfigError

TOKEN_ENV = "ARCHIVER_API_TOKEN"
#: Tables of the TOML file that are not plain options.
_FILE_TABLES = frozenset({"images"})
#: Settings fields several options (or an option and the environment) make together; every other
#: field is one option's converted value.
COMPOSED: Final = frozenset({"api_token", "shard", "evidence"})

#: The logger of the deprecation lines (archiver.cli keeps them until logging is configured).
SETTINGS_LOGGER = "archiver.config.settings"
log = logging.getLogger(SETTINGS_LOGGER)


class Origin(enum.IntEnum):
    """Where a given value came from; a higher one wins."""

    FILE = 1
    ENV = 2
    FLAG = 3


@dataclass(frozen=True, slots=True)
class Given:
    """One raw value given for an option: under its own spelling, or a deprecated ``alias``."""

    value: Any
    origin: Origin
    alias: Alias | None = None

    def spelled(self, opt: Option, file_name: str) -> str:
        """The flag, env var or ``file: key`` the value was given as (what errors name)."""
        spelling = self.alias or opt
        if self.origin is Origin.FLAG:
            return str(spelling.flag)
        if self.origin is Origin.ENV:
            return str(spelling.env)
        return f"{file_name}: {spelling.key}"

    def replacement(self, opt: Option) -> str:
        """What to write instead of a deprecated spelling."""
        return {Origin.FLAG: opt.flag, Origin.ENV: opt.env, Origin.FILE: opt.key}[self.origin]


def convert_values(
    raw: Mapping[str, Sequence[Given]], *, file_name: str, options: Iterable[Option] = OPTIONS
) -> dict[str, Any]:
    """Each option's converted value (keyed by its key): of the values given (None or empty: not
    given), the one from the highest origin (flag > env > file, the option's own name before an
    alias), else the table's default. A ConfigError names where a bad value came from; every
    deprecated alias given logs one warning."""
    values: dict[str, Any] = {}
    for opt in options:
        given = [g for g in raw.get(opt.key, ()) if g.value is not None and g.value != ()]
        for old in given:
            if old.alias is not None:
                log.warning(
                    "%s is deprecated and will be removed in a future release: use %s instead",
                    old.spelled(opt, file_name),
                    old.replacement(opt),
                )
        if given:
            chosen = max(given, key=lambda g: (g.origin, g.alias is None))
            value, source = chosen.value, chosen.spelled(opt, file_name)
        elif opt.default is None:
            values[opt.key] = None
            continue
        else:
            value, source = opt.default, f"default of {opt.flag}"
        try:
            values[opt.key] = opt.convert(value)
        except ValueError as exc:
            raise ConfigError(f"{source}: {exc}") from None
    return values


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
            result[str(image)] = _check_paths(as_list(table.get("artifact_path")))
        except ValueError as exc:
            raise ConfigError(f"{source}: images.{image}.artifact_path: {exc}") from None
    return result


def _check_paths(paths: tuple[str, ...]) -> tuple[str, ...]:
    for path in paths:
        inputs.artifact_path(path)
    return paths


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


def _fields(
    values: Mapping[str, Any], *, file_data: Mapping[str, Any], file_name: str, env: Mapping[str, str]
) -> dict[str, Any]:
    """The Settings fields from the converted option values, after the checks across options: each
    option's own field, the COMPOSED ones, and the per-image paths of the file."""
    try:
        _check_paths(values["artifact_path"])
    except ValueError as exc:
        raise ConfigError(f"artifact-path: {exc}") from None
    image_paths = _image_paths(file_data["images"], file_name) if "images" in file_data else {}
    token = _load_token(values["api_token_file"], env)
    for key, low in (("fetch_workers", 1), ("upload_workers", 0)):  # upload_workers 0: auto
        if not low <= values[key] <= MAX_WORKERS:
            flag = OPTIONS_BY_KEY[key].flag
            auto = " (or auto)" if low == 0 else ""
            raise ConfigError(f"{flag} must be between 1 and {MAX_WORKERS}{auto}, got {values[key]}")
    if values["follow_logs_max"] < 0:
        raise ConfigError(f"--follow-logs-max must be at least 0, got {values['follow_logs_max']}")
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
    fields = {opt.field: values[opt.key] for opt in OPTIONS if opt.field not in COMPOSED}
    composed = {"api_token": token, "shard": shard, "evidence": _evidence(values)}
    return {**fields, **composed, "image_artifact_paths": image_paths}


#: Every field's default: what the table's defaults make (no env, no file).
_DEFAULTS: Final[Mapping[str, Any]] = _fields(convert_values({}, file_name=""), file_data={}, file_name="", env={})


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything the daemon and the CLI commands need, resolved once (flag > env > file > default).

    Each field's default is what the option table's defaults make (`_DEFAULTS`): a new option is
    one table entry and one field here, ``name: type = _DEFAULTS["name"]``."""

    api_url: str | None = _DEFAULTS["api_url"]
    api_token: Token | None = _DEFAULTS["api_token"]
    store: str | None = _DEFAULTS["store"]
    s3_endpoint_url: str | None = _DEFAULTS["s3_endpoint_url"]
    s3_checksum: str = _DEFAULTS["s3_checksum"]
    listen: tuple[str, int] = _DEFAULTS["listen"]
    state_dir: Path = _DEFAULTS["state_dir"]
    poll_interval: float = _DEFAULTS["poll_interval"]
    retention: float = _DEFAULTS["retention"]
    deadline_margin: float = _DEFAULTS["deadline_margin"]
    reconcile_interval: float = _DEFAULTS["reconcile_interval"]
    index_compact_interval: float = _DEFAULTS["index_compact_interval"]
    on_first_start: str = _DEFAULTS["on_first_start"]
    prune_after: float = _DEFAULTS["prune_after"]
    artifact_paths: tuple[str, ...] = _DEFAULTS["artifact_paths"]
    #: From the file's ``[images."name"]`` tables only.
    image_artifact_paths: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    session_label_allowlist: tuple[str, ...] = _DEFAULTS["session_label_allowlist"]
    max_sessions: int = _DEFAULTS["max_sessions"]
    max_artifact_size: int = _DEFAULTS["max_artifact_size"]
    #: Live capture of running sessions' logs (`archiver.live`), and its per-daemon cap.
    follow_logs: bool = _DEFAULTS["follow_logs"]
    follow_logs_max: int = _DEFAULTS["follow_logs_max"]
    follow_logs_first_byte_timeout: float = _DEFAULTS["follow_logs_first_byte_timeout"]
    follow_logs_scratch_dir: Path | None = _DEFAULTS["follow_logs_scratch_dir"]
    follow_logs_scratch_size: int = _DEFAULTS["follow_logs_scratch_size"]
    follow_logs_seal_sync_delay: float = _DEFAULTS["follow_logs_seal_sync_delay"]
    fetch_workers: int = _DEFAULTS["fetch_workers"]
    #: AUTO_WORKERS (0): sized to the store by the pipeline.
    upload_workers: int = _DEFAULTS["upload_workers"]
    log_format: str = _DEFAULTS["log_format"]
    log_level: str = _DEFAULTS["log_level"]
    web_config_file: Path | None = _DEFAULTS["web_config_file"]
    tlog_key_file: Path | None = _DEFAULTS["tlog_key_file"]
    tlog_interval: float = _DEFAULTS["tlog_interval"]
    tlog_witness_store: str | None = _DEFAULTS["tlog_witness_store"]
    tlog_tsa_url: str | None = _DEFAULTS["tlog_tsa_url"]
    #: This daemon's shard and replica (the default owns every session).
    shard: Shard = _DEFAULTS["shard"]
    replicas_per_shard: int = _DEFAULTS["replicas_per_shard"]

    #: Encryption, storage class, tags and Object Lock of every archived object (S3 stores only).
    evidence: Evidence = _DEFAULTS["evidence"]
    kms_endpoint_url: str | None = _DEFAULTS["kms_endpoint_url"]

    def artifact_paths_for(self, image: str) -> tuple[str, ...]:
        """Global paths plus the image's own, without duplicates, in a stable order."""
        extra = self.image_artifact_paths.get(image, ())
        return tuple(dict.fromkeys((*self.artifact_paths, *extra)))

    @property
    def follow_cap(self) -> int:
        """Most follow streams the daemon's live capture may hold: `follow_logs_max` when live capture
        runs (`follow_logs`, a store and an upstream: the archive pipeline's condition), else 0."""
        if self.follow_logs and self.store and self.api_url and self.api_token is not None:
            return self.follow_logs_max
        return 0

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


def read_config_file(path: Path, options: Iterable[Option] = OPTIONS) -> dict[str, Any]:
    """The TOML file's tables and values (of `options`' keys and their aliases' only)."""
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
    known = by_key(options)
    for key, value in data.items():
        if key in COMMAND_OPTIONS:
            _check_command_table(path, key, value)
        elif key not in known and key not in _FILE_TABLES:
            raise ConfigError(f"config file {path}: unknown key {key!r}")
    return data


def _check_command_table(path: Path, command: str, table: Any) -> None:
    """A ``[command]`` table of the file holds only that command's own options' keys."""
    if not isinstance(table, dict):
        raise ConfigError(f"config file {path}: [{command}] must be a table of {command}'s options")
    known = by_key(COMMAND_OPTIONS[command])
    for key in table:
        if key not in known:
            raise ConfigError(f"config file {path}: unknown key {key!r} in [{command}]")


def load_settings(
    values: Mapping[str, Any],
    env: Mapping[str, str] | None = None,
    config_file: str | Path | None = None,
) -> Settings:
    """Settings from option values keyed as in OPTIONS (None/empty: not given) over the TOML file, for
    embedding and tests; `env` is read for the token and the pod name only. The CLI's flags and env vars go through
    click and `build_settings` instead."""
    file_data = read_config_file(Path(config_file)) if config_file else {}
    raw: dict[str, list[Given]] = {}
    spelled = by_key(OPTIONS)
    for key, value in file_data.items():
        if key in spelled:
            opt, alias = spelled[key]
            raw.setdefault(opt.key, []).append(Given(value, Origin.FILE, alias))
    for opt in OPTIONS:
        raw.setdefault(opt.key, []).append(Given(values.get(opt.key), Origin.FLAG))
    file_name = str(config_file) if config_file else ""
    return build_settings(raw, file_data=file_data, file_name=file_name, env=os.environ if env is None else env)


def build_settings(
    raw: Mapping[str, Sequence[Given]],
    *,
    file_data: Mapping[str, Any],
    file_name: str,
    env: Mapping[str, str],
) -> Settings:
    """Convert and check the values given (option key → every value given for it, see Given);
    options without one take their default. `file_data` gives the per-image tables; `env` the token
    and the pod name."""
    values = convert_values(raw, file_name=file_name)
    return Settings(**_fields(values, file_data=file_data, file_name=file_name, env=env))
