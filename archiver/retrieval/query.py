"""Finding archives: the user's time, label and grep filters, the index listing, manifests, item keys re-derived."""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime

from archiver.config.values import parse_duration
from archiver.errors import (
    ArchiveIntegrityError,
    ManifestError,
    ObjectNotFoundError,
    SessionNotArchivedError,
)
from archiver.index import reader as index_reader
from archiver.index.engine import PartFiles
from archiver.layout import keys
from archiver.layout.codec import iso_utc
from archiver.layout.manifest import LATEST_TIME, IndexEntry, Manifest, ManifestItem, parse_index_entry, parse_manifest
from archiver.retrieval.pattern import Pattern, compile_pattern
from archiver.store.base import ObjectStore
from archiver.textsafe import printable

#: `ls` looks back this far when no --since is given.
DEFAULT_SINCE = 24 * 3600.0
#: Parallel store requests of one command (S3 latency, not bandwidth, bounds `ls` and `verify`).
DEFAULT_WORKERS = 16
#: How much decompressed log text is looked at to recognise its shape.
SNIFF_BYTES = 64

Progress = Callable[[int], None]
Warn = Callable[[str], None]


def stderr_warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)


def stderr_note(message: str) -> None:
    print(f"note: {message}", file=sys.stderr)


def quiet(_message: str) -> None:
    """A warn/note sink for internal re-reads whose messages were already given once."""


# --- user input -------------------------------------------------------------------------------


def parse_time(value: str, now: float) -> float:
    """Epoch seconds from ``2h``/``30m``/``7d``/``1h30m`` (that long before ``now``) or an ISO 8601 time,
    between 1970 and 9999 (the index is partitioned by UTC hour; nothing was archived outside that)."""
    try:
        when = _parse_time(value, now)
    except OverflowError:
        when = math.inf
    if not 0 <= when <= LATEST_TIME:
        raise ValueError(f"time out of range: {value!r} (archives are between 1970 and 9999)")
    return when


def _parse_time(value: str, now: float) -> float:
    """Epoch seconds from ``2h``/``30m``/``7d``/``1h30m`` (that long before ``now``) or an ISO 8601 time.

    ISO forms: ``2026-11-22``, ``2026-11-22T10:00``, ``2026-11-22 10:00:05``, with or without
    ``Z`` or an offset (``+02:00``); a time without zone is UTC. ``now`` itself is accepted too.
    ``ValueError`` with an example of each form otherwise.
    """
    text = value.strip()
    if text.lower() == "now":
        return now
    if re.fullmatch(r"\d{4}-\d{2}-\d{2}([T ].*)?", text):
        iso = text[:-1] + "+00:00" if text[-1:] in ("Z", "z") else text
        try:
            stamp = datetime.fromisoformat(iso)
        except ValueError:
            raise ValueError(
                f"not a valid ISO 8601 time: {value!r} (e.g. 2026-11-22T10:00 or 2026-11-22T10:00:00+01:00)"
            ) from None
        if stamp.tzinfo is None:
            stamp = stamp.replace(tzinfo=UTC)
        return stamp.timestamp()
    try:
        return now - parse_duration(text, limit=math.inf)  # parse_time bounds the time
    except ValueError:
        raise ValueError(
            f"not a time: {value!r} (use a duration before now like 2h, 30m, 7d, "
            "or an ISO 8601 time like 2026-11-22T10:00, UTC unless it has Z or an offset)"
        ) from None


def parse_time_range(since: str | None, until: str | None, now: float) -> tuple[float, float | None]:
    """``(since, until)`` from the --since/--until texts; since defaults to 24 h ago, until to open-ended."""
    start = parse_time(since, now) if since else now - DEFAULT_SINCE
    end = parse_time(until, now) if until else None
    if end is not None and start > end:
        raise ValueError(f"--since ({iso_utc(start)}) is after --until ({iso_utc(end)})")
    return start, end


def parse_label(value: str) -> tuple[str, str]:
    """``key=value`` (the value may contain ``=``); ``ValueError`` without ``=`` or with an empty key."""
    key, sep, label_value = value.partition("=")
    if not sep or not key:
        raise ValueError(f"expected a label as KEY=VALUE, got {value!r}")
    return key, label_value


def compile_grep(pattern: str, *, ignore_case: bool = False) -> Pattern:
    """The --grep pattern: an RE2 regular expression searched anywhere in the line (like ``grep -E``).

    ``PatternError`` (a ``ValueError``) naming the problem for an invalid pattern or one RE2 cannot
    run (`retrieval/pattern.py`). Quote literal dots (``\\.``); most plain words are their own regex.
    """
    return compile_pattern(pattern, ignore_case=ignore_case)


# --- safe text for terminals -------------------------------------------------------------------


def _image_matches(entry: IndexEntry, image: str) -> bool:
    # Compared as whole strings, never parsed: image names may hold ':' (registry:5000/game).
    return image in (entry.image, f"{entry.image}:{entry.tag}")


def _matches(
    entry: IndexEntry,
    since: float,
    until: float | None,
    image: str | None,
    location: str | None,
    labels: Mapping[str, str],
) -> bool:
    if entry.ended_at < since or (until is not None and entry.ended_at > until):
        return False
    if image is not None and not _image_matches(entry, image):
        return False
    if location is not None and entry.location != location:
        return False
    return all(entry.labels.get(k) == v for k, v in labels.items())


def _read_small(store: ObjectStore, key: str) -> bytes:
    return b"".join(store.iter_bytes(key))


def _chunks(items: Sequence[str], size: int) -> Iterator[Sequence[str]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def fetch_entry(store: ObjectStore, key: str, warn: Warn) -> IndexEntry | None:
    """The index entry at ``key``; ``None`` (and a warning when unreadable) instead of an error, as
    `ls` and `verify` skip it."""
    try:
        return parse_index_entry(_read_small(store, key))
    except ObjectNotFoundError:
        return None  # removed between the listing and the read
    except ManifestError as exc:
        warn(f"skipping unreadable index entry {printable(key)}: {exc}")
        return None


def list_sessions(
    store: ObjectStore,
    *,
    since: float | None = None,
    until: float | None = None,
    image: str | None = None,
    location: str | None = None,
    labels: Mapping[str, str] | None = None,
    limit: int | None = None,
    now: float,
    warn: Warn = stderr_warn,
    workers: int = DEFAULT_WORKERS,
    player: str | None = None,
    use_index: bool = True,
) -> list[IndexEntry]:
    """Archived sessions that ended in ``[since, until]``, newest first, filtered; at most ``limit``.

    Only the index hour partitions of the range are listed (``keys.index_partitions``), never
    the bucket, newest partition first; with a ``limit`` the walk stops once enough entries are
    found, because every entry of an older partition ended before any entry of a newer one.
    ``since`` defaults to 24 h before ``now``; without ``until`` the range is open towards the
    future (a writer's clock a little ahead of ours must not hide sessions). ``image`` matches
    ``NAME`` or ``NAME:TAG``; ``labels`` must all match exactly. An index entry that cannot be
    read or parsed is reported through ``warn`` and skipped: one bad entry must not hide the rest.
    With ``player`` the player index is read instead (:func:`list_player_sessions`). The hours the
    columnar index covers are read from its parts (``use_index``; ``archiver.index.reader``), the
    others from their JSON entries: the same result as reading every entry.
    """
    start = now - DEFAULT_SINCE if since is None else since
    wanted = dict(labels or {})
    if player is not None:
        found = list_player_sessions(store, player, since=start, until=until, warn=warn, workers=workers)
        found = [e for e in found if _matches(e, start, until, image, location, wanted)]
        return found if limit is None else found[:limit]
    last = max(now, start) if until is None else until
    found = []
    if use_index:
        # Hours the columnar index covers are read from its parts; only the others from JSON entries.
        plan = index_reader.plan(store, start, last, now=now)
        files = PartFiles(store)
        found = index_reader.session_entries(
            plan.files(files),
            since=start,
            until=until,
            image=image,
            location=location,
            labels=wanted,
            limit=limit,
        )
        hours = list(reversed(plan.json_hours))
        in_parts = plan.in_parts(files, store.prefix)
    else:
        hours = [(p, 0) for p in reversed(keys.index_partitions(store.prefix, start, last))]
        in_parts = frozenset()
    partitions = [p for p, _ in hours]
    starts = dict(hours)

    def list_partition(partition: str) -> list[str]:
        # Only `{sid}.json` directly inside the partition is an entry; one a part holds was read from it.
        listed = store.list_keys(partition)
        return [k for k in listed if k.endswith(".json") and "/" not in k[len(partition) :] and k not in in_parts]

    with ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="ls") as pool:
        for batch in _chunks(partitions, max(1, workers)):
            entry_keys = [k for listed in pool.map(list_partition, batch) for k in listed]
            for entry in pool.map(lambda key: fetch_entry(store, key, warn), entry_keys):
                if entry is not None and _matches(entry, start, until, image, location, wanted):
                    found.append(entry)
            # Entries of older partitions ended before this batch's oldest hour began (parts' rows may not).
            oldest = starts[batch[-1]] if use_index else -math.inf
            if limit is not None and sum(1 for e in found if e.ended_at >= oldest) >= limit:
                break
    found.sort(key=lambda e: (-e.ended_at, e.session_id))
    return found if limit is None else found[:limit]


def _player_key_of(prefix: str, player: str, entry: IndexEntry) -> str | None:
    try:
        return keys.player_key(prefix, player, entry.ended_at, entry.session_id, entry.instance)
    except ValueError:
        return None  # an empty session id: no key is its own


def list_player_sessions(
    store: ObjectStore,
    player: str,
    *,
    since: float,
    until: float | None = None,
    warn: Warn = stderr_warn,
    workers: int = DEFAULT_WORKERS,
) -> list[IndexEntry]:
    """Archives ``player`` took part in that ended in ``[since, until]``, newest first, from the player index.

    One listing of ``players/{player}/`` starting after ``since`` (``keys.player_start_after``),
    stopped at the first entry past ``until``, then one read per entry found: the requests grow
    with the player's matches, never with the number of sessions archived. Entries whose session
    id does not match their key name are skipped with a warning (a manifest must not be
    attributed to another session by a planted entry).
    """
    if not player:
        return []
    base = keys.player_prefix(store.prefix, player)
    entry_keys: list[str] = []
    for key in store.list_keys(base, start_after=keys.player_start_after(store.prefix, player, since)):
        name = key[len(base) :]
        ended_ms = keys.player_entry_ms(name)
        if ended_ms is None or "/" in name or not name.endswith(".json"):
            continue
        if until is not None and ended_ms > until * 1000:
            break  # the names sort by end time: nothing later is in range
        entry_keys.append(key)
    found: list[IndexEntry] = []
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(entry_keys) or 1)), thread_name_prefix="ls") as pool:
        for key, entry in zip(entry_keys, pool.map(lambda k: fetch_entry(store, k, warn), entry_keys), strict=True):
            if entry is None or not (since <= entry.ended_at and (until is None or entry.ended_at <= until)):
                continue
            if key != _player_key_of(store.prefix, player, entry):
                warn(f"skipping player index entry {printable(key)}: it describes another session")
                continue
            found.append(entry)
    found.sort(key=lambda e: (-e.ended_at, e.session_id))
    return found


#: What ``--instance`` calls the archive in the legacy layout (written before instances existed).
LEGACY = "legacy"


@dataclass(frozen=True, slots=True)
class ArchiveRef:
    """One archive of a session id: its instance (``None``: the legacy layout) and its manifest key."""

    instance: str | None
    manifest_key: str

    @property
    def name(self) -> str:
        """What ``--instance`` calls this archive: the instance name, or ``legacy``."""
        return LEGACY if self.instance is None else self.instance


def _legacy_created_ms(store: ObjectStore, ref: ArchiveRef) -> float | None:
    """The legacy archive's creation time (epoch ms) for ordering; ``None`` when unknown or unreadable."""
    try:
        created = parse_manifest(_read_small(store, ref.manifest_key)).created
    except (ObjectNotFoundError, ManifestError):
        return None  # reading it for real reports the problem; here it only sorts last
    return None if created is None else created * 1000


def find_archives(store: ObjectStore, sid: str) -> list[ArchiveRef]:
    """Every committed archive of ``sid`` (its manifest exists), newest first; ``[]`` when none.

    Found by listing ``sessions/{escaped sid}/``: ``manifest.json`` right there is the legacy
    archive, ``{instance}/manifest.json`` an instance archive (anything else, such as objects of
    an archive whose manifest is not written yet, is ignored). Instance names sort
    chronologically; the legacy archive's manifest is read for its ``created`` only when it has
    to be placed among instances (unknown ``created``: it sorts last, as it predates them).
    """
    if not sid:
        return []
    base = keys.session_prefix(store.prefix, sid)
    legacy: ArchiveRef | None = None
    named: list[ArchiveRef] = []
    for key in store.list_keys(base):
        rest = key[len(base) :]
        if rest == "manifest.json":
            legacy = ArchiveRef(None, key)
            continue
        instance, sep, name = rest.partition("/")
        if sep and name == "manifest.json" and keys.is_instance_name(instance):
            named.append(ArchiveRef(instance, key))
    named.sort(key=lambda r: keys.instance_order(r.name), reverse=True)
    if legacy is None or not named:
        return named if legacy is None else [legacy]
    created_ms = _legacy_created_ms(store, legacy)
    # On a tie the instance archive counts as the newer one (it was written by a newer archiver).
    position = len(named) if created_ms is None else sum(1 for r in named if keys.instance_ms(r.name) >= created_ms)
    return [*named[:position], legacy, *named[position:]]


@dataclass(frozen=True, slots=True)
class LoadedArchive:
    """One archive of a session, read: which one, its parsed manifest and the manifest's stored bytes."""

    ref: ArchiveRef
    manifest: Manifest
    data: bytes


def load_archive(
    store: ObjectStore, sid: str, instance: str | None = None, *, note: Warn = stderr_note
) -> LoadedArchive:
    """The newest archive of the session, or the one named ``instance`` (an instance name or ``legacy``).

    ``SessionNotArchivedError`` when the id has no archive, or none of that name (the message
    lists the names it has). When the id has several archives and none was named, ``note`` says
    so in one line. ``ManifestError`` when the manifest does not parse; ``ArchiveIntegrityError``
    when it names another session or another instance (tampering or a key collision).
    """
    if not sid:
        raise SessionNotArchivedError("an empty session id is never archived")
    if instance is not None and (instance == LEGACY or keys.is_instance_name(instance)):
        # A named archive is read straight from its key (no listing: `verify --since` does this
        # once per session); only when it is absent does the listing below explain what exists.
        named = None if instance == LEGACY else instance
        direct = ArchiveRef(named, keys.manifest_key(store.prefix, sid, named))
        try:
            return _checked_archive(direct, sid, _read_small(store, direct.manifest_key))
        except ObjectNotFoundError:
            pass
    refs = find_archives(store, sid)
    if not refs:
        raise SessionNotArchivedError(
            f"session {printable(sid)!s} is not archived in {store.url} "
            f"(no manifest under {printable(keys.session_prefix(store.prefix, sid))})"
        )
    names = ", ".join(r.name for r in refs)
    if instance is None:
        ref = refs[0]
        if len(refs) > 1:
            note(
                f"session {printable(sid)} has {len(refs)} archives ({names}); showing the newest; "
                "pick one with --instance"
            )
    else:
        matching = [r for r in refs if r.name == instance]
        if not matching:
            raise SessionNotArchivedError(
                f"session {printable(sid)} has no archive {printable(instance)!r}; its archives: {names}"
            )
        ref = matching[0]
    return _load_ref(store, sid, ref)


def _load_ref(store: ObjectStore, sid: str, ref: ArchiveRef) -> LoadedArchive:
    """Read and check the manifest of the archive ``ref`` of ``sid`` (errors as :func:`load_archive`)."""
    try:
        data = _read_small(store, ref.manifest_key)
    except ObjectNotFoundError:
        raise SessionNotArchivedError(
            f"the archive {ref.name} of session {printable(sid)} is gone from {store.url} "
            f"(no {printable(ref.manifest_key)})"
        ) from None
    return _checked_archive(ref, sid, data)


def _checked_archive(ref: ArchiveRef, sid: str, data: bytes) -> LoadedArchive:
    """The manifest read for ``ref``, parsed and checked to be this session's and this archive's."""
    manifest = parse_manifest(data)
    if manifest.session_id != sid:
        raise ArchiveIntegrityError(
            f"the manifest at {printable(ref.manifest_key)} belongs to session {printable(manifest.session_id)}, "
            f"not {printable(sid)}"
        )
    if manifest.instance is not None and manifest.instance != ref.instance:
        raise ArchiveIntegrityError(
            f"the manifest at {printable(ref.manifest_key)} belongs to instance {manifest.instance}, not {ref.name}"
        )
    return LoadedArchive(ref, manifest, data)


def load_listed_archive(store: ObjectStore, entry: IndexEntry) -> LoadedArchive:
    """The archive an index entry lists, read from its re-derived manifest key (never the entry's own key).

    One read, no listing; errors as :func:`load_archive` (an entry with an empty session id too).
    """
    if not entry.session_id:
        raise ArchiveIntegrityError("an index entry names an empty session id; not reading it")
    ref = ArchiveRef(entry.instance, keys.manifest_key(store.prefix, entry.session_id, entry.instance))
    return _load_ref(store, entry.session_id, ref)


def load_manifest(
    store: ObjectStore, sid: str, instance: str | None = None, *, note: Warn = stderr_note
) -> tuple[Manifest, bytes]:
    """The parsed manifest and stored bytes of the session's newest archive (or the one named ``instance``).

    Same choice and errors as :func:`load_archive`.
    """
    loaded = load_archive(store, sid, instance, note=note)
    return loaded.manifest, loaded.data


_RELATIVE_RE = re.compile(
    r"^(logs(\.live-[0-9]{1,3})?\.(txt|jsonl)\.gz|artifacts/[A-Za-z0-9][A-Za-z0-9._-]*\.tar\.gz)$"
)


def item_key(store: ObjectStore, sid: str, item: ManifestItem, instance: str | None = None) -> tuple[str, str]:
    """``(key, relative name)`` of an archived item of the archive ``instance`` (``None``: legacy), re-derived.

    The manifest's key must end in this session's ``sessions/{sid}/`` part, then (for an
    instance archive) exactly this archive's ``{instance}/`` segment, then a name the archiver
    writes (``logs.txt.gz``, ``logs.live-0.jsonl.gz``, ``artifacts/x.tar.gz``); the key read is
    this store's prefix + that, which also finds archives copied under another prefix. Anything else, including a key of
    another instance of the same id, raises ``ArchiveIntegrityError``: a manifest must not steer
    a read (or a local file name) elsewhere.
    """
    if item.key is None:
        raise ArchiveIntegrityError(f"manifest item {item.kind} {printable(item.path or '')} has no key")
    marker = f"sessions/{keys.escape_session_id(sid)}/"
    head, found, relative = item.key.partition(marker)
    in_archive = True
    if instance is not None:
        segment, sep, relative = relative.partition("/")
        in_archive = bool(sep) and segment == instance
    if not found or (head and not head.endswith("/")) or not in_archive or not _RELATIVE_RE.match(relative):
        raise ArchiveIntegrityError(
            f"manifest of {printable(sid)} names an unexpected key {printable(item.key)!s}; not reading it"
        )
    return keys.session_prefix(store.prefix, sid, instance) + relative, relative


# --- logs -------------------------------------------------------------------------------------
