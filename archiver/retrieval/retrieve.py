"""Finding, reading, downloading and re-verifying archived sessions (`archiver ls/show/logs/get/verify`).

Everything here reads the store only through the ObjectStore protocol and never trusts what it
reads: keys named in a manifest are re-derived from the session id (so a tampered manifest cannot
point a download anywhere), every downloaded byte is hashed against the manifest, and every
string that reaches a terminal (ids, labels, log lines on a tty) has its control characters
escaped. Functions take the store and explicit parameters, write to the stream they are given and
return data or counts; ``archiver.cli`` turns them into commands.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import math
import os
import re
import sys
import tarfile
import unicodedata
import uuid
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from archiver.errors import (
    ArchiveIntegrityError,
    LocalFileError,
    ManifestError,
    ObjectNotFoundError,
    SessionNotArchivedError,
    StoreError,
)
from archiver.layout import keys
from archiver.layout.manifest import (
    LATEST_TIME,
    OUTCOMES,
    IndexEntry,
    Manifest,
    ManifestItem,
    iso_utc,
    parse_index_entry,
    parse_manifest,
)
from archiver.retrieval import logformat
from archiver.retrieval.safetar import ExtractResult, safe_extract
from archiver.settings import parse_duration
from archiver.store.base import ObjectStore, hash_file
from archiver.textsafe import printable

#: `ls` looks back this far when no --since is given.
DEFAULT_SINCE = 24 * 3600.0
#: Parallel store requests of one command (S3 latency, not bandwidth, bounds `ls` and `verify`).
DEFAULT_WORKERS = 16
#: How much decompressed log text is looked at to recognise its shape.
_SNIFF_BYTES = 64

Progress = Callable[[int], None]
Warn = Callable[[str], None]


def _stderr_warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)


def _stderr_note(message: str) -> None:
    print(f"note: {message}", file=sys.stderr)


def _quiet(_message: str) -> None:
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
        return now - parse_duration(text)
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


def compile_grep(pattern: str, *, ignore_case: bool = False) -> re.Pattern[str]:
    """The --grep pattern: a Python regular expression searched anywhere in the line (like ``grep -E``).

    ``ValueError`` with the regex error for an invalid pattern. Use ``re.escape``-style quoting
    (``\\.``) for literal dots; most plain words are their own regex.
    """
    try:
        return re.compile(pattern, re.IGNORECASE if ignore_case else 0)
    except re.error as exc:
        raise ValueError(f"{pattern!r} is not a valid regular expression: {exc}") from None


# --- safe text for terminals -------------------------------------------------------------------


def _escape_line(text: str) -> str:
    """A log line for a terminal: control characters escaped, tabs kept (logs use them for layout)."""
    if text.isprintable() or all(ch == "\t" or ch.isprintable() for ch in text):
        return text
    return "\t".join(printable(part) for part in text.split("\t"))


def _width(text: str) -> int:
    """Terminal columns of a (printable) string: wide East Asian characters take two, combining marks none."""
    if text.isascii():
        return len(text)
    return sum(0 if unicodedata.combining(ch) else 2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in text)


def human_size(size: int | None) -> str:
    """``0 B``, ``512 B``, ``1.5 KiB``, ``12.0 MiB``; ``-`` for unknown."""
    if size is None:
        return "-"
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def _when(epoch: float | None, suffix: str = "") -> str:
    if epoch is None:
        return "-"
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%d %H:%M:%S") + suffix


# --- ls ---------------------------------------------------------------------------------------


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
    warn: Warn = _stderr_warn,
    workers: int = DEFAULT_WORKERS,
) -> list[IndexEntry]:
    """Archived sessions that ended in ``[since, until]``, newest first, filtered; at most ``limit``.

    Only the index hour partitions of the range are listed (``keys.index_partitions``), never
    the bucket, newest partition first; with a ``limit`` the walk stops once enough entries are
    found, because every entry of an older partition ended before any entry of a newer one.
    ``since`` defaults to 24 h before ``now``; without ``until`` the range is open towards the
    future (a writer's clock a little ahead of ours must not hide sessions). ``image`` matches
    ``NAME`` or ``NAME:TAG``; ``labels`` must all match exactly. An index entry that cannot be
    read or parsed is reported through ``warn`` and skipped: one bad entry must not hide the rest.
    """
    start = now - DEFAULT_SINCE if since is None else since
    last = max(now, start) if until is None else until
    wanted = dict(labels or {})
    partitions = list(reversed(keys.index_partitions(store.prefix, start, last)))
    found: list[IndexEntry] = []

    def list_partition(partition: str) -> list[str]:
        # Only `{sid}.json` directly inside the partition is an entry.
        return [k for k in store.list_keys(partition) if k.endswith(".json") and "/" not in k[len(partition) :]]

    def fetch(key: str) -> IndexEntry | None:
        try:
            return parse_index_entry(_read_small(store, key))
        except ObjectNotFoundError:
            return None  # removed between the listing and the read
        except ManifestError as exc:
            warn(f"skipping unreadable index entry {printable(key)}: {exc}")
            return None

    with ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="ls") as pool:
        for batch in _chunks(partitions, max(1, workers)):
            entry_keys = [k for listed in pool.map(list_partition, batch) for k in listed]
            for entry in pool.map(fetch, entry_keys):
                if entry is not None and _matches(entry, start, until, image, location, wanted):
                    found.append(entry)
            if limit is not None and len(found) >= limit:
                break
    found.sort(key=lambda e: (-e.ended_at, e.session_id))
    return found if limit is None else found[:limit]


def _items_cell(counts: Mapping[str, int]) -> str:
    total = sum(counts.values())
    archived = counts.get("archived", 0)
    flagged = [o for o in OUTCOMES if o != "archived" and counts.get(o)]
    cell = f"{archived}/{total}"
    return f"{cell} !{','.join(flagged)}" if flagged else cell


def _labels_cell(labels: Mapping[str, str]) -> str:
    return ",".join(f"{printable(k)}={printable(v)}" for k, v in sorted(labels.items())) or "-"


#: Columns wider than this do not widen the whole table; the long cell is printed in full anyway
#: (a truncated session id could not be pasted into `archiver show`).
_MAX_COLUMN = 48


def render_table(rows: Sequence[Sequence[str]], header: Sequence[str], out: TextIO) -> None:
    """Left-aligned columns separated by two spaces; the last column is never padded."""
    widths = [min(_MAX_COLUMN, max([_width(h)] + [_width(r[i]) for r in rows])) for i, h in enumerate(header)]
    for row in [list(header), *rows]:
        cells = [cell + " " * max(0, widths[i] - _width(cell)) for i, cell in enumerate(row[:-1])]
        out.write("  ".join([*cells, row[-1]]).rstrip() + "\n")


def entry_row(entry: IndexEntry) -> list[str]:
    """One `ls` table row (every cell already safe for a terminal)."""
    return [
        _when(entry.ended_at),
        printable(entry.session_id),
        printable(f"{entry.image}:{entry.tag}"),
        printable(entry.location),
        _items_cell(entry.counts),
        human_size(entry.total_bytes),
        _labels_cell(entry.labels),
    ]


LS_HEADER = ("ENDED (UTC)", "SESSION", "IMAGE:TAG", "LOCATION", "ITEMS", "SIZE", "LABELS")


def entry_json(entry: IndexEntry) -> dict[str, Any]:
    """The stable JSON shape of one listed session (field names are a contract for scripts)."""
    counts = dict(entry.counts)
    return {
        "session_id": entry.session_id,
        "ended_at": entry.ended_at,
        "ended_at_iso": iso_utc(entry.ended_at),
        "archived_at": entry.archived_at,
        "archived_at_iso": iso_utc(entry.archived_at),
        "image": entry.image,
        "tag": entry.tag,
        "location": entry.location,
        "labels": dict(entry.labels),
        "items_archived": counts.get("archived", 0),
        "items_total": sum(counts.values()),
        "counts": counts,
        "total_bytes": entry.total_bytes,
        "manifest_key": entry.manifest_key,
        "instance": entry.instance,
    }


def write_json(doc: Any, out: TextIO) -> None:
    # ensure_ascii: ids may hold lone surrogates, which no UTF-8 stream can carry; \u escapes can.
    out.write(json.dumps(doc, indent=2, ensure_ascii=True, sort_keys=False) + "\n")


def render_sessions(entries: Sequence[IndexEntry], out: TextIO, *, fmt: str = "table") -> None:
    """`ls` output: an aligned table (``table``) or one JSON array (``json``)."""
    if fmt == "json":
        write_json([entry_json(e) for e in entries], out)
        return
    if fmt != "table":
        raise ValueError(f"unknown format {fmt!r} (table or json)")
    if not entries:
        out.write("no archived sessions match\n")
        return
    render_table([entry_row(e) for e in entries], LS_HEADER, out)


# --- show -------------------------------------------------------------------------------------


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
    store: ObjectStore, sid: str, instance: str | None = None, *, note: Warn = _stderr_note
) -> LoadedArchive:
    """The newest archive of the session, or the one named ``instance`` (an instance name or ``legacy``).

    ``SessionNotArchivedError`` when the id has no archive, or none of that name (the message
    lists the names it has). When the id has several archives and none was named, ``note`` says
    so in one line. ``ManifestError`` when the manifest does not parse; ``ArchiveIntegrityError``
    when it names another session or another instance (tampering or a key collision).
    """
    if not sid:
        raise SessionNotArchivedError("an empty session id is never archived")
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
    try:
        data = _read_small(store, ref.manifest_key)
    except ObjectNotFoundError:
        raise SessionNotArchivedError(
            f"the archive {ref.name} of session {printable(sid)} is gone from {store.url} "
            f"(no {printable(ref.manifest_key)})"
        ) from None
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


def load_manifest(
    store: ObjectStore, sid: str, instance: str | None = None, *, note: Warn = _stderr_note
) -> tuple[Manifest, bytes]:
    """The parsed manifest and stored bytes of the session's newest archive (or the one named ``instance``).

    Same choice and errors as :func:`load_archive`.
    """
    loaded = load_archive(store, sid, instance, note=note)
    return loaded.manifest, loaded.data


def render_manifest(m: Manifest, out: TextIO) -> None:
    """The manifest for people: metadata, when the end was seen, and each item with its outcome."""
    players = ", ".join(printable(p) for p in m.players)
    count = m.player_count if m.player_count is not None else len(m.players)
    rows = [
        ("Session", printable(m.session_id)),
        *([("Instance", m.instance)] if m.instance is not None else []),
        ("Image", printable(f"{m.image}:{m.tag}")),
        ("Location", printable(m.location)),
        ("Host", printable(m.host) or "-"),
        ("Created", _when(m.created, " UTC")),
        ("Last status", printable(m.last_status) or "-"),
        ("Players", f"{count}" + (f" ({players})" if players else "")),
        ("Labels", _labels_cell(m.labels)),
        ("Last seen active", _when(m.last_seen_active, " UTC")),
        ("First seen ended", _when(m.first_seen_ended, " UTC")),
        ("Fetch deadline", _when(m.fetch_deadline, " UTC")),
        ("Archived at", f"{_when(m.archived_at, ' UTC')} (archiver {printable(m.archiver_version)})"),
    ]
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        out.write(f"{name:<{width}}  {value}\n")
    archived = [i for i in m.items if i.outcome == "archived"]
    out.write(f"\nItems: {len(archived)} archived of {len(m.items)}, {human_size(m.total_bytes)} stored\n")
    for item in m.items:
        what = printable(item.path) if item.kind == "artifact" and item.path else "(session logs)"
        out.write(f"  {item.kind:<9} {item.outcome:<12} {human_size(item.size):>10}  {what}\n")
        details: list[tuple[str, str | None]] = [
            ("key", item.key),
            ("sha256", item.sha256),
            ("type", item.content_type),
            ("source", item.source),
            ("error", item.error),
        ]
        for label, detail in details:
            if detail:
                out.write(f"  {'':<9} {label:<12} {printable(detail)}\n")


def show_session(
    store: ObjectStore,
    sid: str,
    out: TextIO,
    *,
    fmt: str = "text",
    instance: str | None = None,
    note: Warn = _stderr_note,
) -> Manifest:
    """`archiver show`: the readable manifest (``text``) or the stored manifest JSON as is (``json``).

    Of the newest archive of ``sid``, or the one named ``instance`` (see :func:`load_archive`).
    """
    manifest, data = load_manifest(store, sid, instance, note=note)
    if fmt == "json":
        # The stored bytes (canonical ASCII JSON): what `verify` hashes and scripts can trust.
        out.write(data.decode("utf-8", "replace"))
    elif fmt == "text":
        render_manifest(manifest, out)
    else:
        raise ValueError(f"unknown format {fmt!r} (text or json)")
    return manifest


# --- item keys (never trusted from the manifest) ------------------------------------------------

_RELATIVE_RE = re.compile(r"^(logs\.(txt|jsonl)\.gz|artifacts/[A-Za-z0-9][A-Za-z0-9._-]*\.tar\.gz)$")


def item_key(store: ObjectStore, sid: str, item: ManifestItem, instance: str | None = None) -> tuple[str, str]:
    """``(key, relative name)`` of an archived item of the archive ``instance`` (``None``: legacy), re-derived.

    The manifest's key must end in this session's ``sessions/{sid}/`` part, then (for an
    instance archive) exactly this archive's ``{instance}/`` segment, then a name the archiver
    writes (``logs.txt.gz``, ``artifacts/x.tar.gz``); the key read is this store's prefix + that,
    which also finds archives copied under another prefix. Anything else, including a key of
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


def _gunzip(chunks: Iterable[bytes], key: str) -> Iterator[bytes]:
    """Decompress a gzip stream incrementally (several members allowed); corrupt → ArchiveIntegrityError.

    A stream cut inside a member yields what could be decoded, then raises: for forensics the
    readable start of a damaged log is still worth seeing.
    """
    decoder = zlib.decompressobj(zlib.MAX_WBITS | 16)
    in_member = False
    for chunk in chunks:
        data = chunk
        while data:
            in_member = True
            try:
                out = decoder.decompress(data)
            except zlib.error as exc:
                raise ArchiveIntegrityError(f"{printable(key)} is not valid gzip ({exc})") from None
            if out:
                yield out
            if decoder.eof:
                # Concatenated gzip members are one valid stream (`cat a.gz b.gz`).
                data = decoder.unused_data
                decoder = zlib.decompressobj(zlib.MAX_WBITS | 16)
                in_member = False
            else:
                data = b""
    if in_member:
        tail = decoder.flush()
        if tail:
            yield tail
        raise ArchiveIntegrityError(f"{printable(key)} ends in the middle of its gzip data (truncated)")


class _Hashing:
    """Passes chunks through while hashing and counting them (verification after streaming)."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._chunks = chunks
        self.digest = hashlib.sha256()
        self.size = 0
        self.complete = False

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self._chunks:
            self.digest.update(chunk)
            self.size += len(chunk)
            yield chunk
        self.complete = True


def _sniffed(chunks: Iterable[bytes], content_type: str) -> tuple[str, Iterator[bytes]]:
    """The log shape from the first decompressed bytes, and the chunks again from the start."""
    iterator = iter(chunks)
    head = b""
    for chunk in iterator:
        head += chunk
        if len(head.lstrip()) >= _SNIFF_BYTES:
            break

    def replay() -> Iterator[bytes]:
        if head:
            yield head
        yield from iterator

    return logformat.sniff(head, content_type), replay()


def logs_item(m: Manifest) -> ManifestItem:
    """The manifest's archived logs item; ``SessionNotArchivedError`` saying why when there is none."""
    items = [i for i in m.items if i.kind == "logs"]
    for item in items:
        if item.outcome == "archived":
            return item
    if not items:
        raise SessionNotArchivedError(f"session {printable(m.session_id)} has no logs in its archive")
    item = items[0]
    why = f": {item.error}" if item.error else ""
    raise SessionNotArchivedError(
        f"the logs of session {printable(m.session_id)} were not archived ({item.outcome}{printable(why)})"
    )


def iter_log_lines(
    store: ObjectStore, sid: str, instance: str | None = None, *, note: Warn = _stderr_note
) -> tuple[Iterator[logformat.LogLine], _Hashing, ManifestItem]:
    """Plain lines of the archived logs (newest archive, or ``instance``), streamed; the hasher of the stored bytes."""
    loaded = load_archive(store, sid, instance, note=note)
    item = logs_item(loaded.manifest)
    key, relative = item_key(store, sid, item, loaded.ref.instance)
    hashing = _Hashing(store.iter_bytes(key))
    # The extension is the archiver's own verdict on the upstream shape; sniff still decides.
    hint = "application/x-ndjson" if relative.endswith(".jsonl.gz") else "text/plain"
    shape, chunks = _sniffed(_gunzip(hashing, key), hint)
    return logformat.read_lines(chunks, shape), hashing, item


def print_logs(
    store: ObjectStore,
    sid: str,
    out: TextIO,
    *,
    stream: str | None = None,
    grep: re.Pattern[str] | None = None,
    escape: bool | None = None,
    warn: Warn = _stderr_warn,
    instance: str | None = None,
    note: Warn = _stderr_note,
) -> int:
    """`archiver logs`: the archived log lines as plain text, whatever shape the upstream sent; lines printed.

    Of the newest archive of ``sid``, or the one named ``instance`` (see :func:`load_archive`).

    ``stream`` (``stdout``/``stderr``) keeps the lines of that stream. Where the source does not
    say which stream a line came from (plain-text bodies), such lines are printed anyway and
    ``warn`` says so once: hiding lines from an investigation is worse than showing extra ones.
    ``grep`` keeps lines the pattern matches anywhere (``compile_grep``). Control characters are
    escaped when ``escape`` (default: when ``out`` is a terminal); piped output stays verbatim.

    Streams: decompresses chunk by chunk (only the legacy one-document shape is read whole).
    After the last line the stored bytes are checked against the manifest's sha256;
    a mismatch raises ``ArchiveIntegrityError`` (the lines were printed: say they are suspect).
    ``BrokenPipeError`` from ``out`` propagates untouched for the CLI to end quietly.
    """
    if stream not in (None, logformat.STDOUT, logformat.STDERR):
        raise ValueError(f"stream must be stdout or stderr, got {stream!r}")
    if escape is None:
        escape = _isatty(out)
    lines, hashing, item = iter_log_lines(store, sid, instance, note=note)
    printed = 0
    warned = False
    for line in lines:
        if stream is not None and line.stream != stream:
            if line.stream is not None:
                continue
            if not warned:
                warn(f"these logs do not tell stdout from stderr; printing every line, not only {stream}")
                warned = True
        if grep is not None and not grep.search(line.text):
            continue
        out.write((_escape_line(line.text) if escape else line.text) + "\n")
        printed += 1
    if hashing.complete and (hashing.size != item.size or hashing.digest.hexdigest() != item.sha256):
        raise ArchiveIntegrityError(
            f"the stored logs of {printable(sid)} do not match the manifest (stored: sha256 "
            f"{hashing.digest.hexdigest()}, {hashing.size} bytes; manifest: sha256 {item.sha256}, "
            f"{item.size} bytes): the lines above may have been altered"
        )
    return printed


def _isatty(out: TextIO) -> bool:
    try:
        return out.isatty()
    except (AttributeError, ValueError):
        return False


# --- get --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DownloadedFile:
    """One object now on local disk, verified."""

    path: Path
    key: str
    size: int
    sha256: str
    #: Already there with the right sha256 from an earlier run: not downloaded again.
    reused: bool = False


@dataclass(slots=True)
class DownloadResult:
    """What `archiver get` produced."""

    directory: Path
    manifest: Manifest
    files: list[DownloadedFile] = field(default_factory=list)
    #: Items the archive holds no bytes for (source_gone, too_large, expired, conflict).
    not_archived: list[ManifestItem] = field(default_factory=list)
    #: Relative artifact name → what extraction did (``--extract``).
    extracted: dict[str, ExtractResult] = field(default_factory=dict)
    #: Artifacts whose extraction was skipped and why (already extracted, damaged archive).
    extract_skipped: dict[str, str] = field(default_factory=dict)
    logs_text: Path | None = None


def download_size(m: Manifest) -> int:
    """Bytes `get` downloads for this manifest (for a progress bar's length)."""
    return m.total_bytes


def session_dir_name(sid: str, instance: str | None = None) -> str:
    """The local directory name of an archive: the escaped id, ``.{instance}`` appended for an instance archive.

    No `/`, no leading dot, ≤ 171 chars; the escaped id never contains ``.``, so the legacy
    archive and every instance of one id get distinct directories.
    """
    escaped = keys.escape_session_id(sid)
    if instance is None:
        return escaped
    if not keys.is_instance_name(instance):
        raise ValueError(f"not an instance name: {instance[:60]!r}")
    return f"{escaped}.{instance}"


def _download(
    store: ObjectStore, key: str, target: Path, size: int, sha256: str, progress: Progress | None
) -> DownloadedFile:
    """Stream one object to ``target`` via ``target.partial``, verifying size and sha256 before the rename."""
    if target.is_file() and not target.is_symlink():
        have_sha, have_size = hash_file(target)
        if have_sha == sha256 and have_size == size:
            if progress is not None:
                progress(size)
            return DownloadedFile(target, key, size, sha256, reused=True)
    partial = target.with_name(target.name + ".partial")
    target.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    written = 0
    # O_NOFOLLOW: never write through a symlink someone left at the .partial name.
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        with os.fdopen(fd, "wb") as f:
            for chunk in store.iter_bytes(key):
                digest.update(chunk)
                written += len(chunk)
                f.write(chunk)
                if progress is not None:
                    progress(len(chunk))
        got = digest.hexdigest()
        if got != sha256 or written != size:
            raise ArchiveIntegrityError(
                f"{printable(key)}: downloaded {written} bytes with sha256 {got}, but the manifest says "
                f"{size} bytes with sha256 {sha256}; not kept"
            )
        os.replace(partial, target)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    return DownloadedFile(target, key, size, sha256)


def _write_logs_text(store: ObjectStore, sid: str, ref: ArchiveRef, target: Path) -> Path:
    partial = target.with_name(target.name + ".partial")
    try:
        with partial.open("w", encoding="utf-8", errors="surrogateescape", newline="\n") as f:
            print_logs(store, sid, f, escape=False, warn=_quiet, instance=ref.name, note=_quiet)
        os.replace(partial, target)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    return target


def download_session(
    store: ObjectStore,
    sid: str,
    out_dir: Path,
    *,
    extract: bool = False,
    progress: Progress | None = None,
    loaded: LoadedArchive | None = None,
    instance: str | None = None,
    note: Warn = _stderr_note,
) -> DownloadResult:
    """`archiver get`: everything of one archive of a session into ``out_dir/{session_dir_name}/``, verified.

    The newest archive, or the one named ``instance`` (see :func:`load_archive`); an instance
    archive goes to ``<escaped sid>.<instance>/``, the legacy one to ``<escaped sid>/``, so two
    archives of one id never overwrite each other.

    Layout: ``manifest.json`` (the stored bytes), ``logs.txt.gz``/``logs.jsonl.gz`` and
    ``artifacts/{slug}-{hash8}.tar.gz`` exactly as stored. Each object is streamed to
    ``.partial``, hashed on the way, and renamed only when size and sha256 match the manifest
    (else ``ArchiveIntegrityError`` naming the key and both hashes; the partial file is removed).
    Files already present with the right hash are kept (a re-run resumes cheaply).

    ``extract``: also ``logs.txt`` (plain lines, as `archiver logs` prints them) and each artifact
    unpacked by :func:`archiver.retrieval.safetar.safe_extract` into ``artifacts/{slug}-{hash8}/`` (unsafe
    members skipped and listed in the result). An existing extraction directory is left alone
    (never delete what a user may have edited). ``progress`` is called with byte counts;
    ``loaded`` is what :func:`load_manifest` returned, when the caller already has it (to size
    a progress bar). Local write failures raise ``LocalFileError``.
    """
    if loaded is None:
        loaded = load_archive(store, sid, instance, note=note)
    try:
        return _download_session(store, sid, out_dir, loaded, extract, progress)
    except OSError as exc:
        where = f" {exc.filename}" if exc.filename else f" under {out_dir}"
        raise LocalFileError(f"cannot write{where}: {exc.strerror or exc}") from None


def _download_session(
    store: ObjectStore,
    sid: str,
    out_dir: Path,
    loaded: LoadedArchive,
    extract: bool,
    progress: Progress | None,
) -> DownloadResult:
    manifest, data, ref = loaded.manifest, loaded.data, loaded.ref
    directory = out_dir / session_dir_name(sid, ref.instance)
    directory.mkdir(parents=True, exist_ok=True)
    result = DownloadResult(directory, manifest)
    tmp = directory / f"manifest.json.{uuid.uuid4().hex}.partial"
    tmp.write_bytes(data)
    os.replace(tmp, directory / "manifest.json")

    for item in manifest.items:
        if item.outcome != "archived":
            result.not_archived.append(item)
            continue
        key, relative = item_key(store, sid, item, ref.instance)
        assert item.size is not None and item.sha256 is not None  # guaranteed for archived items
        result.files.append(_download(store, key, directory / relative, item.size, item.sha256, progress))

    if not extract:
        return result
    if any(i.kind == "logs" and i.outcome == "archived" for i in manifest.items):
        result.logs_text = _write_logs_text(store, sid, ref, directory / "logs.txt")
    for downloaded in result.files:
        relative = downloaded.path.relative_to(directory).as_posix()
        if not relative.startswith("artifacts/"):
            continue
        target = downloaded.path.with_name(downloaded.path.name.removesuffix(".tar.gz"))
        if target.exists() or target.is_symlink():
            result.extract_skipped[relative] = f"{target.name}/ already exists (remove it to extract again)"
            continue
        try:
            result.extracted[relative] = safe_extract(downloaded.path, target)
        except (tarfile.TarError, gzip.BadGzipFile, EOFError, zlib.error) as exc:
            # The downloaded file matched its sha256: the upstream sent a damaged archive. Keep it.
            result.extract_skipped[relative] = f"not a readable .tar.gz ({type(exc).__name__}: {exc})"
    return result


def render_download(result: DownloadResult, out: TextIO) -> None:
    """A short summary of `get`: where things went, what was not archived, what extraction refused."""
    fetched = sum(1 for f in result.files if not f.reused)
    reused = len(result.files) - fetched
    total = sum(f.size for f in result.files)
    out.write(
        f"{printable(result.manifest.session_id)}: {len(result.files)} file(s), {human_size(total)}, "
        f"sha256 verified -> {result.directory}" + (f" ({reused} already present)" if reused else "") + "\n"
    )
    for f in result.files:
        out.write(f"  {f.path.relative_to(result.directory).as_posix():<60} {human_size(f.size):>10}\n")
    if result.logs_text is not None:
        out.write(f"  {result.logs_text.name:<60} (plain lines)\n")
    for item in result.not_archived:
        what = item.path if item.kind == "artifact" and item.path else "logs"
        reason = f": {item.error}" if item.error else ""
        out.write(f"  not archived: {printable(what)} ({item.outcome}{printable(reason)})\n")
    for relative, extracted in result.extracted.items():
        out.write(
            f"  extracted {relative} -> {extracted.destination.relative_to(result.directory).as_posix()}/ "
            f"({extracted.files} file(s), {human_size(extracted.bytes_written)})\n"
        )
        for refusal in extracted.refused:
            out.write(f"    refused {printable(refusal.member)}: {printable(refusal.reason)}\n")
    for relative, why in result.extract_skipped.items():
        out.write(f"  not extracted {relative}: {why}\n")


# --- verify -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong with one archived session."""

    session_id: str
    kind: str
    key: str
    detail: str
    #: The instance archive it concerns; ``None`` for the legacy archive or the id as a whole.
    instance: str | None = None

    def line(self) -> str:
        which = f" ({printable(self.instance)})" if self.instance is not None else ""
        return f"{printable(self.session_id)}{which}: {self.kind}: {printable(self.key)}: {printable(self.detail)}"


@dataclass(slots=True)
class VerifyReport:
    """Counts of `verify` and every problem found."""

    #: Archives verified (each instance of a reused id counts), plus ids found not archived.
    sessions: int = 0
    objects: int = 0
    bytes: int = 0
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def sessions_with_problems(self) -> int:
        """Archives with problems (two instances of one id count twice, like in ``sessions``)."""
        return len({(p.session_id, p.instance) for p in self.problems})


def _verify_one(
    store: ObjectStore, sid: str, name: str, check_index: bool, progress: Progress | None
) -> tuple[int, int, list[Problem]]:
    """(objects, bytes, problems) of the archive ``name`` (instance or ``legacy``): re-hash its objects."""
    # A name that is neither is the user's typo: reported as not archived, never turned into a key.
    known = name == LEGACY or keys.is_instance_name(name)
    instance = name if known and name != LEGACY else None
    if not sid:
        mkey = ""
    else:
        mkey = keys.manifest_key(store.prefix, sid, instance) if known else keys.session_prefix(store.prefix, sid)
    problems: list[Problem] = []
    try:
        loaded = load_archive(store, sid, name, note=_quiet)
    except SessionNotArchivedError as exc:
        return 0, 0, [Problem(sid, "not_archived", mkey, str(exc), instance)]
    except ManifestError as exc:
        return 0, 0, [Problem(sid, "unreadable_manifest", mkey, str(exc), instance)]
    except ArchiveIntegrityError as exc:
        return 0, 0, [Problem(sid, "manifest_mismatch", mkey, str(exc), instance)]
    manifest = loaded.manifest
    objects = total = 0
    for item in manifest.items:
        if item.outcome != "archived":
            continue
        try:
            key, _ = item_key(store, sid, item, instance)
        except ArchiveIntegrityError as exc:
            problems.append(Problem(sid, "unexpected_key", item.key or "", str(exc), instance))
            continue
        digest = hashlib.sha256()
        size = 0
        try:
            for chunk in store.iter_bytes(key):
                digest.update(chunk)
                size += len(chunk)
                if progress is not None:
                    progress(len(chunk))
        except ObjectNotFoundError:
            problems.append(Problem(sid, "missing_object", key, f"{item.kind} object is gone", instance))
            continue
        objects += 1
        total += size
        if size != item.size:
            problems.append(Problem(sid, "size_mismatch", key, f"stored {size} bytes, manifest {item.size}", instance))
        elif digest.hexdigest() != item.sha256:
            problems.append(
                Problem(sid, "sha256_mismatch", key, f"stored {digest.hexdigest()}, manifest {item.sha256}", instance)
            )
    if check_index:
        ikey = keys.index_key(store.prefix, manifest.ended_at, sid, instance)
        if store.head(ikey) is None:
            problems.append(Problem(sid, "missing_index", ikey, "`ls` cannot find this session", instance))
    return objects, total, problems


def _verify_id(
    store: ObjectStore, sid: str, name: str | None, check_index: bool, progress: Progress | None
) -> list[tuple[int, int, list[Problem]]]:
    """One result per archive verified: the archive ``name``, or every archive of ``sid`` (``None``)."""
    if name is not None:
        return [_verify_one(store, sid, name, check_index, progress)]
    refs = find_archives(store, sid)
    if not refs:
        where = keys.session_prefix(store.prefix, sid) if sid else ""
        return [(0, 0, [Problem(sid, "not_archived", where, "no manifest")])]
    return [_verify_one(store, sid, ref.name, check_index, progress) for ref in refs]


def _entry_archive(prefix: str, entry: IndexEntry) -> str:
    """The archive (instance name or ``legacy``) an index entry stands for, from its manifest key.

    The key decides (it names what the entry was written for, whatever prefix it was copied
    from); the entry's ``instance`` field is the fallback for a key that does not parse.
    """
    _head, found, rest = entry.manifest_key.partition(f"sessions/{keys.escape_session_id(entry.session_id)}/")
    segment, sep, tail = rest.partition("/")
    if found and rest == "manifest.json":
        return LEGACY
    if found and sep and tail == "manifest.json" and keys.is_instance_name(segment):
        return segment
    return LEGACY if entry.instance is None else entry.instance


def verify(
    store: ObjectStore,
    *,
    session_ids: Sequence[str] = (),
    instance: str | None = None,
    since: float | None = None,
    until: float | None = None,
    now: float,
    progress: Progress | None = None,
    on_problem: Callable[[Problem], None] | None = None,
    workers: int = 4,
    warn: Warn = _stderr_warn,
) -> VerifyReport:
    """`archiver verify`: re-hash stored objects against their manifests.

    With ``session_ids``: every archive of those ids (each instance of a reused id), or only the
    one named ``instance`` (an instance name or ``legacy``); also checks each archive has its
    index entry, else `ls` cannot find it. Otherwise every archive the index lists between
    ``since`` and ``until`` (default: the last 24 h). Problems are collected per archive
    (missing manifest or object, size or sha256 mismatch, a manifest naming a foreign key) and
    passed to ``on_problem`` as found; a store failure on one session is a ``store_error``
    problem, not the end of the run.
    """
    targets: list[tuple[str, str | None]]
    if session_ids:
        targets = [(sid, instance) for sid in dict.fromkeys(session_ids)]
        check_index = True
    else:
        entries = list_sessions(store, since=since, until=until, now=now, warn=warn)
        targets = list(dict.fromkeys((e.session_id, _entry_archive(store.prefix, e)) for e in entries))
        check_index = False
    report = VerifyReport()

    def run(target: tuple[str, str | None]) -> list[tuple[int, int, list[Problem]]]:
        sid, name = target
        try:
            return _verify_id(store, sid, name, check_index, progress)
        except StoreError as exc:
            # Broad on purpose: one unreachable object must not hide the verdict on the others.
            which = name if name is not None and keys.is_instance_name(name) else None
            return [(0, 0, [Problem(sid, "store_error", "", str(exc), which)])]

    with ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="verify") as pool:
        for results in pool.map(run, targets):
            for objects, total, problems in results:
                report.sessions += 1
                report.objects += objects
                report.bytes += total
                for problem in problems:
                    report.problems.append(problem)
                    if on_problem is not None:
                        on_problem(problem)
    return report


def render_verify(report: VerifyReport, out: TextIO, *, problems: bool = True) -> None:
    """Problems (one line each, unless already printed as found) and the verdict line."""
    if problems:
        for problem in report.problems:
            out.write(problem.line() + "\n")
    verdict = "OK" if report.ok else "FAILED"
    out.write(
        f"{verdict}: {report.sessions} session(s), {report.objects} object(s), {human_size(report.bytes)} "
        f"re-hashed; {len(report.problems)} problem(s) in {report.sessions_with_problems} session(s)\n"
    )
