"""The durable state DB (SQLite): sessions, archive items, multipart journal; every SQL statement lives here.

One writer connection guarded by a lock; each public write method is one `BEGIN IMMEDIATE`
transaction that has committed (WAL, `synchronous=FULL`: on disk) before the method returns, so
a caller may act on it (delete a spool file, tell the store) only afterwards. Readers (`status`,
gauges) use their own connection: WAL lets them run beside the writer.

Two clocks appear in rows. Deadlines and timestamps (`deadline`, `last_seen_active`, ...) are in the
pipeline's clock (epoch seconds). Retry gates (`not_before`, `wake_at`) are `time.monotonic()`
values of the running process only: `reset_in_flight()` zeroes them at start-up, which is exactly
"retry everything now" after a restart and keeps a frozen or jumping test clock from stalling
backoffs.

A row is one session *instance*: the same caller-chosen id with another creation time is another
row (`key` = `{creation ms}:{id}`), archived under its own `instance` in the store layout ('' for
rows migrated mid-way from schema 1, which keep the legacy layout).

Session states: `active` (listed) → `candidate` (absent from a successful list, to be confirmed)
→ `ended` (confirmed; items exist) → `finalizing` (every item has an outcome; `archived_at`
fixed so a re-written manifest is byte-identical) → `archived` (manifest and index stored), or
`failed` (finalization kept failing past the deadline). `skipped`: ended sessions found on the
very first start with backfill turned off. A row that is listed again after it was taken for
ended is re-opened (`revision` + 1, a new instance name), so its real end is archived too.
Terminal rows (`archived`, `failed`, `skipped`) are pruned after a while: the store is the record.
Item statuses: `pending_fetch` → `fetching` → `spooled` → `uploading` → `done` (with an outcome).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import sqlite3
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from archiver.errors import StateError
from archiver.layout import keys
from archiver.store.base import JournalEntry
from archiver.upstream.models import Session

SCHEMA_VERSION: Final = 2
DB_NAME: Final = "state.db"
#: How long a writer waits for the file lock another process holds (`archiver status` reads only).
BUSY_TIMEOUT_MS: Final = 10_000


_SCHEMA = """
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
    UNIQUE (session_key, kind, path)
);
CREATE INDEX items_by_status ON items(status, deadline);
CREATE INDEX items_by_session ON items(session_key);

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

#: Schema 1 → 2: sessions become instances. Rows still to be detected (active, candidate) get
#: their instance name; rows already past their end keep the legacy layout (instance ''), since
#: their objects may already be stored under it.
_MIGRATE_1_TO_2 = """
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

#: States a session row never leaves by itself (pruned after `prune_after`).
TERMINAL_STATES: Final = ("archived", "failed", "skipped")


def created_ms_of(created_seconds: float | None) -> int:
    """Whole milliseconds of a creation time in seconds (the epsilon absorbs float error of * 1000)."""
    return math.floor((created_seconds or 0.0) * 1000.0 + 1e-3)


def session_key(sid: str, created_ms: float) -> str:
    """The state DB key of one session instance: `{creation ms}:{id}` (ms first: ids may hold ':')."""
    return f"{math.floor(created_ms + 1e-3)}:{sid}"


def session_key_of(session: Session) -> str:
    return session_key(session.id, session.created_ms)


def layout_instance(created_ms: float, revision: int = 0) -> str:
    """The instance segment of the store layout: creation time, plus `-r{n}` after a re-open."""
    return keys.instance_name(math.floor(created_ms + 1e-3), revision)


_OPEN_ITEM_STATUSES = ("pending_fetch", "fetching", "spooled", "uploading")


@dataclass(frozen=True, slots=True)
class SessionRow:
    """One session instance as the state DB knows it."""

    key: str
    id: str
    instance: str
    image: str
    tag: str
    location: str
    host: str
    created: float | None
    labels: Mapping[str, str]
    players: tuple[str, ...]
    player_count: int | None
    status: str
    state: str
    last_seen_active: float | None
    first_seen_ended: float | None
    fetch_deadline: float | None
    archived_at: float | None
    manifest_key: str | None
    revision: int = 0
    last_error: str | None = None
    finalize_attempts: int = 0
    not_found_at: float | None = None

    @property
    def created_ms(self) -> int:
        return created_ms_of(self.created)


@dataclass(frozen=True, slots=True)
class ItemRow:
    """One archive item: a session's logs or one artifact path."""

    id: int
    session_key: str
    session_id: str
    instance: str
    kind: str
    path: str
    status: str
    outcome: str | None
    attempts: int
    last_error: str | None
    deadline: float
    source: str
    key: str | None
    spool_path: str | None
    size: int | None
    sha256: str | None
    content_type: str | None
    fetched_at: float | None


@dataclass(frozen=True, slots=True)
class Reopened:
    """Rows a poll re-opened (listed again after they were taken for ended), and the spool files
    of their dropped work, to delete now that the commit no longer refers to them."""

    keys: tuple[str, ...] = ()
    spool_paths: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class NewItem:
    """An item to create when a session's end is confirmed."""

    kind: str
    path: str
    source: str


@dataclass(frozen=True, slots=True)
class PendingItem:
    """A not yet finished item, for `archiver status` (time_left is None once fetched: no deadline)."""

    session_id: str
    instance: str
    kind: str
    path: str
    stage: str  # fetch | upload
    status: str
    deadline: float
    time_left: float | None
    attempts: int
    last_error: str | None


@dataclass(frozen=True, slots=True)
class Backlog:
    """What the gauges show: items per stage, the earliest fetch deadline, spooled bytes."""

    pending_fetch: int
    pending_upload: int
    next_fetch_deadline: float | None
    spool_bytes: int
    candidates: int
    finalizing: int
    failed: int = 0

    @property
    def idle(self) -> bool:
        return not (self.pending_fetch or self.pending_upload or self.candidates or self.finalizing)


_SESSION_COLUMNS = (
    "key, id, instance, image, tag, location, host, created, labels, players, player_count, status, state, "
    "last_seen_active, first_seen_ended, fetch_deadline, archived_at, manifest_key, revision, last_error, "
    "finalize_attempts, not_found_at"
)
_STATE_COLUMN = 12
_ITEM_COLUMNS = (
    "id, session_key, session_id, instance, kind, path, status, outcome, attempts, last_error, deadline, "
    "source, key, spool_path, size, sha256, content_type, fetched_at"
)


def _session_row(r: Sequence[Any]) -> SessionRow:
    return SessionRow(
        key=r[0],
        id=r[1],
        instance=r[2],
        image=r[3],
        tag=r[4],
        location=r[5],
        host=r[6],
        created=r[7],
        labels=json.loads(r[8]),
        players=tuple(json.loads(r[9])),
        player_count=r[10],
        status=r[11],
        state=r[12],
        last_seen_active=r[13],
        first_seen_ended=r[14],
        fetch_deadline=r[15],
        archived_at=r[16],
        manifest_key=r[17],
        revision=r[18],
        last_error=r[19],
        finalize_attempts=r[20],
        not_found_at=r[21],
    )


def _item_row(r: Sequence[Any]) -> ItemRow:
    return ItemRow(*r)


def _chunks(values: Sequence[str], size: int) -> Iterator[Sequence[str]]:
    for start in range(0, len(values), size):
        yield values[start : start + size]


def _labels_json(session: Session) -> str:
    # Caller labels only (`labels.tags`); image labels and env keys never reach the archive.
    return json.dumps(dict(session.labels), sort_keys=True, ensure_ascii=True)


def _connect(path: Path, *, readonly: bool = False) -> sqlite3.Connection:
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


class StateDB:
    """The state DB of one archiver (`{state_dir}/state.db`). Thread-safe."""

    def __init__(self, path: Path, *, readonly: bool = False) -> None:
        self.path = path
        self.readonly = readonly
        self._write_lock = threading.Lock()
        self._read_lock = threading.Lock()
        #: True when this open created the DB: the archiver's very first start on this state dir.
        self.created = False
        try:
            if readonly:
                self._conn = _connect(path, readonly=True)
            else:
                path.parent.mkdir(parents=True, exist_ok=True)
                self._conn = _connect(path)
                mode = self._conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
                if str(mode).lower() != "wal":
                    raise StateError(f"state DB {path}: the filesystem does not support WAL mode")
                self._migrate()
            self._reader = _connect(path, readonly=readonly)
            version = self._reader.execute("PRAGMA user_version").fetchone()[0]
        except sqlite3.DatabaseError as exc:
            raise StateError(f"state DB {path} cannot be opened: {exc}") from None
        if version != SCHEMA_VERSION:
            raise StateError(f"state DB {path} has schema version {version}, this archiver uses {SCHEMA_VERSION}")
        self.journal = SqliteJournal(self)

    @classmethod
    def open(cls, state_dir: Path) -> StateDB:
        """Open (creating if needed) the writable state DB in `state_dir`."""
        return cls(state_dir / DB_NAME)

    @classmethod
    def open_readonly(cls, state_dir: Path) -> StateDB:
        """Open an existing state DB for reading beside a running daemon (`archiver status`)."""
        path = state_dir / DB_NAME
        if not path.is_file():
            raise StateError(f"no state DB at {path} (has `archiver run` used this --state-dir?)")
        return cls(path, readonly=True)

    def close(self) -> None:
        with self._write_lock, self._read_lock:
            self._reader.close()
            if not self.readonly:
                self._conn.close()

    def _migrate(self) -> None:
        version = self._conn.execute("PRAGMA user_version").fetchone()[0]
        if version == SCHEMA_VERSION:
            return
        if version > SCHEMA_VERSION:
            raise StateError(
                f"state DB {self.path} was written by a newer archiver (schema {version}); "
                f"this one reads schema {SCHEMA_VERSION}"
            )
        if version == 1:
            with self.write() as db:
                for statement in _MIGRATE_1_TO_2.split(";"):
                    if statement.strip():
                        db.execute(statement)
                db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
            return
        if version != 0:
            raise StateError(f"state DB {self.path}: no migration from schema {version}")
        self.created = True
        with self.write() as db:
            # Statement by statement: executescript() would COMMIT in the middle of our transaction
            # (the schema has no ";" inside comments or strings, so splitting on it is exact).
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    db.execute(statement)
            db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")

    # --- transactions -----------------------------------------------------------------------

    @contextlib.contextmanager
    def write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction, committed (durable) when the block ends, rolled back on error."""
        if self.readonly:
            raise StateError("the state DB is open read-only")
        with self._write_lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield self._conn
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

    @contextlib.contextmanager
    def read(self) -> Iterator[sqlite3.Connection]:
        """A consistent read snapshot on the reader connection."""
        with self._read_lock:
            self._reader.execute("BEGIN")
            try:
                yield self._reader
            finally:
                self._reader.execute("COMMIT")

    # --- detection --------------------------------------------------------------------------

    def record_poll(
        self,
        upserts: Sequence[Session],
        gone: Sequence[tuple[str, float | None]],
        now: float,
        *,
        touch_active: bool,
    ) -> Reopened:
        """One successful list poll, in one transaction. Returns what it re-opened.

        `upserts`: listed (non-terminal) sessions that are new or whose metadata changed; they
        re-activate candidates, and re-open rows taken for ended meanwhile (a false end: their
        unfinished work is dropped, `revision` + 1 and a new instance name, so the real end gets an
        archive of its own). `gone`: (key, last seen) of sessions known active but absent: they
        become candidates (None keeps the stored last_seen_active). `touch_active`: also set
        last_seen_active=now on every remaining active row (done only every few polls: a stale
        value only makes a deadline earlier, never later).
        """
        rows = [
            (
                session_key_of(s), s.id, layout_instance(s.created_ms), s.image, s.tag, s.location, s.host,
                s.created_seconds, _labels_json(s), s.player_count, s.status, now,
            )
            for s in upserts
        ]  # fmt: skip
        reopened = Reopened()
        with self.write() as db:
            if rows:
                reopened = self._reopen(db, [r[0] for r in rows])
                db.executemany(
                    """
                    INSERT INTO sessions (key, id, instance, image, tag, location, host, created, labels,
                                          player_count, status, state, last_seen_active)
                    VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'active', ?)
                    ON CONFLICT (key) DO UPDATE SET
                        image = excluded.image, tag = excluded.tag, location = excluded.location,
                        host = excluded.host, labels = excluded.labels,
                        player_count = excluded.player_count, status = excluded.status,
                        state = 'active', last_seen_active = excluded.last_seen_active,
                        first_seen_ended = NULL, wake_at = 0, confirm_attempts = 0, not_found_at = NULL
                    WHERE sessions.state IN ('active', 'candidate')
                    """,
                    rows,
                )
            if gone:
                db.executemany(
                    """
                    UPDATE sessions SET state = 'candidate',
                        last_seen_active = COALESCE(?, last_seen_active),
                        first_seen_ended = ?, wake_at = 0, confirm_attempts = 0, not_found_at = NULL
                    WHERE key = ? AND state = 'active'
                    """,
                    [(seen, now, key) for key, seen in gone],
                )
            if touch_active:
                db.execute(
                    "UPDATE sessions SET last_seen_active = ? WHERE state = 'active' AND last_seen_active < ?",
                    (now, now),
                )
        return reopened

    @staticmethod
    def _reopen(db: sqlite3.Connection, session_keys: Sequence[str]) -> Reopened:
        """Re-open the rows of `session_keys` that are past their end (see record_poll)."""
        spool_paths: list[str] = []
        reopened: list[str] = []
        for chunk in _chunks(session_keys, 500):
            marks = ",".join("?" * len(chunk))
            found = db.execute(
                f"SELECT key, created, revision FROM sessions WHERE key IN ({marks}) "
                "AND state NOT IN ('active', 'candidate')",
                chunk,
            ).fetchall()
            for key, created, revision in found:
                spool_paths += [
                    r[0]
                    for r in db.execute(
                        "SELECT spool_path FROM items WHERE session_key = ? AND spool_path IS NOT NULL "
                        "AND status != 'done'",
                        (key,),
                    )
                ]
                db.execute("DELETE FROM items WHERE session_key = ?", (key,))
                db.execute(
                    "UPDATE sessions SET state = 'candidate', revision = ?, instance = ?, fetch_deadline = NULL, "
                    "archived_at = NULL, manifest_key = NULL, done_at = NULL, finalize_attempts = 0, "
                    "last_error = NULL WHERE key = ?",
                    (revision + 1, layout_instance(created_ms_of(created), revision + 1), key),
                )
                reopened.append(key)
        return Reopened(tuple(reopened), tuple(spool_paths))

    def active_session_keys(self) -> list[str]:
        with self.read() as db:
            return [r[0] for r in db.execute("SELECT key FROM sessions WHERE state = 'active'")]

    def states_of(self, session_keys: Iterable[str]) -> dict[str, str]:
        """key → state of those of `session_keys` the DB knows."""
        found: dict[str, str] = {}
        with self.read() as db:
            for chunk in _chunks(list(session_keys), 500):
                marks = ",".join("?" * len(chunk))
                found.update(db.execute(f"SELECT key, state FROM sessions WHERE key IN ({marks})", chunk).fetchall())
        return found

    def claim_candidates(self, now_mono: float, lease: float, limit: int) -> list[SessionRow]:
        """Candidates due for a describe; leased (`wake_at` moved) so another confirmer skips them."""
        with self.write() as db:
            rows = db.execute(
                f"SELECT {_SESSION_COLUMNS} FROM sessions WHERE state = 'candidate' AND wake_at <= ? "
                "ORDER BY first_seen_ended LIMIT ?",
                (now_mono, limit),
            ).fetchall()
            db.executemany("UPDATE sessions SET wake_at = ? WHERE key = ?", [(now_mono + lease, r[0]) for r in rows])
        return [_session_row(r) for r in rows]

    def next_candidate_wake(self) -> float | None:
        with self.read() as db:
            value = db.execute("SELECT MIN(wake_at) FROM sessions WHERE state = 'candidate'").fetchone()[0]
        return None if value is None else float(value)

    def candidate_alive(self, key: str, now: float, retry_at: float) -> None:
        """The describe says it still runs (listed late?): seen alive now, check again at `retry_at`."""
        with self.write() as db:
            db.execute(
                "UPDATE sessions SET last_seen_active = MAX(COALESCE(last_seen_active, 0), ?), "
                "wake_at = ?, confirm_attempts = confirm_attempts + 1, last_error = NULL, not_found_at = NULL "
                "WHERE key = ? AND state = 'candidate'",
                (now, retry_at, key),
            )

    def candidate_retry(self, key: str, retry_at: float, error: str) -> None:
        """The describe failed (transient or not): try again at `retry_at`."""
        with self.write() as db:
            db.execute(
                "UPDATE sessions SET wake_at = ?, confirm_attempts = confirm_attempts + 1, last_error = ? "
                "WHERE key = ? AND state = 'candidate'",
                (retry_at, error[:500], key),
            )

    def candidate_not_found(self, key: str, now: float, retry_at: float) -> float:
        """The API's own 404 for a candidate: returns when it first said so (the end needs it twice)."""
        with self.write() as db:
            db.execute(
                "UPDATE sessions SET not_found_at = COALESCE(not_found_at, ?), wake_at = ?, "
                "confirm_attempts = confirm_attempts + 1, last_error = 'describe answered 404' "
                "WHERE key = ? AND state = 'candidate'",
                (now, retry_at, key),
            )
            row = db.execute("SELECT not_found_at FROM sessions WHERE key = ?", (key,)).fetchone()
        return float(row[0]) if row is not None and row[0] is not None else now

    def end_session(
        self,
        key: str,
        *,
        described: Session | None,
        deadline_for: Callable[[SessionRow], float],
        items_for: Callable[[SessionRow], Sequence[NewItem]],
        now: float,
        backfill: bool = False,
    ) -> SessionRow | None:
        """Confirmed ended: store the describe's metadata, fix the deadline and create the items, at once.

        `deadline_for(row)` / `items_for(row)` compute the fetch deadline and the items from the
        (updated) row. Returns the row, or None when the session was not a candidate (re-listed
        meanwhile, already ended) — or, with `backfill`, when it is already past its end. An
        instance unknown to the DB is created from `described` (with `backfill` only).
        """
        with self.write() as db:
            return self._end(db, key, described, deadline_for, items_for, now, backfill=backfill)

    def end_sessions(
        self,
        ended: Sequence[Session],
        *,
        deadline_for: Callable[[SessionRow], float],
        items_for: Callable[[SessionRow], Sequence[NewItem]],
        now: float,
    ) -> list[SessionRow]:
        """`end_session(backfill=True)` for many sessions the upstream lists as ended, in one transaction."""
        with self.write() as db:
            rows = [self._end(db, session_key_of(s), s, deadline_for, items_for, now, backfill=True) for s in ended]
        return [r for r in rows if r is not None]

    def skip_sessions(self, ended: Sequence[Session], now: float) -> int:
        """Record ended sessions as `skipped` (first start without backfill): never archived, pruned later."""
        with self.write() as db:
            return db.executemany(
                "INSERT OR IGNORE INTO sessions (key, id, instance, image, tag, location, host, created, labels, "
                "player_count, status, state, first_seen_ended, done_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'skipped', ?, ?)",
                [
                    (
                        session_key_of(s),
                        s.id,
                        layout_instance(s.created_ms),
                        s.image,
                        s.tag,
                        s.location,
                        s.host,
                        s.created_seconds,
                        _labels_json(s),
                        s.player_count,
                        s.status,
                        now,
                        now,
                    )
                    for s in ended
                ],
            ).rowcount

    @staticmethod
    def _end(
        db: sqlite3.Connection,
        key: str,
        described: Session | None,
        deadline_for: Callable[[SessionRow], float],
        items_for: Callable[[SessionRow], Sequence[NewItem]],
        now: float,
        *,
        backfill: bool,
    ) -> SessionRow | None:
        found = db.execute(f"SELECT {_SESSION_COLUMNS} FROM sessions WHERE key = ?", (key,)).fetchone()
        allowed = ("active", "candidate") if backfill else ("candidate",)
        if found is None:
            if not backfill or described is None:
                return None
            db.execute(
                "INSERT INTO sessions (key, id, instance, image, tag, location, host, created, labels, player_count, "
                "status, state, first_seen_ended) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'candidate', ?)",
                (
                    key, described.id, layout_instance(described.created_ms), described.image, described.tag,
                    described.location, described.host, described.created_seconds, _labels_json(described),
                    described.player_count, described.status, now,
                ),
            )  # fmt: skip
        elif found[_STATE_COLUMN] not in allowed:
            return None
        if described is not None:
            db.execute(
                "UPDATE sessions SET image = ?, tag = ?, location = ?, host = ?, "
                "labels = ?, players = ?, player_count = ?, status = ? WHERE key = ?",
                (
                    described.image, described.tag, described.location, described.host,
                    _labels_json(described), json.dumps(list(described.players or ())),
                    described.player_count, described.status, key,
                ),
            )  # fmt: skip
        row = _session_row(db.execute(f"SELECT {_SESSION_COLUMNS} FROM sessions WHERE key = ?", (key,)).fetchone())
        deadline = deadline_for(row)
        items = items_for(row)
        db.execute(
            "UPDATE sessions SET state = 'ended', fetch_deadline = ?, "
            "first_seen_ended = COALESCE(first_seen_ended, ?), wake_at = 0, last_error = NULL "
            "WHERE key = ?",
            (deadline, now, key),
        )
        db.executemany(
            "INSERT OR IGNORE INTO items (session_key, session_id, instance, kind, path, status, deadline, source) "
            "VALUES (?, ?, ?, ?, ?, 'pending_fetch', ?, ?)",
            [(key, row.id, row.instance, i.kind, i.path, deadline, i.source) for i in items],
        )
        if not items:
            # Nothing to fetch at all: the session is complete as soon as it ended.
            db.execute("UPDATE sessions SET state = 'finalizing', archived_at = ? WHERE key = ?", (now, key))
        final = db.execute(f"SELECT {_SESSION_COLUMNS} FROM sessions WHERE key = ?", (key,)).fetchone()
        return _session_row(final)

    def session(self, key: str) -> SessionRow | None:
        with self.read() as db:
            row = db.execute(f"SELECT {_SESSION_COLUMNS} FROM sessions WHERE key = ?", (key,)).fetchone()
        return None if row is None else _session_row(row)

    def latest(self, sid: str) -> SessionRow | None:
        """The newest instance of a session id (None when the DB has none)."""
        rows = self.sessions_by_id(sid)
        return rows[0] if rows else None

    def sessions_by_id(self, sid: str) -> list[SessionRow]:
        """Every instance of a session id, newest creation first."""
        with self.read() as db:
            rows = db.execute(
                f"SELECT {_SESSION_COLUMNS} FROM sessions WHERE id = ? ORDER BY created DESC, revision DESC", (sid,)
            ).fetchall()
        return [_session_row(r) for r in rows]

    def sessions_in(self, state: str) -> list[SessionRow]:
        with self.read() as db:
            rows = db.execute(
                f"SELECT {_SESSION_COLUMNS} FROM sessions WHERE state = ? ORDER BY key", (state,)
            ).fetchall()
        return [_session_row(r) for r in rows]

    # --- items ------------------------------------------------------------------------------

    def items_of(self, key: str) -> list[ItemRow]:
        with self.read() as db:
            rows = db.execute(
                f"SELECT {_ITEM_COLUMNS} FROM items WHERE session_key = ? ORDER BY kind DESC, path", (key,)
            ).fetchall()
        return [_item_row(r) for r in rows]

    def claim_fetch(self, now_mono: float) -> ItemRow | None:
        """The pending item with the earliest deadline whose retry gate is open, now `fetching`."""
        with self.write() as db:
            row = db.execute(
                f"SELECT {_ITEM_COLUMNS} FROM items WHERE status = 'pending_fetch' AND not_before <= ? "
                "ORDER BY deadline, id LIMIT 1",
                (now_mono,),
            ).fetchone()
            if row is None:
                return None
            db.execute("UPDATE items SET status = 'fetching', attempts = attempts + 1 WHERE id = ?", (row[0],))
        item = _item_row(row)
        return dataclasses.replace(item, status="fetching", attempts=item.attempts + 1)

    def claim_upload(self, now_mono: float) -> ItemRow | None:
        """The oldest spooled item whose retry gate is open, now `uploading`."""
        with self.write() as db:
            row = db.execute(
                f"SELECT {_ITEM_COLUMNS} FROM items WHERE status = 'spooled' AND not_before <= ? ORDER BY id LIMIT 1",
                (now_mono,),
            ).fetchone()
            if row is None:
                return None
            db.execute("UPDATE items SET status = 'uploading' WHERE id = ?", (row[0],))
        return dataclasses.replace(_item_row(row), status="uploading")

    def next_gate(self, status: str) -> float | None:
        """The earliest retry gate (monotonic) among items in `status`, for a worker's wait."""
        with self.read() as db:
            value = db.execute("SELECT MIN(not_before) FROM items WHERE status = ?", (status,)).fetchone()[0]
        return None if value is None else float(value)

    def mark_spooled(
        self,
        item_id: int,
        *,
        spool_path: str,
        size: int,
        sha256: str,
        content_type: str,
        source: str,
        key: str,
        fetched_at: float,
    ) -> None:
        with self.write() as db:
            db.execute(
                "UPDATE items SET status = 'spooled', spool_path = ?, size = ?, sha256 = ?, "
                "content_type = ?, source = ?, key = ?, fetched_at = ?, not_before = 0, last_error = NULL "
                "WHERE id = ? AND status = 'fetching'",
                (spool_path, size, sha256, content_type, source, key, fetched_at, item_id),
            )

    def retry_item(self, item_id: int, *, status: str, not_before: float, error: str) -> None:
        """Back to `status` (pending_fetch or spooled), not to be picked before `not_before`.

        Only an item still in flight moves: an error raised after the item's final write (a gauge
        refresh, a metrics call) must not undo an outcome that is already committed.
        """
        with self.write() as db:
            db.execute(
                "UPDATE items SET status = ?, not_before = ?, last_error = ?"
                " WHERE id = ? AND status IN ('fetching', 'uploading')",
                (status, not_before, error[:500], item_id),
            )

    def finish_item(
        self,
        item_id: int,
        outcome: str,
        *,
        now: float,
        error: str | None = None,
        source: str | None = None,
        key: str | None = None,
        spool_path: str | None = None,
    ) -> bool:
        """The item reached its outcome. True when that completed its session, which is then
        `finalizing` with `archived_at=now` fixed in the same transaction."""
        with self.write() as db:
            found = db.execute("SELECT session_key FROM items WHERE id = ?", (item_id,)).fetchone()
            if found is None:  # dropped meanwhile: its session was re-opened
                return False
            db.execute(
                "UPDATE items SET status = 'done', outcome = ?, last_error = ?, "
                "source = COALESCE(?, source), key = COALESCE(?, key), spool_path = ? WHERE id = ?",
                (outcome, error[:500] if error else None, source, key, spool_path, item_id),
            )
            skey = found[0]
            open_left = db.execute(
                "SELECT COUNT(*) FROM items WHERE session_key = ? AND status != 'done'", (skey,)
            ).fetchone()[0]
            if open_left:
                return False
            changed = db.execute(
                "UPDATE sessions SET state = 'finalizing', archived_at = ?, wake_at = 0 "
                "WHERE key = ? AND state = 'ended'",
                (now, skey),
            ).rowcount
        return bool(changed)

    # --- finalization -----------------------------------------------------------------------

    def claim_finalize(self, now_mono: float, lease: float) -> SessionRow | None:
        """A complete session due for its manifest, leased so that no other worker takes it meanwhile.

        Ordered by retry gate, so a session whose finalization keeps failing (backed off) never
        keeps the others waiting.
        """
        with self.write() as db:
            row = db.execute(
                f"SELECT {_SESSION_COLUMNS} FROM sessions WHERE state = 'finalizing' AND wake_at <= ? "
                "ORDER BY wake_at, archived_at LIMIT 1",
                (now_mono,),
            ).fetchone()
            if row is None:
                return None
            db.execute("UPDATE sessions SET wake_at = ? WHERE key = ?", (now_mono + lease, row[0]))
        return _session_row(row)

    def next_finalize_wake(self) -> float | None:
        with self.read() as db:
            value = db.execute("SELECT MIN(wake_at) FROM sessions WHERE state = 'finalizing'").fetchone()[0]
        return None if value is None else float(value)

    def finalize_retry(self, key: str, retry_at: float, error: str) -> int:
        """Finalization failed: try again at `retry_at`. Returns the attempts so far."""
        with self.write() as db:
            db.execute(
                "UPDATE sessions SET wake_at = ?, finalize_attempts = finalize_attempts + 1, last_error = ? "
                "WHERE key = ? AND state = 'finalizing'",
                (retry_at, error[:500], key),
            )
            row = db.execute("SELECT finalize_attempts FROM sessions WHERE key = ?", (key,)).fetchone()
        return int(row[0]) if row else 0

    def fail_session(self, key: str, reason: str, now: float) -> bool:
        """Give up on a session whose finalization kept failing past its deadline (kept for `status`)."""
        with self.write() as db:
            return bool(
                db.execute(
                    "UPDATE sessions SET state = 'failed', last_error = ?, done_at = ? "
                    "WHERE key = ? AND state = 'finalizing'",
                    (reason[:500], now, key),
                ).rowcount
            )

    def mark_archived(self, key: str, manifest_key: str, now: float | None = None) -> bool:
        with self.write() as db:
            return bool(
                db.execute(
                    "UPDATE sessions SET state = 'archived', manifest_key = ?, done_at = COALESCE(?, archived_at), "
                    "last_error = NULL WHERE key = ? AND state = 'finalizing'",
                    (manifest_key, now, key),
                ).rowcount
            )

    def prune(self, before: float) -> int:
        """Forget terminal sessions (and their items) done before `before`: the store is the record."""
        marks = ",".join("?" * len(TERMINAL_STATES))
        with self.write() as db:
            return db.execute(
                f"DELETE FROM sessions WHERE state IN ({marks}) AND COALESCE(done_at, 0) < ?",
                (*TERMINAL_STATES, before),
            ).rowcount

    def last_archived_at(self) -> float | None:
        """When the newest manifest was written (restores the gauge after a restart)."""
        with self.read() as db:
            value = db.execute("SELECT MAX(done_at) FROM sessions WHERE state = 'archived'").fetchone()[0]
        return None if value is None else float(value)

    def failed_sessions(self) -> list[SessionRow]:
        """Sessions given up on (until pruned), newest first, for `archiver status`."""
        with self.read() as db:
            rows = db.execute(
                f"SELECT {_SESSION_COLUMNS} FROM sessions WHERE state = 'failed' ORDER BY done_at DESC"
            ).fetchall()
        return [_session_row(r) for r in rows]

    # --- start-up ---------------------------------------------------------------------------

    def reset_in_flight(self) -> tuple[int, int]:
        """After a restart: fetching → pending_fetch, uploading → spooled, every retry gate open.

        Returns (fetches reset, uploads reset).
        """
        with self.write() as db:
            fetches = db.execute("UPDATE items SET status = 'pending_fetch' WHERE status = 'fetching'").rowcount
            uploads = db.execute("UPDATE items SET status = 'spooled' WHERE status = 'uploading'").rowcount
            db.execute("UPDATE items SET not_before = 0 WHERE not_before != 0")
            db.execute("UPDATE sessions SET wake_at = 0 WHERE wake_at != 0")
        return fetches, uploads

    def spool_paths_in_use(self) -> set[str]:
        with self.read() as db:
            return {
                r[0]
                for r in db.execute(
                    "SELECT spool_path FROM items WHERE status IN ('spooled', 'uploading') AND spool_path IS NOT NULL"
                )
            }

    # --- reporting --------------------------------------------------------------------------

    def backlog(self) -> Backlog:
        marks = ",".join("?" * len(_OPEN_ITEM_STATUSES))
        with self.read() as db:
            counts: dict[str, int] = {}
            next_deadline: float | None = None
            spool = 0
            for status, count, deadline, size in db.execute(
                f"SELECT status, COUNT(*), MIN(deadline), SUM(COALESCE(size, 0)) FROM items "
                f"WHERE status IN ({marks}) GROUP BY status",
                _OPEN_ITEM_STATUSES,
            ):
                counts[status] = count
                if status in ("pending_fetch", "fetching") and deadline is not None:
                    next_deadline = deadline if next_deadline is None else min(next_deadline, deadline)
                if status in ("spooled", "uploading"):
                    spool += int(size or 0)
            states = dict(
                db.execute(
                    "SELECT state, COUNT(*) FROM sessions WHERE state IN ('candidate', 'finalizing', 'failed') "
                    "GROUP BY state"
                ).fetchall()
            )
        return Backlog(
            pending_fetch=counts.get("pending_fetch", 0) + counts.get("fetching", 0),
            pending_upload=counts.get("spooled", 0) + counts.get("uploading", 0),
            next_fetch_deadline=next_deadline,
            spool_bytes=spool,
            candidates=int(states.get("candidate", 0)),
            finalizing=int(states.get("finalizing", 0)),
            failed=int(states.get("failed", 0)),
        )

    def pending_items(self, now: float) -> list[PendingItem]:
        """Every unfinished item, earliest deadline first."""
        marks = ",".join("?" * len(_OPEN_ITEM_STATUSES))
        with self.read() as db:
            rows = db.execute(
                f"SELECT session_id, instance, kind, path, status, deadline, attempts, last_error FROM items "
                f"WHERE status IN ({marks}) ORDER BY deadline, id",
                _OPEN_ITEM_STATUSES,
            ).fetchall()
        result = []
        for sid, instance, kind, path, status, deadline, attempts, error in rows:
            fetch = status in ("pending_fetch", "fetching")
            result.append(
                PendingItem(
                    session_id=sid,
                    instance=instance,
                    kind=kind,
                    path=path,
                    stage="fetch" if fetch else "upload",
                    status=status,
                    deadline=deadline,
                    time_left=deadline - now if fetch else None,
                    attempts=attempts,
                    last_error=error,
                )
            )
        return result

    def attention_items(self, now: float) -> list[PendingItem]:
        """`archiver status`: every unfinished item, then every session given up on (stage `failed`)."""
        failed = [
            PendingItem(
                session_id=row.id,
                instance=row.instance,
                kind="session",
                path="",
                stage="failed",
                status="failed",
                deadline=row.fetch_deadline or 0.0,
                time_left=None,
                attempts=row.finalize_attempts,
                last_error=row.last_error,
            )
            for row in self.failed_sessions()
        ]
        return [*self.pending_items(now), *failed]

    def outcome_counts(self) -> dict[tuple[str, str], int]:
        """(kind, outcome) → items, over the whole DB (tests and the demo summary)."""
        with self.read() as db:
            return {
                (kind, outcome): count
                for kind, outcome, count in db.execute(
                    "SELECT kind, outcome, COUNT(*) FROM items WHERE status = 'done' GROUP BY kind, outcome"
                )
            }


class SqliteJournal:
    """The store's MultipartJournal on the state DB: every call is a committed transaction.

    `on_part_done` (set by the pipeline) runs after a part's row is committed; the crash point
    `after_part_upload` hangs there, since the store itself has no hook.
    """

    def __init__(self, db: StateDB) -> None:
        self._db = db
        self.on_part_done: Callable[[], None] | None = None

    def get(self, key: str) -> JournalEntry | None:
        with self._db.read() as conn:
            row = conn.execute(
                "SELECT upload_id, sha256, part_size FROM multipart_uploads WHERE key = ?", (key,)
            ).fetchone()
            if row is None:
                return None
            parts = dict(conn.execute("SELECT number, etag FROM multipart_parts WHERE key = ?", (key,)).fetchall())
        return JournalEntry(upload_id=row[0], sha256=row[1], part_size=row[2], parts=parts)

    def start(self, key: str, upload_id: str, *, sha256: str, part_size: int) -> None:
        with self._db.write() as conn:
            conn.execute("DELETE FROM multipart_parts WHERE key = ?", (key,))
            conn.execute(
                "INSERT OR REPLACE INTO multipart_uploads (key, upload_id, sha256, part_size) VALUES (?, ?, ?, ?)",
                (key, upload_id, sha256, part_size),
            )

    def part_done(self, key: str, number: int, etag: str) -> None:
        with self._db.write() as conn:
            conn.execute(
                "INSERT OR REPLACE INTO multipart_parts (key, number, etag) VALUES (?, ?, ?)",
                (key, number, etag),
            )
        if self.on_part_done is not None:
            self.on_part_done()

    def finish(self, key: str) -> None:
        with self._db.write() as conn:
            conn.execute("DELETE FROM multipart_parts WHERE key = ?", (key,))
            conn.execute("DELETE FROM multipart_uploads WHERE key = ?", (key,))

    def upload_ids(self) -> set[str]:
        """Upload ids in progress: what the orphan sweep must keep."""
        with self._db.read() as conn:
            return {r[0] for r in conn.execute("SELECT upload_id FROM multipart_uploads")}

    def entries(self) -> Iterable[tuple[str, str]]:
        with self._db.read() as conn:
            return list(conn.execute("SELECT key, upload_id FROM multipart_uploads ORDER BY key"))


def read_status(state_dir: Path, now: float) -> list[PendingItem]:
    """`archiver status` without a running pipeline: read the state DB beside the daemon."""
    state = StateDB.open_readonly(state_dir)
    try:
        return state.attention_items(now)
    finally:
        state.close()
