"""The state DB's schema, its migrations and how a connection to it is opened."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Final

from archiver.archive.state.rows import created_ms_of, layout_instance, session_key

SCHEMA_VERSION: Final = 6
DB_NAME: Final = "state.db"
#: How long a writer waits for the file lock another process holds (`archiver status` reads only).
BUSY_TIMEOUT_MS: Final = 10_000
#: Bytes per page of a state DB created from now on. Every commit appends each page it changed to
#: the WAL whole, and a session's transition changes a few rows of a few hundred bytes: 1 KiB pages
#: write a quarter of the default 4 KiB's bytes per commit (issue 35). A DB created earlier keeps
#: its page size (SQLite cannot change it in WAL mode without a VACUUM).
PAGE_SIZE: Final = 1024
#: Bytes of pages the WAL grows to before a commit checkpoints it into the main file (as pages of
#: the DB's own size: a DB of 1.0 keeps 4 KiB pages). Each page changed since the last checkpoint
#: reaches the main file once, however many commits changed it: a flood of endings rewrites each
#: session's rows six times or so, and a WAL that holds the whole flood writes them back once
#: (issue 35; `benchmarks/mass_end.py` charges the checkpoint still due at its end). SQLite's
#: default, 1,000 pages, checkpointed every MiB.
WAL_BYTES: Final = 40 * 1024 * 1024


#: The transparency log's tables (schema 4): declared once, for new DBs and for the 3 → 4 migration.
LOG_TABLES = """
CREATE TABLE log_pending (
    session_key  TEXT PRIMARY KEY,               -- the archived instance
    entry        BLOB NOT NULL,                  -- its transparency log leaf (archiver/tlog/leaf.py)
    added_at     REAL NOT NULL                   -- when its manifest was committed (pipeline clock)
);
CREATE TABLE log_state (
    writer       TEXT PRIMARY KEY,               -- this daemon's log (archiver/tlog/log.py)
    checkpoint   BLOB NOT NULL                   -- the last signed checkpoint it wrote
)
"""

#: The list mark (schema 5): declared once, for new DBs and for the 4 → 5 migration. One row: when
#: a list poll last found every session still `active` here. Each poll's transaction moves absent
#: sessions out of `active`, so every active row was listed then: the mark stands for all their
#: last-seen times at once, where 1.0 rewrote every active row (5,000 running sessions: some 1,700
#: pages a touch, the largest steady write of a fleet; issue 35).
LIST_MARK_TABLE = """
CREATE TABLE list_mark (
    id  INTEGER PRIMARY KEY CHECK (id = 1),
    at  REAL NOT NULL                            -- epoch seconds (pipeline clock)
)
"""

SCHEMA = (
    """
CREATE TABLE sessions (
    key               TEXT PRIMARY KEY,          -- instance key: '{creation ms}:{id}'
    id                TEXT NOT NULL,             -- the caller-chosen session id
    instance          TEXT NOT NULL DEFAULT '',  -- layout instance name ('' = legacy layout)
    revision          INTEGER NOT NULL DEFAULT 0,  -- times re-opened after a false end
    image             TEXT NOT NULL,
    tag               TEXT NOT NULL DEFAULT '',
    location          TEXT NOT NULL DEFAULT '',
    host              TEXT NOT NULL DEFAULT '',
    created           REAL,                      -- epoch seconds (upstream sends ms)
    labels            TEXT NOT NULL DEFAULT '{}',  -- caller labels only, JSON, never the env
    players           TEXT NOT NULL DEFAULT '[]',  -- JSON list, from the describe at the end
    player_count      INTEGER,
    status            TEXT NOT NULL DEFAULT 'unknown',  -- last upstream status
    state             TEXT NOT NULL,
    last_seen_active  REAL,
    first_seen_ended  REAL,
    fetch_deadline    REAL,
    archived_at       REAL,
    manifest_key      TEXT,
    wake_at           REAL NOT NULL DEFAULT 0,   -- monotonic, this process only
    confirm_attempts  INTEGER NOT NULL DEFAULT 0,
    not_found_at      REAL,                      -- first JSON 404 of a describe (pipeline clock)
    finalize_attempts INTEGER NOT NULL DEFAULT 0,
    done_at           REAL,                      -- archived/failed/skipped at (pipeline clock)
    last_error        TEXT
);
CREATE INDEX sessions_by_state ON sessions(state, wake_at);
CREATE INDEX sessions_by_id ON sessions(id);

CREATE TABLE items (
    id            INTEGER PRIMARY KEY,
    session_key   TEXT NOT NULL REFERENCES sessions(key) ON DELETE CASCADE,
    session_id    TEXT NOT NULL,
    instance      TEXT NOT NULL DEFAULT '',
    kind          TEXT NOT NULL,                 -- logs | artifact
    path          TEXT NOT NULL DEFAULT '',      -- artifact path, '' for logs
    status        TEXT NOT NULL,
    outcome       TEXT,
    attempts      INTEGER NOT NULL DEFAULT 0,
    last_error    TEXT,
    deadline      REAL NOT NULL,
    not_before    REAL NOT NULL DEFAULT 0,       -- monotonic, this process only
    source        TEXT NOT NULL,                 -- request line (no token, no header)
    key           TEXT,
    spool_path    TEXT,
    size          INTEGER,
    sha256        TEXT,
    content_type  TEXT,
    fetched_at    REAL,
    capture       TEXT,                          -- logs from a live capture: complete | gap | diverged
    UNIQUE (session_key, kind, path)
);
CREATE INDEX items_by_status ON items(status, deadline);

CREATE TABLE multipart_uploads (
    key        TEXT PRIMARY KEY,
    upload_id  TEXT NOT NULL,
    sha256     TEXT NOT NULL,
    part_size  INTEGER NOT NULL
);
CREATE TABLE multipart_parts (
    key     TEXT NOT NULL REFERENCES multipart_uploads(key) ON DELETE CASCADE,
    number  INTEGER NOT NULL,
    etag    TEXT NOT NULL,
    PRIMARY KEY (key, number)
);
"""
    + LOG_TABLES
    + ";\n"
    + LIST_MARK_TABLE
    + ";\n"
)

#: Schema 1 → 2: sessions become instances. Rows still to be detected (active, candidate) get
#: their instance name; rows already past their end keep the legacy layout (instance ''), since
#: their objects may already be stored under it.
MIGRATE_1_TO_2 = """
DROP INDEX sessions_by_state;
DROP INDEX items_by_status;
ALTER TABLE items RENAME TO items_v1;
ALTER TABLE sessions RENAME TO sessions_v1;
CREATE TABLE sessions (
    key TEXT PRIMARY KEY, id TEXT NOT NULL, instance TEXT NOT NULL DEFAULT '',
    revision INTEGER NOT NULL DEFAULT 0, image TEXT NOT NULL, tag TEXT NOT NULL DEFAULT '',
    location TEXT NOT NULL DEFAULT '', host TEXT NOT NULL DEFAULT '', created REAL,
    labels TEXT NOT NULL DEFAULT '{}', players TEXT NOT NULL DEFAULT '[]', player_count INTEGER,
    status TEXT NOT NULL DEFAULT 'unknown', state TEXT NOT NULL, last_seen_active REAL,
    first_seen_ended REAL, fetch_deadline REAL, archived_at REAL, manifest_key TEXT,
    wake_at REAL NOT NULL DEFAULT 0, confirm_attempts INTEGER NOT NULL DEFAULT 0, not_found_at REAL,
    finalize_attempts INTEGER NOT NULL DEFAULT 0, done_at REAL, last_error TEXT
);
CREATE INDEX sessions_by_state ON sessions(state, wake_at);
CREATE INDEX sessions_by_id ON sessions(id);
CREATE TABLE items (
    id INTEGER PRIMARY KEY, session_key TEXT NOT NULL REFERENCES sessions(key) ON DELETE CASCADE,
    session_id TEXT NOT NULL, instance TEXT NOT NULL DEFAULT '', kind TEXT NOT NULL,
    path TEXT NOT NULL DEFAULT '', status TEXT NOT NULL, outcome TEXT,
    attempts INTEGER NOT NULL DEFAULT 0, last_error TEXT, deadline REAL NOT NULL,
    not_before REAL NOT NULL DEFAULT 0, source TEXT NOT NULL, key TEXT, spool_path TEXT,
    size INTEGER, sha256 TEXT, content_type TEXT, fetched_at REAL,
    UNIQUE (session_key, kind, path)
);
CREATE INDEX items_by_status ON items(status, deadline);
CREATE INDEX items_by_session ON items(session_key);
INSERT INTO sessions (key, id, instance, image, tag, location, host, created, labels, players,
    player_count, status, state, last_seen_active, first_seen_ended, fetch_deadline, archived_at,
    manifest_key, confirm_attempts, last_error, done_at)
SELECT archiver_session_key(id, created), id,
    CASE WHEN state IN ('active', 'candidate') THEN archiver_instance_name(created) ELSE '' END,
    image, tag, location, host, created, labels, players, player_count, status, state,
    last_seen_active, first_seen_ended, fetch_deadline, archived_at, manifest_key, confirm_attempts,
    last_error, CASE WHEN state = 'archived' THEN archived_at END
FROM sessions_v1;
INSERT INTO items (id, session_key, session_id, instance, kind, path, status, outcome, attempts,
    last_error, deadline, source, key, spool_path, size, sha256, content_type, fetched_at)
SELECT i.id, s.key, i.session_id, s.instance, i.kind, i.path, i.status, i.outcome, i.attempts,
    i.last_error, i.deadline, i.source, i.key, i.spool_path, i.size, i.sha256, i.content_type,
    i.fetched_at
FROM items_v1 i JOIN sessions s ON s.id = i.session_id;
DROP TABLE items_v1;
DROP TABLE sessions_v1
"""


#: Schema 2 → 3: a logs item may come from a live capture (archiver.live), and says how complete it is.
MIGRATE_2_TO_3 = """
ALTER TABLE items ADD COLUMN capture TEXT
"""

#: Schema 3 → 4: the transparency log (archiver/tlog): archives committed but not yet logged, and
#: the last checkpoint each writer signed (consistency is checked from it at start).
MIGRATE_3_TO_4 = LOG_TABLES

#: Schema 4 → 5: the list mark (`LIST_MARK_TABLE`); active rows keep the last-seen times they have.
MIGRATE_4_TO_5 = LIST_MARK_TABLE

#: Schema 5 → 6: no `items_by_session` index. The UNIQUE (session_key, kind, path) index finds a
#: session's items as well, and each insert no longer writes a second copy of the key (issue 35).
MIGRATE_5_TO_6 = """
DROP INDEX IF EXISTS items_by_session
"""

#: From each schema version, the statements that take a DB to the next one.
MIGRATIONS: Final = {
    1: MIGRATE_1_TO_2,
    2: MIGRATE_2_TO_3,
    3: MIGRATE_3_TO_4,
    4: MIGRATE_4_TO_5,
    5: MIGRATE_5_TO_6,
}


def connect(path: Path, *, readonly: bool = False) -> sqlite3.Connection:
    uri = f"file:{path}?mode=ro" if readonly else f"file:{path}"
    # isolation_level=None: we issue BEGIN/COMMIT ourselves, so a transaction is exactly one method.
    conn = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False, timeout=10.0)
    conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
    conn.execute("PRAGMA foreign_keys=ON")
    if not readonly:
        conn.execute("PRAGMA synchronous=FULL")
        # For the schema 1 → 2 migration, which derives instance keys in SQL.
        conn.create_function(
            "archiver_session_key", 2, lambda sid, created: session_key(sid, created_ms_of(created)), deterministic=True
        )
        conn.create_function(
            "archiver_instance_name", 1, lambda created: layout_instance(created_ms_of(created)), deterministic=True
        )
    return conn
