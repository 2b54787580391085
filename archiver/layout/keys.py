"""Object-store key layout of the archive: key-safe session ids, artifact names and key builders (pure)."""

from __future__ import annotations

import hashlib
import math
import re
from datetime import UTC, datetime, timedelta

#: Characters a session id keeps as-is in a key; everything else is percent-encoded.
_PLAIN = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")

#: Longest escaped id used verbatim. With `sessions/` + `/artifacts/` + an artifact name the key
#: stays far below S3's 1024 bytes, and `{sid}.{instance}.json` / `{sid}.{instance}` stay below 255-byte file names.
MAX_ESCAPED_LEN = 150
#: Length of the escaped-id head kept in front of `~` + hash for longer ids.
HASHED_HEAD_LEN = 128
#: Hex digits of sha256(id) after `~` (80 bits: collisions are not a practical concern).
HASH_SUFFIX_LEN = 20

_ESCAPED_RE = re.compile(r"^[A-Za-z0-9_%~-]+$")
_PLAIN_ESCAPED_RE = re.compile(r"^(?:[A-Za-z0-9_-]|%[0-9A-F]{2})+$")
_SLUG_DROP_RE = re.compile(r"[^A-Za-z0-9._-]+")
_SLUG_DASHES_RE = re.compile(r"-{2,}")
_LOG_EXTS = frozenset({"txt", "jsonl"})

#: Longest artifact slug (the hash suffix disambiguates paths that share a truncated slug).
MAX_SLUG_LEN = 60


def _utf8(text: str) -> bytes:
    # Ids come from JSON, which can carry lone surrogates ("\ud800"); keep them encodable.
    return text.encode("utf-8", "surrogatepass")


def escape_session_id(sid: str) -> str:
    """The session id made safe for one key segment or file name, reversibly where possible.

    Every character outside ``[A-Za-z0-9_-]`` is percent-encoded as the uppercase ``%XX`` of its
    UTF-8 bytes, so ``.`` (and thus a leading dot, ``.`` and ``..``), ``/``, ``%``, ``~``, control
    characters and unicode can never form a path component or escape a prefix.

    When the escaped form is longer than ``MAX_ESCAPED_LEN`` (150) characters (ids may be 500
    unicode characters, about 4,500 escaped), the result is ``escaped[:128] + "~" +
    sha256(utf8(sid)).hexdigest()[:20]``. ``~`` is itself escaped in the plain form, so a hashed
    form never equals any plain form. Hashed forms are NOT reversible: the manifest stored under
    the key carries the real ``session_id``, which is how such ids round-trip (read the manifest,
    not the key). :func:`unescape_session_id` refuses them.

    Raises ``ValueError`` for an empty id.
    """
    if not sid:
        raise ValueError("session id must not be empty")
    escaped = "".join(ch if ch in _PLAIN else "".join(f"%{b:02X}" for b in _utf8(ch)) for ch in sid)
    if len(escaped) <= MAX_ESCAPED_LEN:
        return escaped
    digest = hashlib.sha256(_utf8(sid)).hexdigest()[:HASH_SUFFIX_LEN]
    return f"{escaped[:HASHED_HEAD_LEN]}~{digest}"


def is_hashed_session_id(escaped: str) -> bool:
    """Whether an escaped id is the shortened, non-reversible form (read the manifest instead)."""
    return "~" in escaped


def unescape_session_id(escaped: str) -> str:
    """The session id of a plain (not hashed) escaped form; ``ValueError`` for anything else.

    Only canonical forms are accepted (uppercase hex, nothing encoded that need not be), so every
    key maps to exactly one id and back.
    """
    if is_hashed_session_id(escaped):
        raise ValueError(
            f"escaped session id {escaped[:40]!r}… is a shortened (hashed) form; read the session id from its manifest"
        )
    if not _PLAIN_ESCAPED_RE.match(escaped):
        raise ValueError(f"not an escaped session id: {escaped[:60]!r}")
    raw = bytearray()
    i = 0
    while i < len(escaped):
        if escaped[i] == "%":
            raw.append(int(escaped[i + 1 : i + 3], 16))
            i += 3
        else:
            raw += escaped[i].encode("ascii")
            i += 1
    try:
        sid = raw.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError as exc:
        raise ValueError(f"escaped session id {escaped[:60]!r} is not UTF-8") from exc
    if escape_session_id(sid) != escaped:
        raise ValueError(f"not the canonical escaped form of a session id: {escaped[:60]!r}")
    return sid


def artifact_slug(path: str) -> str:
    """A readable, key-safe slug of an artifact path.

    ``/srv/replays/match.replay`` → ``srv-replays-match.replay``.

    Separators and runs of other characters become ``-``; only ``[A-Za-z0-9._-]`` remains. Long
    slugs keep their last ``MAX_SLUG_LEN`` characters (the file name is the informative end).
    Never empty, never starts with ``.`` or ``-``.
    """
    slug = _SLUG_DASHES_RE.sub("-", _SLUG_DROP_RE.sub("-", path))
    slug = slug[-MAX_SLUG_LEN:].lstrip(".-").rstrip("-")
    return slug or "artifact"


def artifact_name(path: str) -> str:
    """The object name of an artifact path: ``{slug}-{sha256(path)[:8]}.tar.gz`` (one path, one name)."""
    digest = hashlib.sha256(_utf8(path)).hexdigest()[:8]
    return f"{artifact_slug(path)}-{digest}.tar.gz"


def check_prefix(prefix: str) -> str:
    """The prefix itself if it is ``""`` or ends with (and does not start with) ``/``; else ``ValueError``."""
    if prefix and (not prefix.endswith("/") or prefix.startswith("/")):
        raise ValueError(f"key prefix must be empty or end with '/' (and not start with one): {prefix!r}")
    return prefix


#: ``YYYYMMDDTHHMMSS.mmmZ``: the shape of an instance name (validated further by a round trip).
_INSTANCE_RE = re.compile(r"([0-9]{8}T[0-9]{6}\.[0-9]{3}Z)(?:-r([1-9][0-9]{0,5}))?")
#: 9999-12-31T23:59:59.999Z in epoch milliseconds: the last instant an instance name can carry.
_LATEST_MS = 253402300799999
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def instance_name(created_ms: float, revision: int = 0) -> str:
    """The instance of a session: its upstream creation time as UTC ``YYYYMMDDTHHMMSS.mmmZ``.

    Session ids are chosen by the caller and may be reused; the creation time tells two sessions
    with one id apart, and the name sorts chronologically. ``created_ms`` (epoch milliseconds) is
    floored to a whole millisecond. ``ValueError`` outside the years 1970..9999 (and for NaN,
    infinities and booleans). A session listed again after it was taken for ended is archived
    again under ``-r{revision}`` (1, 2, ...) appended to the same time.
    """
    if not 0 <= revision <= 999_999:
        raise ValueError(f"instance revision must be within 0..999999, got {revision!r}")
    if isinstance(created_ms, bool) or not math.isfinite(created_ms):
        raise ValueError(f"creation time must be finite epoch milliseconds, got {created_ms!r}")
    ms = math.floor(created_ms)
    if not 0 <= ms <= _LATEST_MS:
        raise ValueError(f"creation time must be between 1970 and 9999, got {created_ms!r} ms")
    when = _EPOCH + timedelta(milliseconds=ms)
    name = f"{when:%Y%m%dT%H%M%S}.{ms % 1000:03d}Z"
    return name if revision == 0 else f"{name}-r{revision}"


def instance_ms(name: str) -> int:
    """The epoch milliseconds an instance name stands for (``ValueError`` for anything else)."""
    match = _INSTANCE_RE.fullmatch(name) if isinstance(name, str) else None
    if match is None:
        raise ValueError(f"not an instance name (like 20261122T060305.123Z): {str(name)[:60]!r}")
    try:
        # Plain int fields, not strptime: its lenient field widths and lazy import in threads are not needed.
        when = datetime(
            int(name[0:4]),
            int(name[4:6]),
            int(name[6:8]),
            int(name[9:11]),
            int(name[11:13]),
            int(name[13:15]),
            tzinfo=UTC,
        )
    except ValueError:
        raise ValueError(f"not an instance name (no such date or time): {name!r}") from None
    if when.year < 1970:
        raise ValueError(f"not an instance name (before 1970): {name!r}")
    return (when - _EPOCH) // timedelta(milliseconds=1) + int(name[16:19])


def instance_revision(name: str) -> int:
    """The re-open revision of an instance name (0 without a ``-rN`` suffix; ``ValueError`` for non-names)."""
    match = _INSTANCE_RE.fullmatch(name)
    if match is None:
        raise ValueError(f"not an instance name (like 20261122T060305.123Z): {name[:60]!r}")
    return int(match.group(2) or 0)


def instance_order(name: str) -> tuple[int, int]:
    """Sort key of instance names, oldest first: creation time, then revision."""
    return instance_ms(name), instance_revision(name)


def is_instance_name(text: object) -> bool:
    """Whether ``text`` is exactly what :func:`instance_name` produces for some time (one name, one time)."""
    try:
        return isinstance(text, str) and instance_name(instance_ms(text), instance_revision(text)) == text
    except ValueError:
        return False


def _check_instance(instance: str | None) -> str | None:
    if instance is not None and not is_instance_name(instance):
        raise ValueError(f"not an instance name (like 20261122T060305.123Z): {str(instance)[:60]!r}")
    return instance


def session_prefix(prefix: str, sid: str, instance: str | None = None) -> str:
    """``{prefix}sessions/{sid}/{instance}/``: everything of one session instance lives below it.

    Without ``instance`` the legacy layout ``{prefix}sessions/{sid}/`` (one archive per id, as
    written before instances existed). An instance segment never equals ``manifest.json``,
    ``logs.*`` or ``artifacts``, so both layouts can share one id's directory without clashing.
    """
    base = f"{check_prefix(prefix)}sessions/{escape_session_id(sid)}/"
    return base if _check_instance(instance) is None else f"{base}{instance}/"


def manifest_key(prefix: str, sid: str, instance: str | None = None) -> str:
    """``{prefix}sessions/{sid}/[{instance}/]manifest.json``: written last, the archive's commit marker."""
    return session_prefix(prefix, sid, instance) + "manifest.json"


def logs_key(prefix: str, sid: str, ext: str, instance: str | None = None) -> str:
    """``{prefix}sessions/{sid}/[{instance}/]logs.{ext}.gz`` for ``ext`` ``txt`` or ``jsonl``."""
    _check_log_ext(ext)
    return session_prefix(prefix, sid, instance) + f"logs.{ext}.gz"


def live_logs_key(prefix: str, sid: str, ext: str, segment: int, instance: str | None = None) -> str:
    """``{prefix}sessions/{sid}/[{instance}/]logs.live-{segment}.{ext}.gz``: a live capture kept
    beside the logs read after the end (it differs from them), one per segment of the capture."""
    if not 0 <= segment <= 999:
        raise ValueError(f"capture segment must be within 0..999, got {segment!r}")
    _check_log_ext(ext)
    return session_prefix(prefix, sid, instance) + f"logs.live-{segment}.{ext}.gz"


def _check_log_ext(ext: str) -> None:
    if ext not in _LOG_EXTS:
        raise ValueError(f"log extension must be one of {sorted(_LOG_EXTS)}, got {ext!r}")


def artifact_key(prefix: str, sid: str, path: str, instance: str | None = None) -> str:
    """``{prefix}sessions/{sid}/[{instance}/]artifacts/{slug}-{hash8}.tar.gz`` for one artifact path."""
    return session_prefix(prefix, sid, instance) + "artifacts/" + artifact_name(path)


def _hour_partition(prefix: str, hour: datetime) -> str:
    return f"{prefix}index/dt={hour:%Y-%m-%d}/hour={hour:%H}/"


def _utc_hour(epoch_seconds: float) -> datetime:
    return datetime.fromtimestamp(epoch_seconds, UTC).replace(minute=0, second=0, microsecond=0)


def index_key(prefix: str, ended_at: float, sid: str, instance: str | None = None) -> str:
    """``{prefix}index/dt=YYYY-MM-DD/hour=HH/{sid}[.{instance}].json``, the hour (UTC) of ``ended_at`` (epoch seconds).

    The escaped id never contains ``.``, so the first ``.`` of the file name ends the id and two
    instances of one id (or an instance and the legacy archive) never share an entry.
    """
    check_prefix(prefix)
    name = escape_session_id(sid) if _check_instance(instance) is None else f"{escape_session_id(sid)}.{instance}"
    return _hour_partition(prefix, _utc_hour(ended_at)) + f"{name}.json"


#: One hour in seconds, the index partition width.
_HOUR = 3600


def index_partitions(prefix: str, since: float, until: float) -> list[str]:
    """The index hour-partition prefixes (UTC) covering ``[since, until]`` (epoch seconds), oldest first.

    Retrieval lists only these instead of the whole index. Empty when ``since > until``.
    """
    check_prefix(prefix)
    if since > until:
        return []
    start = int(_utc_hour(since).timestamp())
    end = int(_utc_hour(until).timestamp())
    return [_hour_partition(prefix, datetime.fromtimestamp(t, UTC)) for t in range(start, end + 1, _HOUR)]


def is_key_safe(escaped: str) -> bool:
    """Whether a string has the shape every escaped id has (used by tests and defensive checks)."""
    return bool(_ESCAPED_RE.match(escaped)) and len(escaped) <= MAX_ESCAPED_LEN


# --- the player index ---------------------------------------------------------------------------

#: Characters of the time stamp that opens a player index entry's name (``YYYYMMDDTHHMMSS.mmmZ``).
_STAMP_LEN = 20


def player_prefix(prefix: str, player: str) -> str:
    """``{prefix}players/{player}/``: the index entries of one player id, escaped like a session id.

    Player ids come from the upstream as freely as session ids do, so they get the same key-safe
    form (:func:`escape_session_id`; ``ValueError`` for an empty id).
    """
    return f"{check_prefix(prefix)}players/{escape_session_id(player)}/"


def player_key(prefix: str, player: str, ended_at: float, sid: str, instance: str | None = None) -> str:
    """``{prefix}players/{player}/{ended}.{sid}[.{instance}].json``: one archive a player took part in.

    ``ended`` is the archive's end time (epoch seconds, UTC, as ``YYYYMMDDTHHMMSS.mmmZ``), so one
    player's entries list oldest first and ``--since`` becomes a ``StartAfter``
    (:func:`player_start_after`): listing costs requests in proportion to the matches, not to the
    sessions archived. The escaped ids never contain ``.``, so the name splits unambiguously.
    """
    name = escape_session_id(sid) if _check_instance(instance) is None else f"{escape_session_id(sid)}.{instance}"
    return player_prefix(prefix, player) + f"{instance_name(ended_at * 1000)}.{name}.json"


def player_start_after(prefix: str, player: str, since: float) -> str:
    """The key every entry of ``player`` that ended at or after ``since`` sorts after (S3 ``StartAfter``).

    Entries in the same millisecond as ``since`` but before it are listed too: the caller filters
    on the exact end time.
    """
    return player_prefix(prefix, player) + instance_name(since * 1000)


def player_entry_ms(name: str) -> int | None:
    """The end time (epoch ms) a player index entry's file name opens with; ``None`` for other names."""
    try:
        return instance_ms(name[:_STAMP_LEN])
    except ValueError:
        return None


#: A transparency log writer's name (its key segment): lowercase letters, digits, '-', '.'.
_LOG_WRITER = re.compile(r"^[a-z0-9][a-z0-9.-]{0,62}$")


def check_log_writer(writer: str) -> str:
    if not _LOG_WRITER.match(writer):
        raise ValueError(f"not a log writer name (lowercase letters, digits, '-', '.'): {writer[:60]!r}")
    return writer


def logs_root(prefix: str) -> str:
    """``{prefix}log/``: every writer's transparency log lives below it (archiver/tlog)."""
    return f"{check_prefix(prefix)}log/"


def log_prefix(prefix: str, writer: str) -> str:
    """``{prefix}log/{writer}/``: one writer's log in the C2SP tlog-tiles layout (``checkpoint``,
    ``tile/<L>/<N>[.p/<W>]``, ``tile/entries/<N>[.p/<W>]``)."""
    return f"{logs_root(prefix)}{check_log_writer(writer)}/"


def log_writers_root(prefix: str) -> str:
    """``{prefix}log-writers/``: one small object per log, named after its writer (how readers find the
    logs without listing their tiles, and without relying on a store listing keys in order)."""
    return f"{check_prefix(prefix)}log-writers/"


def log_writer_key(prefix: str, writer: str) -> str:
    return f"{log_writers_root(prefix)}{check_log_writer(writer)}"


def log_locator_key(prefix: str, sid: str, instance: str | None = None) -> str:
    """``{prefix}log-locators/{sid}/{instance|legacy}.json``: which log holds an archive's leaf, at which
    index, since when (written once after the checkpoint; a finding aid, not evidence: a bundle's
    proof verifies without it)."""
    return f"{check_prefix(prefix)}log-locators/{escape_session_id(sid)}/{_check_instance(instance) or 'legacy'}.json"


def witness_prefix(prefix: str, writer: str) -> str:
    """``{prefix}witness/{writer}/``: in a witness store, the copies of one log's checkpoints."""
    return f"{check_prefix(prefix)}witness/{check_log_writer(writer)}/"


def witness_key(prefix: str, writer: str, size: int) -> str:
    """``{prefix}witness/{writer}/{size, 20 digits}``: one checkpoint copy (create-once; sorted by size)."""
    return f"{witness_prefix(prefix, writer)}{size:020d}"
