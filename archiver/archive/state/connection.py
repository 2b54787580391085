"""One open state DB: its connections, schema check and migration, and one-transaction write/read blocks."""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Self

from archiver.archive.state.schema import (
    DB_NAME,
    MIGRATIONS,
    PAGE_SIZE,
    SCHEMA,
    SCHEMA_VERSION,
    WAL_BYTES,
    connect,
)
from archiver.errors import StateError


def _corrupt_problem(path: Path, exc: sqlite3.DatabaseError) -> str:
    """What a damaged state DB means, and what to do about it."""
    return (
        f"state DB {path} is unusable ({exc}): move it aside and start again; the store keeps what is "
        "archived, and reconciliation finds the ended sessions the upstream still holds"
    )


def _version_problem(path: Path, version: int) -> str:
    """What a state DB of another schema means, and what to do about it."""
    if version > SCHEMA_VERSION:
        return (
            f"state DB {path} was written by a newer archiver (schema {version}; this one reads "
            f"{SCHEMA_VERSION}): run the newer archiver, or use a new --state-dir (downgrades are not supported)"
        )
    return f"state DB {path} has schema version {version}, this archiver uses {SCHEMA_VERSION}"


class Connection:
    """One open state DB: the writer and reader connections and their transactions (shared by the repositories)."""

    def __init__(self, path: Path, *, readonly: bool = False) -> None:
        self.path = path
        self.readonly = readonly
        self._write_lock = threading.Lock()
        self._read_lock = threading.Lock()
        # Moved (under the write lock, after the commit) by every transaction that may have made a
        # finalizing session due; `_finalize_moved` marks the transaction in progress as one.
        self._finalize_generation = 0
        self._finalize_moved = False
        #: True when this open created the DB: the archiver's very first start on this state dir.
        self.created = False
        try:
            if readonly:
                self._conn = connect(path, readonly=True)
            else:
                path.parent.mkdir(parents=True, exist_ok=True)
                self._conn = connect(path)
                # Only a new, empty DB takes it (before WAL mode is set); an existing one ignores it.
                self._conn.execute(f"PRAGMA page_size={PAGE_SIZE}")
                mode = self._conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
                if str(mode).lower() != "wal":
                    raise StateError(f"state DB {path}: the filesystem does not support WAL mode")
                page_size = self._conn.execute("PRAGMA page_size").fetchone()[0]
                self._conn.execute(f"PRAGMA wal_autocheckpoint={WAL_BYTES // page_size}")
                self._migrate()
            self._reader = connect(path, readonly=readonly)
            version = self._reader.execute("PRAGMA user_version").fetchone()[0]
        except sqlite3.DatabaseError as exc:
            self._close_quietly()
            raise StateError(_corrupt_problem(path, exc)) from None
        except StateError:
            self._close_quietly()
            raise
        if version != SCHEMA_VERSION:
            self._close_quietly()
            raise StateError(_version_problem(path, version))

    @classmethod
    def open(cls, state_dir: Path) -> Self:
        """Open (creating if needed) the writable state DB in `state_dir`."""
        return cls(state_dir / DB_NAME)

    @classmethod
    def open_readonly(cls, state_dir: Path) -> Self:
        """Open an existing state DB for reading beside a running daemon (`archiver status`)."""
        path = state_dir / DB_NAME
        if not path.is_file():
            raise StateError(f"no state DB at {path} (has `archiver run` used this --state-dir?)")
        return cls(path, readonly=True)

    def _close_quietly(self) -> None:
        for name in ("_reader", "_conn"):
            conn = getattr(self, name, None)
            if conn is not None:
                with contextlib.suppress(sqlite3.Error):
                    conn.close()

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
            raise StateError(_version_problem(self.path, version))
        if version in MIGRATIONS:
            with self.write() as db:  # every step in one transaction: a crash leaves the old schema
                for step in range(version, SCHEMA_VERSION):
                    for statement in MIGRATIONS[step].split(";"):
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
            for statement in SCHEMA.split(";"):
                if statement.strip():
                    db.execute(statement)
            db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")

    # --- transactions -----------------------------------------------------------------------

    @contextlib.contextmanager
    def write(self, *, durable: bool = True) -> Iterator[sqlite3.Connection]:
        """One write transaction, committed (durable) when the block ends, rolled back on error.

        ``durable=False`` commits without the fsync, for changes a crash may lose because recovery
        undoes them anyway (a claim: `reset_in_flight` puts every in-flight item back). Order is
        kept: WAL frames are appended in commit order and the next durable commit syncs them all.
        """
        if self.readonly:
            raise StateError("the state DB is open read-only")
        with self._write_lock, self._corruption_is_a_state_error():
            if not durable:
                self._conn.execute("PRAGMA synchronous=NORMAL")
            try:
                self._finalize_moved = False
                self._conn.execute("BEGIN IMMEDIATE")
                try:
                    yield self._conn
                except BaseException:
                    self._conn.execute("ROLLBACK")
                    raise
                self._conn.execute("COMMIT")
                if self._finalize_moved:
                    # Only once committed: a reader that sees the new generation sees the change too.
                    self._finalize_generation += 1
            finally:
                if not durable:
                    self._conn.execute("PRAGMA synchronous=FULL")

    def finalize_generation(self) -> int:
        """Moves whenever a committed write of this process may have made a finalizing session due
        (one became `finalizing`, or its retry gate moved): while it stands still, and no gate has
        passed, a look that found no manifest due still holds (`UploadStage`)."""
        return self._finalize_generation

    def _finalize_may_be_due(self) -> None:
        """Called inside a write transaction that may make a finalizing session due (see above)."""
        self._finalize_moved = True

    def _finalize_changed(self) -> None:
        """Outside a transaction: something of this process (a lease let go) made a finalizing session due."""
        with self._write_lock:
            self._finalize_generation += 1

    @contextlib.contextmanager
    def read(self) -> Iterator[sqlite3.Connection]:
        """A consistent read snapshot on the reader connection."""
        with self._read_lock, self._corruption_is_a_state_error():
            self._reader.execute("BEGIN")
            try:
                yield self._reader
            finally:
                self._reader.execute("COMMIT")

    @contextlib.contextmanager
    def _corruption_is_a_state_error(self) -> Iterator[None]:
        """A file damaged past its header shows only when a page is read: a StateError saying what to
        do (locks and I/O errors, OperationalError, and programming errors stay what they are)."""
        try:
            yield
        except sqlite3.DatabaseError as exc:
            if type(exc) is not sqlite3.DatabaseError:
                raise
            raise StateError(_corrupt_problem(self.path, exc)) from None
