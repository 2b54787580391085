"""Where the index's Parquet parts live, what each covers, and when an hour or a day is closed (pure).

Layout (``D`` a UTC day, ``HH`` an hour, ``T`` a table of ``schema.TABLES``)::

    {prefix}index/dt=D/T/day-{digest}.parquet              a closed day: every entry known when compacted
    {prefix}index/dt=D/T/late-{digest}.parquet             entries of that day found after its day part
    {prefix}index/hourly/dt=D/hour=HH/T/hour-{digest}.parquet   a closed hour of a day not closed yet
    {prefix}index/hourly/dt=D/hour=HH/T/late-{digest}.parquet   its late entries

An engine reads ``index/dt=*/T/`` (closed days). ``digest`` is a hash of the sorted entry keys the
part compacts, so two replicas compacting the same entries name the same key and the create-once
write makes the second a no-op; a part never changes once written.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final

from archiver.index.schema import INDEX_SCHEMA_VERSION, TABLE_NAMES
from archiver.layout import keys

HOUR: Final = 3600
DAY: Final = 24 * HOUR
#: An hour is compacted this long after it ends (most archives are written within minutes of the
#: end; the later ones go into a ``late`` part), so at most the last hour and a bit are read as JSON.
HOUR_CLOSE: Final = 15 * 60
#: A day is compacted this long after it ends: past the removal window (4 h by default) within
#: which an archive of a session that ended in it is still written, plus a margin; so a day part
#: holds nearly every archive of its day, and its hour and late parts are no longer read.
DAY_CLOSE: Final = 6 * HOUR
#: Part kinds: ``day`` and ``hour`` cover their whole span; ``late`` adds entries found afterwards.
KINDS: Final = ("day", "hour", "late")


def day_of(epoch: float) -> str:
    """The UTC day (``YYYY-MM-DD``) an epoch time falls in."""
    return f"{datetime.fromtimestamp(epoch, UTC):%Y-%m-%d}"


def day_start(day: str) -> int:
    """Epoch seconds of a ``YYYY-MM-DD`` day's first instant (UTC)."""
    return int(datetime.strptime(day, "%Y-%m-%d").replace(tzinfo=UTC).timestamp())


def days(since: float, until: float) -> list[str]:
    """The UTC days touching ``[since, until]``, oldest first."""
    first = day_start(day_of(since))
    return [day_of(t) for t in range(first, int(until) + 1, DAY)] if since <= until else []


def is_closed(span_end: float, now: float, *, day: bool = False) -> bool:
    """Whether an hour (a ``day``) that ends at ``span_end`` is closed for compaction at ``now``."""
    return now >= span_end + (DAY_CLOSE if day else HOUR_CLOSE)


def day_dir(prefix: str, day: str, table: str) -> str:
    """``{prefix}index/dt=D/{table}/``: a closed day's parts (what engines read)."""
    return f"{prefix}index/dt={day}/{_table(table)}/"


def hourly_dir(prefix: str, day: str) -> str:
    """``{prefix}index/hourly/dt=D/``: every hour part of a day (one listing)."""
    return f"{prefix}index/hourly/dt={day}/"


def hour_dir(prefix: str, day: str, hour: int, table: str) -> str:
    """``{prefix}index/hourly/dt=D/hour=HH/{table}/``: one closed hour's parts."""
    return f"{hourly_dir(prefix, day)}hour={hour:02d}/{_table(table)}/"


def _table(table: str) -> str:
    if table not in TABLE_NAMES:
        raise ValueError(f"not an index table: {table!r}")
    return table


def digest(entry_keys: Iterable[str]) -> str:
    """The name digest of a part compacting ``entry_keys`` (order-free; the schema version included)."""
    h = hashlib.sha256(f"v{INDEX_SCHEMA_VERSION}\n".encode())
    for key in sorted(set(entry_keys)):
        h.update(key.encode("utf-8", "surrogatepass") + b"\n")
    return h.hexdigest()[:24]


def part_name(kind: str, entry_keys: Iterable[str]) -> str:
    """``{kind}-{digest}.parquet``."""
    if kind not in KINDS:
        raise ValueError(f"not a part kind: {kind!r}")
    return f"{kind}-{digest(entry_keys)}.parquet"


@dataclass(frozen=True, slots=True)
class PartRef:
    """A listed part: its key, its kind and, for an hourly part, its hour."""

    key: str
    kind: str
    hour: int | None


def parse_part(key: str, directory: str) -> PartRef | None:
    """The part at ``key`` listed under ``directory`` (a day or an hourly dir); ``None`` for other keys."""
    rest = key[len(directory) :] if key.startswith(directory) else ""
    hour: int | None = None
    if rest.startswith("hour="):
        head, _, rest = rest.partition("/")
        if len(head) != 7 or not head[5:].isdigit() or int(head[5:]) > 23:
            return None
        hour = int(head[5:])
        table, _, rest = rest.partition("/")
        if table != "sessions":
            return None
    kind, dash, tail = rest.partition("-")
    if "/" in rest or not dash or kind not in KINDS or not tail.endswith(".parquet"):
        return None
    return PartRef(key, kind, hour)


def table_key(part: PartRef, table: str) -> str:
    """The key of the same part's file for another table (parts are written for all tables at once)."""
    head, _, name = part.key.rpartition("/sessions/")
    return f"{head}/{_table(table)}/{name}"


def entry_hours(prefix: str, day: str) -> list[str]:
    """The 24 JSON index hour partitions of a day, oldest first."""
    start = day_start(day)
    return keys.index_partitions(prefix, start, start + DAY - 1)


def relative(prefix: str, key: str) -> str:
    """A key below the store prefix (what ``entry_key`` holds: the same archive under another prefix)."""
    return key[len(prefix) :] if key.startswith(prefix) else key
