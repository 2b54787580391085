"""The durable captures: one append-only file per session segment, a checkpoint of what each file
holds, and each finished segment sealed as the stored log it will become.

Files live in ``{state dir}/live/`` named by a digest of the session's instance key (ids may be any
string), ``{digest}.{segment}.log``; they hold the stream's non-blank lines as received, each with
its newline, nothing else. The checkpoint table (``captures.db``, SQLite, WAL) records per segment
its line count, byte size, chain digest (`resume`), state and seal. Lines are written to the file as
they arrive (one ``write`` per received piece: a ``kill -9`` loses nothing the kernel had), and every
`Tuning.checkpoint_interval` one transaction records the dirty segments' values.

What is synced, and why only that (issue 35): a running session's lines are not synced by us (a
machine crash costs nothing the follow's replay cannot bring again, the replay skipping the kept
prefix). A segment becomes irreplaceable when it finishes (the service may forget a session's logs
at its end): the next checkpoint, within a fraction of a second, **seals** it: its lines compressed
into ``{digest}.{segment}.{lines}.gz`` exactly as the stored log object (`gzipstream.gzip_blocks`,
deterministic), synced with the directory, and only then does the row that names the seal (size,
SHA-256) commit. With a seal sync delay (`seal.Unsynced`) the row commits once the seal's name is
synced, its data when the delay is up if its upload has not removed it by then. The archive step
hard-links the seal into its spool instead of compressing and syncing a copy; a sealed segment's
raw file is deleted, mostly before the kernel wrote it. Thousands of sessions cost one transaction per
checkpoint and at most one sync per finished segment. Only what the archiver wrote is synced.

Recovery (at open) trusts a checkpoint and re-reads only what follows it: complete lines written
after it (a ``kill -9`` loses nothing the kernel had) extend the chain; a torn last line is cut
off; a file shorter than its checkpoint (a machine crash before the kernel wrote it back) is
re-read whole: a running segment goes on from what the disk holds (the replay brings the rest), a
finished one says `gap`. A seal missing or short is made again (its lines file gone too, an empty
`gap`); finished segments of an older archiver (no seal) are sealed. A file without a row (its
follow began after the last checkpoint) is kept when another segment's row names its session (a
segment begun after a divergence: its lines are scanned to rebuild the row, and the segments
before it end as diverged); else, its key unknown, it is deleted, and the session's replay brings
the lines again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from archiver.errors import StateError
from archiver.live import seal, table
from archiver.live.loop import UNBOUNDED_SEALS
from archiver.live.policy import Finish
from archiver.live.recovery import recover
from archiver.live.resume import Kept
from archiver.live.scratch import ID_FILE, Scratch, is_full
from archiver.live.segment import FOLLOWING, READ_BLOCK, Segment, SegmentRow, sealed_path, segment_file_name
from archiver.live.table import DB_NAME

log = logging.getLogger("archiver.live")

DIR_NAME = "live"
#: The scratch's bound when none is given (`--follow-logs-scratch-size`).
SCRATCH_BYTES = 256 * 1024 * 1024


class CaptureStore:
    """The captures of one state dir. Writes (`begin`, `append`, `finish`) come from one thread;
    `checkpoint` may run on another; readers (`segments`, `read`, `remove`) on any."""

    def __init__(
        self,
        state_dir: Path,
        *,
        scratch_dir: Path | None = None,
        scratch_bytes: int = SCRATCH_BYTES,
        seal_sync_delay: float = 0.0,
        seals_room: int = UNBOUNDED_SEALS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.directory = state_dir / DIR_NAME
        self._clock = clock
        self._lock = threading.Lock()
        self._dirty: dict[tuple[str, int], Segment] = {}
        #: Keys whose captures were removed (files deleted at once), their rows deleted by the next
        #: checkpoint's transaction; readers no longer see them meanwhile.
        self._removed: set[str] = set()
        #: Segments open for appending, by key: a sealed segment's lines file goes only when none is.
        self._appending: Counter[str] = Counter()
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._db = table.connect(self.directory / DB_NAME)
            self._dir_fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY)
            #: Seals not synced yet, each until its delay is up (`seal.Unsynced`).
            self._unsynced = seal.Unsynced(seal_sync_delay, seals_room)
            #: Running captures' lines files off the disk (`scratch`), or None: in `directory`.
            self._scratch = None if scratch_dir is None else Scratch(scratch_dir, self.directory, scratch_bytes)
        except sqlite3.DatabaseError as exc:
            raise StateError(f"live captures {self.directory / DB_NAME} are unusable ({exc})") from None
        except OSError as exc:
            raise StateError(f"live captures in {self.directory}: {exc.strerror or exc}") from None
        if self._scratch is None and (self.directory / ID_FILE).exists():
            self._without_scratch()
        self._recover()

    def _without_scratch(self) -> None:
        """Opened without the scratch an earlier start used: fine once every capture it may hold
        has its lines file here (a stop moved them), else refused (a ``kill -9`` left them there:
        recovery would start them afresh, and a later open with the scratch would find them
        replaced by those empty copies)."""
        stranded = [
            row
            for row in self._rows("SELECT * FROM segments")
            if (row.state == FOLLOWING or row.sealed is None) and row.kept.size and not row.path.exists()
        ]
        if stranded:
            self._db.close()
            os.close(self._dir_fd)
            raise StateError(
                f"live captures in {self.directory} are kept in a scratch dir: set --follow-logs-scratch-dir as "
                f"before, or delete {self.directory / ID_FILE} to start {len(stranded)} running capture(s) afresh"
            )
        (self.directory / ID_FILE).unlink()

    def path_of(self, key: str, index: int) -> Path:
        """A segment's lines file, where it is (or, a new one, would be found)."""
        name = segment_file_name(key, index)
        return self.directory / name if self._scratch is None else self._scratch.locate(name)

    def scratch_usage(self) -> tuple[int, int]:
        """Bytes the scratch holds, and lines files spilled to the captures directory (0, 0: no scratch)."""
        scratch = self._scratch
        return (0, 0) if scratch is None else (scratch.used, scratch.spills)

    def _unlink(self, path: Path) -> None:
        if self._scratch is None:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        else:
            self._scratch.unlink(path)

    # --- recovery ---------------------------------------------------------------------------

    def _recover(self) -> None:
        """Trust the checkpoint, re-read what follows it (`recovery.recover`), and record the result."""
        scratch = self._scratch
        found = recover(
            self.directory, self._rows("SELECT * FROM segments"), None if scratch is None else scratch.directory
        )
        if scratch is not None:
            scratch.counted()
        self._removed |= found.removed
        if self._unsynced.delay > 0:  # seals a `kill -9` may have left unsynced wait as if just made
            now = self._clock()
            for row in self._rows("SELECT * FROM segments WHERE sealed_size IS NOT NULL"):
                with contextlib.suppress(FileNotFoundError):
                    self._unsynced.add(sealed_path(row), now)
        self.checkpoint(found.changed)

    def removals_pending(self) -> bool:
        """Removed captures whose rows the next checkpoint deletes."""
        with self._lock:
            return bool(self._removed)

    # --- the writer's side --------------------------------------------------------------------

    def following(self) -> list[Segment]:
        """Every key's latest segment still being followed (to resume after a restart), opened for appending."""
        rows = self._rows(
            "SELECT * FROM segments s WHERE state = ? AND idx = (SELECT max(idx) FROM segments WHERE key = s.key)",
            (FOLLOWING,),
        )
        now = self._clock()
        return [Segment(row, self._open_for(row.key, row.path), recorded=now) for row in rows]

    def latest(self, key: str) -> SegmentRow | None:
        """The key's newest segment, if it has any."""
        rows = self.segments(key)
        return rows[-1] if rows else None

    def begin(self, key: str, session_id: str, created_ms: int, index: int) -> Segment:
        """A new, empty segment (recorded at the next checkpoint)."""
        name = segment_file_name(key, index)
        path = self.directory / name
        if self._scratch is not None:
            self._scratch.unlink(path)  # a twin left behind would be found before the new file
            self._scratch.unlink(self._scratch.directory / name)
            path = self._scratch.place(name)
        with self._lock:
            self._appending[key] += 1
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND | os.O_CLOEXEC, 0o600)
        row = SegmentRow(key, index, session_id, created_ms, None, Kept(), FOLLOWING, path, self.directory)
        segment = Segment(row, fd)
        self._mark(segment)
        return segment

    def reopen(self, row: SegmentRow) -> Segment:
        """A finished segment followed again (its session was listed again): appends continue it
        (a sealed one's lines file made again from its seal first)."""
        with self._lock:
            self._appending[row.key] += 1  # from now on no checkpoint deletes its lines file
        try:
            # Gone: sealed, by an earlier checkpoint or one that ran since the caller took ``row``
            # (the loop's copy of a finish not yet recorded says nothing of its seal).
            path = self.path_of(row.key, row.index)
            if not path.exists():
                path = self._remade(row, path.name)
            row = dataclasses.replace(row, path=path)
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        except BaseException:
            self._closed(row.key)
            raise
        segment = Segment(row, fd)
        segment.state = FOLLOWING
        self._mark(segment)
        return segment

    def _remade(self, row: SegmentRow, name: str) -> Path:
        """A sealed segment's lines file made again from its seal, named whole (in the scratch if
        it has room for it)."""
        if self._scratch is not None:
            return self._scratch.make(name, row.kept.size, lambda path: seal.unseal_to(row, path))
        seal.unseal_to(row, self.directory / name)
        return self.directory / name

    def _open_for(self, key: str, path: Path) -> int:
        with self._lock:
            self._appending[key] += 1
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)

    def _closed(self, key: str) -> None:
        with self._lock:
            self._appending[key] -= 1
            if self._appending[key] <= 0:
                del self._appending[key]

    def append(self, segment: Segment, lines: Sequence[bytes]) -> int:
        """Append ``lines`` (each without its newline) to the segment's file; the bytes written.
        An OSError (disk full) leaves the file as it was before the call. A lines file in the
        scratch that would take it past its bound, or finds it full, is spilled first (`scratch`)."""
        if not lines or segment.fd is None:
            return 0
        data = b"\n".join(lines) + b"\n"
        scratch = self._scratch
        if scratch is None or not scratch.holds(segment.path):
            self._write(segment, data)
        elif not scratch.take(len(data)):
            self._spill(segment, "it reached --follow-logs-scratch-size")
            self._write(segment, data)
        else:
            try:
                self._write(segment, data)
            except OSError as exc:
                scratch.charge(-len(data))
                if not is_full(exc):
                    raise
                self._spill(segment, "its filesystem is full")
                self._write(segment, data)
        segment.kept = segment.kept.after(lines)
        self._mark(segment, changed=False)
        return len(data)

    @staticmethod
    def _write(segment: Segment, data: bytes) -> None:
        assert segment.fd is not None
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(segment.fd, view) :]
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(segment.fd, segment.kept.size)
            raise

    def _spill(self, segment: Segment, why: str) -> None:
        """Move a running segment's lines file from the scratch to the captures directory."""
        assert self._scratch is not None and segment.fd is not None
        first = self._scratch.spills == 0
        segment.path, segment.fd = self._scratch.spill(segment.path, segment.fd)
        if first:
            log.warning(
                "live capture scratch: a running capture moved to the state dir, as %s (%d bytes held); "
                "more such moves are counted in archiver_live_scratch_spills",
                why, self._scratch.used,
            )  # fmt: skip

    def set_shape(self, segment: Segment, shape: str) -> None:
        segment.shape = shape
        self._mark(segment)

    def finish(self, segment: Segment, state: Finish) -> None:
        """No more lines go to this segment; recorded at the next checkpoint."""
        segment.state = state
        if segment.fd is not None:
            os.close(segment.fd)
            segment.fd = None
            self._closed(segment.key)
        self._mark(segment)

    def release(self, segment: Segment) -> None:
        """Close the segment's file, leaving it as it is (the daemon stops; it is resumed at start).
        A file in the scratch moves to the captures directory first: a pod replaced by a rollout
        gets a new, empty tmpfs (`scratch`'s module doc)."""
        if segment.fd is not None:
            if self._scratch is not None and self._scratch.holds(segment.path):
                try:
                    segment.path, segment.fd = self._scratch.spill(segment.path, segment.fd)
                except OSError as exc:  # the disk is full: it stays in the scratch, for a restart in place
                    log.error("live capture of %r stays in the scratch: %s", segment.session_id, exc.strerror or exc)
            os.close(segment.fd)
            segment.fd = None
            self._closed(segment.key)

    def _mark(self, segment: Segment, *, changed: bool = True) -> None:
        segment.changed = segment.changed or changed
        if not segment.dirty:
            segment.dirty = True
            self._dirty[(segment.key, segment.index)] = segment

    def pending(self, progress_every: float = 0.0) -> list[SegmentRow]:
        """Take what the segments changed since the last call hold now (on the writer's thread);
        `checkpoint` makes it durable. A segment that only gained lines is taken at most every
        ``progress_every`` seconds: its row is a resume point, and recovery scans the lines after
        it (issue 35: thousands of running sessions rewrote their rows every checkpoint)."""
        now = self._clock()
        taken = []
        for where, segment in list(self._dirty.items()):
            if not segment.changed and segment.recorded is not None and now - segment.recorded < progress_every:
                continue
            taken.append(segment.row())
            segment.dirty = segment.changed = False
            segment.recorded = now
            del self._dirty[where]
        return taken

    def checkpoint(self, rows: Sequence[SegmentRow]) -> None:
        """Make ``rows`` (taken by `pending`) durable: finished segments sealed (each seal's data
        synced, then the directory), then one transaction records the rows with their seals and
        deletes the rows of removed captures. Running segments' files are not synced (module doc)."""
        with self._lock:
            removed = frozenset(self._removed)
        # A row taken before its capture was removed (its file gone with it) is not written back.
        rows = [r for r in rows if r.key not in removed or r.path.exists()]
        sealed = [
            seal.write(r, self.read(r)) if r.state != FOLLOWING and r.sealed is None and r.kept.lines else r
            for r in rows
        ]
        written = [sealed_path(r) for r, o in zip(sealed, rows, strict=True) if r is not o]
        # All seals written first, then named and synced (held, with a delay, until it is up): seals
        # made together share the blocks of their inodes, and each block is written once, not once
        # per seal.
        now = self._clock()
        for path in written:
            os.replace(seal.partial(path), path)
            self._unsynced.add(path, now)
        if written:  # their names durable before the rows naming them commit (held ones' data later)
            os.fsync(self._dir_fd)
        self._unsynced.settle(now)
        self._record(sealed, removed)
        # A sealed segment keeps its seal only: its lines file goes (mostly before the kernel wrote
        # it), unless it is being appended to again (its session listed again meanwhile).
        for row, old in zip(sealed, rows, strict=True):
            if row is not old:
                with self._lock:  # under the lock: a reopen either comes after (and remakes it) or keeps it
                    if row.key not in self._appending:
                        self._unlink(row.path)

    def _record(self, rows: Sequence[SegmentRow], removed: frozenset[str] = frozenset()) -> None:
        if not rows and not removed:
            return
        now = self._clock()
        with self._lock:
            table.record(self._db, rows, removed, now)
            self._removed -= removed

    # --- readers ------------------------------------------------------------------------------

    def _rows(self, sql: str, params: Sequence[object] = ()) -> list[SegmentRow]:
        with self._lock:
            found = table.rows(self._db, sql, params, self.path_of, self.directory)
            removed = frozenset(self._removed)
        return [row for row in found if row.key not in removed]

    def segments(self, key: str) -> list[SegmentRow]:
        """Every checkpointed segment of a session instance, oldest first."""
        return self._rows("SELECT * FROM segments WHERE key = ? ORDER BY idx", (key,))

    def read(self, row: SegmentRow) -> Iterator[bytes]:
        """The segment's checkpointed bytes (``row.kept.size`` of them), in blocks: from its lines
        file (wherever a spill moved it since), or from its seal once that is all it keeps."""
        path = row.path if row.path.exists() else self.path_of(row.key, row.index)
        if row.sealed is not None and not path.exists():
            yield from seal.lines_of(row)
            return
        left = row.kept.size
        with open(path, "rb") as f:
            while left > 0 and (block := f.read(min(READ_BLOCK, left))):
                left -= len(block)
                yield block

    def remove(self, key: str) -> None:
        """Forget a session instance's captures (its archive is done): its files (lines and seals)
        go at once, its rows with the next checkpoint's transaction (no commit of its own: a crash
        before it brings the rows back without their files, and recovery starts them afresh)."""
        with self._lock:
            self._removed.add(key)
        digest = segment_file_name(key, 0).split(".")[0]
        places = [self.directory] if self._scratch is None else [self.directory, self._scratch.directory]
        for entry in [entry for place in places for entry in place.glob(f"{digest}.*")]:
            self._unlink(entry)

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

    def seals_unsynced(self) -> int:
        """Seals named but not synced yet (`--follow-logs-seal-sync-delay`): a checkpoint settles them."""
        return len(self._unsynced)

    def settle_seals(self) -> None:
        """Sync every seal still waiting that has a name left (a stop: the next start may be on a
        machine that crashed meanwhile)."""
        self._unsynced.settle(None)

    def close(self) -> None:
        self.settle_seals()
        self._unsynced.close()
        self.checkpoint([])  # the removals not recorded yet
        with self._lock:
            self._db.close()
        os.close(self._dir_fd)
