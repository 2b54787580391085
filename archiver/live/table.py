"""The captures' checkpoint table (``captures.db``, SQLite, WAL): its schema and migration, and
segment rows written (one transaction per checkpoint) and read back (`store` holds the lock)."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from pathlib import Path

from archiver.errors import StateError
from archiver.live.resume import Kept
from archiver.live.segment import Sealed, SegmentRow

DB_NAME = "captures.db"
# A capture's shape is `logshape.NDJSON` (`{streamType, line}` entries) or `logshape.TEXT` (plain lines).
#: 2: finished segments are sealed (`sealed_size`, `sealed_sha256`).
SCHEMA_VERSION = 2
#: Bytes per page of a new checkpoint DB (as the state DB's, archive/state/schema.py: issue 35).
PAGE_SIZE = 1024
#: Bytes of pages its WAL grows to before a commit checkpoints it (as the state DB's
#: `schema.WAL_BYTES`: a flood's rows, inserted, sealed and deleted, reach the main file once).
WAL_BYTES = 20 * 1024 * 1024

_SCHEMA = """
CREATE TABLE IF NOT EXISTS segments (
    key TEXT NOT NULL,              -- the session instance: '{creation ms}:{id}', as in the state DB
    idx INTEGER NOT NULL,           -- 0, then 1, 2, ... each time a replay did not start with the kept lines
    session_id TEXT NOT NULL,
    created_ms INTEGER NOT NULL,
    shape TEXT,                     -- 'ndjson' or 'text' once the first answer told; NULL before
    lines INTEGER NOT NULL,
    size INTEGER NOT NULL,
    chain BLOB NOT NULL,
    state TEXT NOT NULL,            -- following | complete | gap | diverged
    began REAL NOT NULL,
    updated REAL NOT NULL,
    sealed_size INTEGER,            -- a finished segment's lines as the stored log's gzip: its size ...
    sealed_sha256 TEXT,             -- ... and SHA-256 (the file `segment.sealed_path`); NULL: not sealed
    PRIMARY KEY (key, idx)
) WITHOUT ROWID
"""
#: Schema 1 → 2: seals (a v1 store's finished segments are sealed when it is opened).
_MIGRATE_1_TO_2 = (
    "ALTER TABLE segments ADD COLUMN sealed_size INTEGER",
    "ALTER TABLE segments ADD COLUMN sealed_sha256 TEXT",
)


def connect(path: Path) -> sqlite3.Connection:
    """The table at ``path``, created or migrated; StateError when a newer archiver wrote it
    (sqlite3.DatabaseError when it is no SQLite DB: the caller says so)."""
    db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
    # Small pages for a new DB (an existing one keeps its own): each checkpoint rewrites the rows
    # of every session it covers, and the WAL takes every changed page whole.
    db.execute(f"PRAGMA page_size={PAGE_SIZE}")
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    page_size = db.execute("PRAGMA page_size").fetchone()[0]
    db.execute(f"PRAGMA wal_autocheckpoint={WAL_BYTES // page_size}")
    version = db.execute("PRAGMA user_version").fetchone()[0]
    if version > SCHEMA_VERSION:
        db.close()
        raise StateError(
            f"live captures {path} were written by a newer archiver (schema {version}; this one reads {SCHEMA_VERSION})"
        )
    if version == 1:
        for statement in _MIGRATE_1_TO_2:
            db.execute(statement)
    db.execute(_SCHEMA)
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
    return db


def _values(r: SegmentRow, now: float) -> tuple[object, ...]:
    sealed = r.sealed
    return (r.key, r.index, r.session_id, r.created_ms, r.shape, r.kept.lines, r.kept.size, r.kept.chain, r.state,
            now, now, None if sealed is None else sealed.size, None if sealed is None else sealed.sha256)  # fmt: skip


def record(db: sqlite3.Connection, rows: Sequence[SegmentRow], removed: frozenset[str], now: float) -> None:
    """One transaction: the rows of ``removed`` keys deleted, then ``rows`` written (as of ``now``)."""
    db.execute("BEGIN IMMEDIATE")
    try:
        # Removals first: a capture begun again after its removal writes its new rows after.
        db.executemany("DELETE FROM segments WHERE key = ?", [(key,) for key in removed])
        db.executemany(
            "INSERT INTO segments (key, idx, session_id, created_ms, shape, lines, size, chain, state, "
            "began, updated, sealed_size, sealed_sha256) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT (key, idx) DO UPDATE SET shape = excluded.shape, lines = excluded.lines, "
            "size = excluded.size, chain = excluded.chain, state = excluded.state, "
            "updated = excluded.updated, sealed_size = excluded.sealed_size, "
            "sealed_sha256 = excluded.sealed_sha256",
            [_values(r, now) for r in rows],
        )
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise


def rows(
    db: sqlite3.Connection, sql: str, params: Sequence[object], path_of: Callable[[str, int], Path], home: Path
) -> list[SegmentRow]:
    """The segments a ``SELECT *`` query finds, each naming its lines file where ``path_of`` finds it."""
    cursor = db.execute(sql, params)
    names = [d[0] for d in cursor.description]
    found = [dict(zip(names, values, strict=True)) for values in cursor.fetchall()]
    return [
        SegmentRow(
            key=r["key"],
            index=r["idx"],
            session_id=r["session_id"],
            created_ms=r["created_ms"],
            shape=r["shape"],
            kept=Kept(r["lines"], r["size"], bytes(r["chain"])),
            state=r["state"],
            path=path_of(r["key"], r["idx"]),
            home=home,
            sealed=None if r["sealed_size"] is None else Sealed(r["sealed_size"], r["sealed_sha256"]),
        )
        for r in found
    ]
