"""Compaction: closed hours' and days' JSON index entries (and their manifests) into create-once parts.

For each day of the range, oldest first: a closed day without a day part gets one (its hour parts'
rows plus every entry they miss); a closed day with one gets a ``late`` part of the entries its
parts miss. For a day still open, each closed hour is done the same way under ``index/hourly/``.
Running it again does only what is missing (resumable), and two replicas running it at once
write the same keys (the names digest the entries covered; create-once makes the second a no-op).
"""

from __future__ import annotations

import contextlib
import functools
import json
import tempfile
import zlib
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import duckdb

from archiver.errors import ManifestError, ObjectConflictError, ObjectNotFoundError, StoreError
from archiver.index import bloom, parts
from archiver.index.engine import PartFiles, Staging, sql_list, write_part, writer
from archiver.index.rows import ArchiveRows, archive_rows
from archiver.index.schema import TABLE_NAMES
from archiver.layout import keys
from archiver.layout.manifest import Manifest, parse_index_entry, parse_manifest
from archiver.store.base import ObjectStore, hash_file
from archiver.textsafe import printable

Warn = Callable[[str], None]
#: Parallel reads of entries and manifests (latency-bound on S3).
WORKERS = 16
PARQUET = "application/vnd.apache.parquet"
#: Entries read at a time (their rows are staged to disk, so memory stays flat in an hour's size).
BATCH = 256


@dataclass
class CompactReport:
    """What a compaction did."""

    parts_written: list[str] = field(default_factory=list)
    entries: int = 0
    days: int = 0
    skipped: int = 0

    def line(self) -> str:
        """One line for the terminal."""
        return f"compacted {self.entries} index entries of {self.days} days into {len(self.parts_written)} parts" + (
            f"; {self.skipped} unreadable entries skipped" if self.skipped else ""
        )


def list_parts(store: ObjectStore, directory: str) -> list[parts.PartRef]:
    """The parts listed under a day's ``sessions/`` or a day's hourly directory."""
    found = (parts.parse_part(k, directory) for k in store.list_keys(directory))
    return [p for p in found if p is not None]


def list_entries(store: ObjectStore, partition: str) -> list[str]:
    """The JSON index entry keys directly inside one hour partition (what ``ls`` reads)."""
    return [k for k in store.list_keys(partition) if k.endswith(".json") and "/" not in k[len(partition) :]]


def covered_keys(con: duckdb.DuckDBPyConnection, files: PartFiles, refs: Sequence[parts.PartRef]) -> set[str]:
    """The entry keys the parts ``refs`` hold a row of."""
    if not refs:
        return set()
    paths = [files.path(r.key) for r in refs]
    return {row[0] for row in con.execute(f"SELECT entry_key FROM read_parquet({sql_list(paths)})").fetchall()}


def _read(store: ObjectStore, key: str) -> bytes:
    return b"".join(store.iter_bytes(key))


def read_archive_rows(store: ObjectStore, entry_key: str, warn: Warn) -> ArchiveRows | None:
    """The rows of the archive the entry at ``entry_key`` lists; ``None`` (with a warning) when unreadable."""
    try:
        entry = parse_index_entry(_read(store, entry_key))
    except ObjectNotFoundError:
        return None
    except ManifestError as exc:
        warn(f"skipping unreadable index entry {printable(entry_key)}: {exc}")
        return None
    manifest: Manifest | None = None
    data: bytes | None = None
    try:
        data = _read(store, keys.manifest_key(store.prefix, entry.session_id, entry.instance))
        manifest = parse_manifest(data)
    except (ObjectNotFoundError, ManifestError, ValueError) as exc:
        warn(f"index entry {printable(entry_key)}: its manifest is unreadable ({exc}); compacting the entry alone")
    blooms = {} if manifest is None else log_blooms(store, manifest, warn)
    rows = archive_rows(entry, parts.relative(store.prefix, entry_key), manifest, data, blooms)
    try:
        json.dumps([rows.session, rows.players, rows.items], ensure_ascii=False).encode()
    except UnicodeEncodeError:
        # A lone surrogate (JSON can carry one, UTF-8 Parquet cannot): the entry stays JSON-only.
        warn(f"index entry {printable(entry_key)} holds text that is not UTF-8; not compacted")
        return None
    return rows


def log_blooms(store: ObjectStore, manifest: Manifest, warn: Warn) -> dict[str, str]:
    """The token filters of the archive's archived text logs (gzip, under its own directory), by key."""
    own = keys.session_prefix(store.prefix, manifest.session_id, manifest.instance)
    found = {}
    for item in manifest.items:
        key = item.key or ""
        if item.kind != "logs" or item.outcome != "archived" or not key.startswith(own) or not key.endswith(".txt.gz"):
            continue  # JSON logs are searched as decoded text: no filter, always read
        try:
            found[key] = bloom.build(bloom.log_tokens(bloom.gunzipped(store.iter_bytes(key))))
        except (StoreError, zlib.error) as exc:
            warn(f"log {printable(key)}: not readable for its token filter ({exc}); grep will read it")
    return found


class Compactor:
    """Compacts one store's index (see the module docstring); ``now`` decides what is closed."""

    def __init__(self, store: ObjectStore, *, now: float, warn: Warn, work_dir: Path | None = None) -> None:
        self.store = store
        self.now = now
        self.warn = warn
        self.files = PartFiles(store, work_dir)
        self.report = CompactReport()
        self._empty_parts = False
        self._work_dir = work_dir

    def run(self, since: float, until: float, progress: Callable[[int], None] | None = None) -> CompactReport:
        """Compact every closed span of the days touching ``[since, until]``."""
        first = earliest_entry(self.store)
        self._con = writer()
        with self._con, ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="compact") as pool:
            for day in parts.days(since, min(until, self.now)):
                # A span without entries gets an empty part (readers then list none of its hours),
                # but only from the first day with entries on: none for the time before the archive.
                self._empty_parts = first is not None and parts.day_start(day) >= first
                self.day(day, pool)
                self.report.days += 1
                if progress is not None:
                    progress(1)
        return self.report

    def day(self, day: str, pool: ThreadPoolExecutor) -> None:
        """Compact one day: its day part (or late part) when it is closed, else its closed hours."""
        prefix = self.store.prefix
        start = parts.day_start(day)
        hourly = list_parts(self.store, parts.hourly_dir(prefix, day))
        if parts.is_closed(start + parts.DAY, self.now, day=True):
            existing = list_parts(self.store, parts.day_dir(prefix, day, "sessions"))
            bases = [] if existing else hourly
            covered = covered_keys(self._con, self.files, existing or hourly)
            entry_keys = [
                k for partition in parts.entry_hours(prefix, day) for k in list_entries(self.store, partition)
            ]
            self._unit(entry_keys, covered, existing, bases, functools.partial(parts.day_dir, prefix, day), "day", pool)
            return
        for hour, partition in enumerate(parts.entry_hours(prefix, day)):
            if not parts.is_closed(start + (hour + 1) * parts.HOUR, self.now):
                break
            existing = [p for p in hourly if p.hour == hour]
            covered = covered_keys(self._con, self.files, existing)
            directory = functools.partial(parts.hour_dir, prefix, day, hour)
            self._unit(list_entries(self.store, partition), covered, existing, [], directory, "hour", pool)

    def _unit(
        self,
        entry_keys: Sequence[str],
        covered: set[str],
        existing: Sequence[parts.PartRef],
        bases: Sequence[parts.PartRef],
        directory: Callable[[str], str],
        kind: str,
        pool: ThreadPoolExecutor,
    ) -> None:
        new = [k for k in entry_keys if parts.relative(self.store.prefix, k) not in covered]
        if existing and not new:
            return
        with tempfile.TemporaryDirectory(prefix="archiver-compact-", dir=self._work_dir) as tmp:
            work = Path(tmp)
            staging = Staging(work)
            mine: set[str] = set()
            for start in range(0, len(new), BATCH):
                batch = new[start : start + BATCH]
                for rows in pool.map(lambda k: read_archive_rows(self.store, k, self.warn), batch):
                    if rows is not None:
                        staging.add("sessions", [rows.session])
                        staging.add("players", rows.players)
                        staging.add("items", rows.items)
                        mine.add(rows.session["entry_key"])
            staged = staging.close()
            self.report.skipped += len(new) - len(mine)
            if not mine and (existing or not (bases or (self._empty_parts and kind == "day"))):
                return  # nothing (readable) to add; an empty hour of an open day is listed, not compacted
            name = parts.part_name("late" if existing else kind, mine if existing else covered | mine)
            self._write(staged, bases, directory, name, work)
            self.report.entries += len(mine)

    def _write(
        self,
        staged: dict[str, Path | None],
        bases: Sequence[parts.PartRef],
        directory: Callable[[str], str],
        name: str,
        work: Path,
    ) -> None:
        base_files = {t: [self.files.path(parts.table_key(b, t)) for b in bases] for t in TABLE_NAMES}
        files = write_part(self._con, staged, base_files, work)
        # The sessions file last: a listing finds a part by it, so its other tables are there.
        for t in ("players", "items", "sessions"):
            key = directory(t) + name
            sha256, size = hash_file(files[t])
            # A conflict: another replica compacted the same entries first (other engine build, other bytes).
            with contextlib.suppress(ObjectConflictError):
                self.store.put_file(key, files[t], sha256=sha256, size=size, content_type=PARQUET)
            if t == "sessions":
                self.report.parts_written.append(key)


def compact(
    store: ObjectStore,
    *,
    since: float,
    until: float,
    now: float,
    warn: Warn,
    progress: Callable[[int], None] | None = None,
    work_dir: Path | None = None,
) -> CompactReport:
    """Compact the closed spans of the days touching ``[since, until]`` (see :class:`Compactor`)."""
    return Compactor(store, now=now, warn=warn, work_dir=work_dir).run(since, until, progress)


def earliest_entry(store: ObjectStore) -> float | None:
    """The start of the first hour holding an index entry (one listing request), or ``None``."""
    base = f"{store.prefix}index/dt="
    for key in store.list_keys(base):
        day = key[len(base) : len(base) + 10]
        try:
            return float(parts.day_start(day))
        except ValueError:
            continue
    return None
