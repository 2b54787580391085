"""grep's pre-filter: of the archives a search selected, those whose logs' token filters say they
may hold the pattern's literal tokens (everything when the pattern has none, and said so)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import duckdb

from archiver.index import bloom, reader
from archiver.index.engine import PartFiles, connect, sql_list
from archiver.layout.manifest import IndexEntry
from archiver.store.base import ObjectStore

#: Said (stderr, the search page) when the pattern has no literal token to look up.
NO_LITERAL = "the pattern has no literal token delimited on both sides (like ' word ' or \\bword\\b): reading every log"


@dataclass(frozen=True, slots=True)
class Selection:
    """The archives whose logs must be read, how many were skipped, and a note for the user (or None)."""

    entries: list[IndexEntry]
    skipped: int
    note: str | None


def select(
    store: ObjectStore, entries: Sequence[IndexEntry], pattern: str, *, fixed: bool, since: float, until: float
) -> Selection:
    """The ``entries`` (in order) whose logs may match ``pattern``: those without a token filter for
    every logs item (not compacted yet, JSON logs) are kept, as are those a filter may match."""
    tokens = bloom.pattern_tokens(pattern, fixed=fixed)
    if tokens is None:
        return Selection(list(entries), 0, NO_LITERAL)
    files = reader.plan(store, since, until).files(PartFiles(store), "items")
    if not files or not entries:
        return Selection(list(entries), 0, None)
    con = connect()
    try:
        rows = con.execute(
            f"SELECT DISTINCT session_id, instance, key, tokens_bloom FROM read_parquet({sql_list(files)}, "
            "union_by_name=true) WHERE kind = 'logs' AND outcome = 'archived' AND ended_at >= ? AND ended_at <= ?",
            [since, until],
        ).fetchall()
    except duckdb.BinderException:
        return Selection(list(entries), 0, None)  # parts written before token filters existed
    finally:
        con.close()
    blooms: dict[tuple[str, str | None], list[str | None]] = defaultdict(list)
    for sid, instance, _key, filt in rows:
        blooms[(sid, instance)].append(filt)

    def may_match(entry: IndexEntry) -> bool:
        found = blooms.get((entry.session_id, entry.instance))
        return not found or any(f is None or bloom.may_contain(f, tokens) for f in found)

    kept = [e for e in entries if may_match(e)]
    return Selection(kept, len(entries) - len(kept), None)
