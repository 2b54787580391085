"""The durable captures: one append-only file per session segment, and a checkpoint of what each file holds.

Files live in ``{state dir}/live/`` named by a digest of the session's instance key (ids may be any
string), ``{digest}.{segment}.log``; they hold the stream's non-blank lines as received, each with
its newline, nothing else. The checkpoint table (``captures.db``, SQLite, WAL) records per segment
its line count, byte size, chain digest (`resume`) and state. Lines are written to the file as
they arrive (one ``write`` per received piece); every `Tuning.checkpoint_interval` the dirty
segments' values are taken, each dirty file's data is synced (``fdatasync``) and then the directory
(the names of new files), and then one transaction records them all: a checkpoint never claims a
byte the disk does not hold, and thousands of sessions cost one sync each per checkpoint, not one
per line. Only what the archiver wrote is synced, never the whole filesystem (a ``syncfs`` on a
shared node volume would flush other pods' dirty pages too).

Recovery (at open) trusts a checkpoint and re-reads only what follows it: complete lines written
after it (a ``kill -9`` loses nothing the kernel had) extend the chain; a torn last line is cut
off; a file shorter than its checkpoint (a machine crash on a filesystem that lied) is re-read
whole. A file without a row (its follow began after the last checkpoint) is kept when another
segment's row names its session (a segment begun after a divergence: its lines are scanned to
rebuild the row, and the segments before it end as diverged); else, its key unknown, it is deleted,
and the session's replay brings the lines again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from archiver.errors import StateError
from archiver.live.policy import Finish
from archiver.live.resume import Kept
from archiver.logshape import NDJSON, TEXT, starts_like_json

log = logging.getLogger("archiver.live")

DIR_NAME = "live"
DB_NAME = "captures.db"
# A capture's shape is `logshape.NDJSON` (`{streamType, line}` entries) or `logshape.TEXT` (plain lines).
SCHEMA_VERSION = 1
#: Bytes per page of a new checkpoint DB (as the state DB's, archive/state/schema.py: issue 35).
PAGE_SIZE = 1024
#: A segment still being followed (the others are `policy.Finish` values).
FOLLOWING = "following"
_READ_BLOCK = 1024 * 1024

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
    PRIMARY KEY (key, idx)
) WITHOUT ROWID
"""


@dataclass(frozen=True, slots=True)
class SegmentRow:
    """One segment as checkpointed: for readers (the archive step) and for resuming a follow."""

    key: str
    index: int
    session_id: str
    created_ms: int
    shape: str | None
    kept: Kept
    state: str
    path: Path


class Segment:
    """A segment being written (owned by the event loop thread): the file's fd and what it holds."""

    __slots__ = ("created_ms", "dirty", "fd", "index", "kept", "key", "path", "session_id", "shape", "state")

    def __init__(self, row: SegmentRow, fd: int | None) -> None:
        self.key = row.key
        self.index = row.index
        self.session_id = row.session_id
        self.created_ms = row.created_ms
        self.shape = row.shape
        self.kept = row.kept
        self.state = row.state
        self.path = row.path
        self.fd = fd
        self.dirty = False

    def row(self) -> SegmentRow:
        return SegmentRow(
            self.key, self.index, self.session_id, self.created_ms, self.shape, self.kept, self.state, self.path
        )


def scan(path: Path, kept: Kept) -> Kept:
    """``kept`` extended by the complete lines the file holds after ``kept.size`` bytes; a torn last
    line (no newline) is cut off the file."""
    with open(path, "r+b") as f:
        f.seek(kept.size)
        pending = b""
        lines = kept
        while block := f.read(_READ_BLOCK):
            *complete, pending = (pending + block).split(b"\n")
            lines = lines.after(complete)
        if pending:
            f.truncate(lines.size)
    return lines


def _values(r: SegmentRow, now: float) -> tuple[object, ...]:
    return (r.key, r.index, r.session_id, r.created_ms, r.shape, r.kept.lines, r.kept.size, r.kept.chain, r.state,
            now, now)  # fmt: skip


class CaptureStore:
    """The captures of one state dir. Writes (`begin`, `append`, `finish`) come from one thread;
    `checkpoint` may run on another; readers (`segments`, `read`, `remove`) on any."""

    def __init__(self, state_dir: Path, *, clock: Callable[[], float] = time.time) -> None:
        self.directory = state_dir / DIR_NAME
        self._clock = clock
        self._lock = threading.Lock()
        self._dirty: dict[tuple[str, int], Segment] = {}
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(self.directory / DB_NAME, check_same_thread=False, isolation_level=None)
            # Small pages for a new DB (an existing one keeps its own): each checkpoint rewrites
            # the rows of every session it covers, and the WAL takes every changed page whole.
            self._db.execute(f"PRAGMA page_size={PAGE_SIZE}")
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            version = self._db.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise StateError(
                    f"live captures {self.directory / DB_NAME} were written by a newer archiver "
                    f"(schema {version}; this one reads {SCHEMA_VERSION})"
                )
            self._db.execute(_SCHEMA)
            self._db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            self._dir_fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY)
        except sqlite3.DatabaseError as exc:
            raise StateError(f"live captures {self.directory / DB_NAME} are unusable ({exc})") from None
        except OSError as exc:
            raise StateError(f"live captures in {self.directory}: {exc.strerror or exc}") from None
        self._recover()

    def path_of(self, key: str, index: int) -> Path:
        digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:32]
        return self.directory / f"{digest}.{index}.log"

    # --- recovery ---------------------------------------------------------------------------

    def _recover(self) -> None:
        rows = self._rows("SELECT * FROM segments")
        changed: dict[tuple[str, int], SegmentRow] = {}
        for row in rows:
            kept = self._recovered(row)
            if kept != row.kept:
                state = row.state if row.state == FOLLOWING or kept.size >= row.kept.size else Finish.GAP
                changed[(row.key, row.index)] = dataclasses.replace(row, kept=kept, state=state)
        found = self._unrecorded(rows)
        changed.update({(row.key, row.index): row for row in found})
        current = {(row.key, row.index): row for row in rows} | changed
        for key in {row.key for row in found}:  # a segment begins when the one before it diverged
            newest = max(index for k, index in current if k == key)
            for (k, index), row in current.items():
                if k == key and index < newest and row.state == FOLLOWING:
                    changed[(k, index)] = dataclasses.replace(row, state=Finish.DIVERGED)
        self._write(list(changed.values()))

    def _unrecorded(self, rows: Sequence[SegmentRow]) -> list[SegmentRow]:
        """The files without a row (begun after the last checkpoint) rebuilt as segments, when a row
        of another segment names their session; the others are deleted (the replay brings their lines
        again), as are empty ones."""
        recorded = {row.path.name for row in rows}
        sessions = {row.path.name.partition(".")[0]: row for row in rows}
        found = []
        for entry in self.directory.iterdir():
            if not entry.name.endswith(".log") or entry.name in recorded:
                continue
            digest, _, index = entry.name.removesuffix(".log").partition(".")
            other = sessions.get(digest)
            if other is None or not index.isdigit() or not (kept := scan(entry, Kept())).lines:
                entry.unlink()
                continue
            with entry.open("rb") as f:  # the answer's shape was not recorded: its first line tells
                shape = NDJSON if starts_like_json(f.read(64)) else TEXT
            log.info("live capture of %r: segment %s began after the last checkpoint; kept", other.session_id, index)
            found.append(
                dataclasses.replace(other, index=int(index), shape=shape, kept=kept, state=FOLLOWING, path=entry)
            )
        return found

    def _recovered(self, row: SegmentRow) -> Kept:
        """What the segment's file really holds, beyond or instead of its checkpoint."""
        try:
            size = row.path.stat().st_size
        except FileNotFoundError:
            log.warning("live capture file of %r segment %d is missing: starting it afresh", row.session_id, row.index)
            row.path.touch(mode=0o600)
            return Kept()
        if size < row.kept.size:
            log.warning("live capture file of %r is shorter than its checkpoint: re-reading it", row.session_id)
            return scan(row.path, Kept())
        if row.state != FOLLOWING:
            if size > row.kept.size:
                os.truncate(row.path, row.kept.size)  # nothing is appended after a segment finished
            return row.kept
        return scan(row.path, row.kept) if size > row.kept.size else row.kept

    # --- the writer's side --------------------------------------------------------------------

    def following(self) -> list[Segment]:
        """Every key's latest segment still being followed (to resume after a restart), opened for appending."""
        rows = self._rows(
            "SELECT * FROM segments s WHERE state = ? AND idx = (SELECT max(idx) FROM segments WHERE key = s.key)",
            (FOLLOWING,),
        )
        return [Segment(row, self._open(row.path)) for row in rows]

    def latest(self, key: str) -> SegmentRow | None:
        """The key's newest segment, if it has any."""
        rows = self.segments(key)
        return rows[-1] if rows else None

    def begin(self, key: str, session_id: str, created_ms: int, index: int) -> Segment:
        """A new, empty segment (recorded at the next checkpoint)."""
        path = self.path_of(key, index)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND | os.O_CLOEXEC, 0o600)
        segment = Segment(SegmentRow(key, index, session_id, created_ms, None, Kept(), FOLLOWING, path), fd)
        self._mark(segment)
        return segment

    def reopen(self, row: SegmentRow) -> Segment:
        """A finished segment followed again (its session was listed again): appends continue it."""
        segment = Segment(row, self._open(row.path))
        segment.state = FOLLOWING
        self._mark(segment)
        return segment

    def _open(self, path: Path) -> int:
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)

    def append(self, segment: Segment, lines: Sequence[bytes]) -> int:
        """Append ``lines`` (each without its newline) to the segment's file; the bytes written.
        An OSError (disk full) leaves the file as it was before the call."""
        if not lines or segment.fd is None:
            return 0
        data = b"\n".join(lines) + b"\n"
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(segment.fd, view) :]
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(segment.fd, segment.kept.size)
            raise
        segment.kept = segment.kept.after(lines)
        self._mark(segment)
        return len(data)

    def set_shape(self, segment: Segment, shape: str) -> None:
        segment.shape = shape
        self._mark(segment)

    def finish(self, segment: Segment, state: Finish) -> None:
        """No more lines go to this segment; recorded at the next checkpoint."""
        segment.state = state
        if segment.fd is not None:
            os.close(segment.fd)
            segment.fd = None
        self._mark(segment)

    def release(self, segment: Segment) -> None:
        """Close the segment's file, leaving it as it is (the daemon stops; it is resumed at start)."""
        if segment.fd is not None:
            os.close(segment.fd)
            segment.fd = None

    def _mark(self, segment: Segment) -> None:
        if not segment.dirty:
            segment.dirty = True
            self._dirty[(segment.key, segment.index)] = segment

    def pending(self) -> list[SegmentRow]:
        """Take what every segment changed since the last call holds now (on the writer's thread);
        `checkpoint` makes it durable."""
        taken = [segment.row() for segment in self._dirty.values()]
        for segment in self._dirty.values():
            segment.dirty = False
        self._dirty.clear()
        return taken

    def checkpoint(self, rows: Sequence[SegmentRow]) -> None:
        """Make ``rows`` (taken by `pending`) durable: the files' data first, then the rows."""
        if not rows:
            return
        self._sync([row.path for row in rows])
        self._write(rows)

    def _sync(self, paths: Sequence[Path]) -> None:
        """The data of these files (opened afresh: the writer may close its fd), then the directory."""
        for path in paths:
            with contextlib.suppress(FileNotFoundError):
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
                try:
                    os.fdatasync(fd)
                finally:
                    os.close(fd)
        os.fsync(self._dir_fd)

    def _write(self, rows: Sequence[SegmentRow]) -> None:
        if not rows:
            return
        now = self._clock()
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.executemany(
                    "INSERT INTO segments (key, idx, session_id, created_ms, shape, lines, size, chain, state, "
                    "began, updated) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (key, idx) DO UPDATE SET "
                    "shape = excluded.shape, lines = excluded.lines, size = excluded.size, chain = excluded.chain, "
                    "state = excluded.state, updated = excluded.updated",
                    [_values(r, now) for r in rows],
                )
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    # --- readers ------------------------------------------------------------------------------

    def _rows(self, sql: str, params: Sequence[object] = ()) -> list[SegmentRow]:
        with self._lock:
            cursor = self._db.execute(sql, params)
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
                path=self.path_of(r["key"], r["idx"]),
            )
            for r in found
        ]

    def segments(self, key: str) -> list[SegmentRow]:
        """Every checkpointed segment of a session instance, oldest first."""
        return self._rows("SELECT * FROM segments WHERE key = ? ORDER BY idx", (key,))

    def read(self, row: SegmentRow) -> Iterator[bytes]:
        """The segment's checkpointed bytes (``row.kept.size`` of them), in blocks."""
        left = row.kept.size
        with open(row.path, "rb") as f:
            while left > 0 and (block := f.read(min(_READ_BLOCK, left))):
                left -= len(block)
                yield block

    def remove(self, key: str) -> None:
        """Forget a session instance's captures (its archive is done)."""
        with self._lock:
            self._db.execute("DELETE FROM segments WHERE key = ?", (key,))
        digest = self.path_of(key, 0).name.split(".")[0]
        for entry in self.directory.glob(f"{digest}.*.log"):
            with contextlib.suppress(FileNotFoundError):
                entry.unlink()

    def prune(self, before: float, keep: frozenset[str] = frozenset()) -> int:
        """Remove the captures of instances whose every segment finished before ``before`` (epoch
        seconds) and that are not in ``keep``: their session was archived by another shard or
        replica, or skipped; this daemon's archives remove theirs when their logs are spooled."""
        with self._lock:
            stale = [
                row[0]
                for row in self._db.execute(
                    "SELECT key FROM segments GROUP BY key HAVING max(updated) < ? AND sum(state = ?) = 0",
                    (before, FOLLOWING),
                ).fetchall()
            ]
        removed = [key for key in stale if key not in keep]
        for key in removed:
            self.remove(key)
        return len(removed)

    def close(self) -> None:
        with self._lock:
            self._db.close()
        os.close(self._dir_fd)
