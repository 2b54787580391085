"""Reading the index: which parts and which JSON hours a time range needs (those no part covers and
the recent ones late entries may still reach), and the ``sessions`` rows of those parts that pass
`ls`'s filters (each JSON entry once)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from archiver.index import parts
from archiver.index.compact import earliest_entry, list_parts
from archiver.index.engine import PartFiles, connect, fetch_rows, sql_list
from archiver.index.rows import entry_from_row
from archiver.layout.manifest import IndexEntry
from archiver.store.base import ObjectStore

#: Parallel listings of a plan (S3 latency, not bandwidth, bounds them).
LIST_WORKERS = 16
#: Hours ending less than this before now are listed as JSON even when a part covers them, so an
#: archive written after its hour was compacted is read at once: an archive is written within the
#: upstream's retention (4 h) of its session's end, this adds a 2 h margin (an upload retried
#: from the spool, a compaction interval). An entry written later still (a store outage of hours,
#: a backfill of an old session) is read from the next compaction's ``late`` part on.
LATE_WINDOW = 6 * parts.HOUR
#: A range longer than this (seconds) first looks up the oldest indexed day (one listing).
LOOKUP_FIRST_DAY_AFTER = 31 * parts.DAY


@dataclass
class Plan:
    """What a range reads: parts (their ``sessions`` keys) and the JSON hour partitions no part covers."""

    part_refs: list[parts.PartRef] = field(default_factory=list)
    #: ``(partition prefix, hour start)`` of the hours to list entry by entry, oldest first.
    json_hours: list[tuple[str, int]] = field(default_factory=list)
    #: Those of ``json_hours`` a part covers (listed for late entries: ``LATE_WINDOW``).
    rechecked: set[str] = field(default_factory=set)
    #: The parts of the days holding a rechecked hour.
    recheck_refs: list[parts.PartRef] = field(default_factory=list)

    def files(self, files: PartFiles, table: str = "sessions") -> list[Path]:
        """Local files of the plan's parts for ``table`` (those not cached yet fetched in parallel)."""
        keys = [parts.table_key(p, table) for p in self.part_refs]
        if len(keys) < 2:
            return [files.path(k) for k in keys]
        with ThreadPoolExecutor(max_workers=min(LIST_WORKERS, len(keys)), thread_name_prefix="index-parts") as pool:
            return list(pool.map(files.path, keys))

    def in_parts(self, files: PartFiles, prefix: str) -> frozenset[str]:
        """The entry keys (with ``prefix``) of the rechecked hours that a part already holds: readers
        listing those hours skip them, so each archive is counted once."""
        if not self.rechecked:
            return frozenset()
        paths = [files.path(r.key) for r in self.recheck_refs]
        con = connect()
        try:
            found = con.execute(f"SELECT DISTINCT entry_key FROM read_parquet({sql_list(paths)})").fetchall()
        finally:
            con.close()
        return frozenset(prefix + key for (key,) in found)


def plan(
    store: ObjectStore, since: float, until: float, *, now: float | None = None, workers: int = LIST_WORKERS
) -> Plan:
    """The parts and JSON hours of ``[since, until]``: one listing per day, two for a day without a
    day part (its hourly parts), none of a covered hour's entries unless it ended less than
    ``LATE_WINDOW`` before ``now`` (``None``: a caller reading only the parts); the days listed in parallel."""
    result = Plan()
    recent = -math.inf if now is None else now - LATE_WINDOW
    prefix = store.prefix
    if now is not None:
        until = min(until, now + parts.DAY)  # a far future lists no empty days
    if until - since > LOOKUP_FIRST_DAY_AFTER:
        # Nor do the days before the first indexed one: `--since 1970-01-01` costs one listing, not 20,000.
        earliest = earliest_entry(store)
        if earliest is None:
            return result  # nothing was ever indexed
        since = max(since, earliest)
    first_hour = int(since // parts.HOUR * parts.HOUR)
    days = parts.days(since, until)

    def listed(day: str) -> tuple[list[parts.PartRef], list[parts.PartRef] | None]:
        day_parts = list_parts(store, parts.day_dir(prefix, day, "sessions"))
        return day_parts, None if day_parts else list_parts(store, parts.hourly_dir(prefix, day))

    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(days))), thread_name_prefix="index-plan") as pool:
        for day, (day_parts, hourly) in zip(days, pool.map(listed, days), strict=True):
            refs = day_parts if hourly is None else hourly
            covered = set(range(24)) if hourly is None else {p.hour for p in hourly}
            result.part_refs += refs
            start = parts.day_start(day)
            if hourly is None and start + parts.DAY <= recent:
                continue  # a closed day, wholly before the late window: its part covers every hour
            rechecked = False
            for hour, partition in enumerate(parts.entry_hours(prefix, day)):
                begins = start + hour * parts.HOUR
                if not first_hour <= begins <= until:
                    continue
                if hour not in covered:
                    result.json_hours.append((partition, begins))
                elif begins + parts.HOUR > recent:
                    result.json_hours.append((partition, begins))
                    result.rechecked.add(partition)
                    rechecked = True
            if rechecked:
                result.recheck_refs += refs
    return result


def _where(
    since: float, until: float | None, image: str | None, location: str | None, labels: Mapping[str, str]
) -> tuple[str, list[object]]:
    clauses = ["ended_at >= ?"]
    params: list[object] = [since]
    if until is not None:
        clauses.append("ended_at <= ?")
        params.append(until)
    if image is not None:
        # Whole strings, never parsed (image names may hold ':'), as the JSON path compares them.
        clauses.append("(image = ? OR image || ':' || tag = ?)")
        params += [image, image]
    if location is not None:
        clauses.append("location = ?")
        params.append(location)
    for k, v in labels.items():
        clauses.append("labels[?] = ?")
        params += [k, v]
    return " AND ".join(clauses), params


def session_entries(
    part_files: list[Path],
    *,
    since: float,
    until: float | None,
    image: str | None = None,
    location: str | None = None,
    labels: Mapping[str, str] | None = None,
    limit: int | None = None,
) -> list[IndexEntry]:
    """The index entries of the ``sessions`` parts that pass the filters, newest first, each entry once."""
    texts = [image or "", location or "", *(labels or {}).keys(), *(labels or {}).values()]
    if not part_files or not all(_utf8(t) for t in texts):
        return []  # parts hold only UTF-8 text: a lone surrogate matches nothing in them
    where, params = _where(since, until, image, location, dict(labels or {}))
    query = (
        "SELECT session_id, instance, ended_at, archived_at, image, tag, location, labels, counts, total_bytes, "
        f"manifest_key, entry_schema_version FROM read_parquet({sql_list(part_files)}, union_by_name=true) "
        f"WHERE {where} QUALIFY row_number() OVER (PARTITION BY entry_key ORDER BY archived_at) = 1 "
        "ORDER BY ended_at DESC, session_id"
    )
    if limit is not None:
        query += f" LIMIT {int(limit)}"
    con = connect()
    try:
        rows = fetch_rows(con, query, params)
    finally:
        con.close()
    return [entry_from_row(_maps(row)) for row in rows]


def _utf8(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _maps(row: dict[str, object]) -> dict[str, object]:
    # DuckDB hands MAP columns back as dicts already; a NULL map reads as empty, as in the entries.
    for name in ("labels", "counts"):
        if row[name] is None:
            row[name] = {}
    return row
