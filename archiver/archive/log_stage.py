"""The log stage: appends the archives this daemon committed to its own transparency log, a batch per checkpoint.

Who appends: every daemon writes its own log, ``{prefix}log/shard-<s>-replica-<r>/`` (the identity
``--shard``/``--replicas-per-shard`` already give it), so no two processes ever write the same
tile key and no coordinator is needed. An archive is logged by the daemon whose manifest write
created it; a replica that found the same archive already stored (the other replica won) queues no
leaf, so each archive is one leaf in one log.

Crash safety: ``mark_archived`` queues the leaf in the same transaction that marks the session
archived (``log_pending``). After a batch's checkpoint is stored, one transaction removes the
batch from the queue and records the checkpoint (``log_state``). At start the log is opened
against that recorded checkpoint (consistency), and the entries the log gained since it (a crash
after the checkpoint, or tiles adopted by ``TileLog.open``) are taken off the queue, so no leaf
is appended twice.

Stores that ignore conditional writes: tiles are only ever written by their own writer, so no
create-once race exists to lose; a second process misconfigured with the same identity is caught
when it finds the checkpoint changed behind it (``LogVerificationError``), and the consistency
check at each checkpoint proves the stored tiles extend the previous tree.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from archiver.archive.crashpoints import crashpoint
from archiver.archive.state import StateDB
from archiver.config.sharding import Shard
from archiver.errors import ArchiverError, LogError, LogVerificationError, StoreError
from archiver.metrics.selfmetrics import SelfMetrics
from archiver.store.base import ObjectStore
from archiver.tlog import checkpoint as cp
from archiver.tlog import timestamp
from archiver.tlog.leaf import format_time
from archiver.tlog.log import TileLog
from archiver.tlog.note import Signer
from archiver.tlog.prove import write_locators
from archiver.tlog.witness import Witness

log = logging.getLogger("archiver.tlog")

#: Leaves per checkpoint at most (a batch is one transaction and one checkpoint).
BATCH = 50_000


def writer_name(shard: Shard) -> str:
    """This daemon's log: ``shard-<s>-replica-<r>`` (a single daemon is shard 0, replica 0)."""
    return f"shard-{shard.index}-replica-{shard.replica}"


class LogStage:
    """One thread: opens the log (checking it), then every ``interval`` s appends what is queued."""

    def __init__(
        self,
        state: StateDB,
        store: ObjectStore,
        signer: Signer,
        writer: str,
        metrics: SelfMetrics,
        clock: Callable[[], float],
        *,
        interval: float,
        witness: Witness | None = None,
        tsa_url: str | None = None,
    ) -> None:
        self.state = state
        #: A second store keeping a copy of each checkpoint (``--tlog-witness-store``).
        self.witness = witness
        #: An RFC 3161 timestamp authority for each checkpoint (``--tlog-tsa-url``).
        self.tsa_url = tsa_url
        self.log = TileLog(store, writer, signer)
        self.log.on_tiles_written = lambda: crashpoint("after_log_tiles")
        self.writer = writer
        self.metrics = metrics
        self.clock = clock
        self.interval = interval
        self.opened = False
        #: False once a check failed: the log is not extended until an operator looked.
        self.consistent = True

    def open(self) -> None:
        """Load and check the log; drop from the queue what it already holds."""
        kept_note = self.state.log_checkpoint(self.writer)
        verifier = self.log.signer.verifier
        kept = cp.open_signed(kept_note, verifier) if kept_note else None
        witnessed = self.witness.latest(self.writer, verifier) if self.witness else None
        try:
            self.log.open(kept)
            if witnessed is not None:
                self._check_witness(witnessed)
        except LogVerificationError:
            self._inconsistent()
            raise
        head = self.log.last
        if head is not None and head.checkpoint.size > (kept.size if kept else 0):
            since = kept.size if kept else 0
            size = head.checkpoint.size
            logged = {entry: i for i, entry in self.log.entries(since, size, size)}
            done = [key for key, entry in self.state.log_pending(BATCH * 4) if entry in logged]
            self._locate([(i, entry) for entry, i in logged.items()])
            self.state.log_done(self.writer, done, head.note)
            log.info("log %s: %d leaves since the last recorded checkpoint were already in it", self.writer, len(done))
        self.opened = True
        self._report()
        if head is not None:
            self.metrics.log_checkpoint(appended=0, size=head.checkpoint.size, now=self.clock())

    def _locate(self, logged: list[tuple[int, bytes]]) -> None:
        """Each leaf's locator (which log, which index, since when): ``archiver prove`` and the browser
        find the leaf without reading every log."""
        write_locators(self.log.store, self.writer, logged, format_time(self.clock()))

    def _timestamp(self, size: int, signed: bytes) -> None:
        """Best effort: a TSA that does not answer costs this checkpoint its timestamp, never the log."""
        if self.tsa_url is None:
            return
        try:
            reply = timestamp.request(self.tsa_url, signed)
            key = self.log.key(timestamp.timestamps_path(size))
            self.log.store.put_bytes(key, reply, content_type=timestamp.REPLY_TYPE)
        except (LogError, StoreError) as exc:
            log.warning("transparency log %s: checkpoint %d not timestamped: %s", self.writer, size, exc)
            self.metrics.error("tlog")

    def _check_witness(self, witnessed: cp.Checkpoint) -> None:
        """The log must extend the witness's newest copy (a rollback or rewrite of the store shows)."""
        head = self.log.last
        if head is None:
            raise LogVerificationError(f"log {self.writer!r} is gone; the witness has {witnessed.size} leaves of it")
        self.log.check_consistent(witnessed, head.checkpoint)

    def _inconsistent(self) -> None:
        self.consistent = False
        self._report()

    def _report(self) -> None:
        self.metrics.set_log_state(pending=self.state.log_pending_count(), consistent=self.consistent)

    def run_once(self) -> int:
        """Append one batch of queued archives and sign a checkpoint; how many were appended."""
        if not self.consistent:
            return 0
        if not self.opened:
            self.open()
        batch = self.state.log_pending(BATCH)
        if not batch:
            self._report()
            return 0
        try:
            first = self.log.append([entry for _, entry in batch])
        except LogVerificationError:
            self._inconsistent()
            raise
        head = self.log.last
        assert head is not None  # append signed one
        crashpoint("after_log_checkpoint")
        if self.witness is not None:
            try:
                self.witness.record(self.writer, head.checkpoint.size, head.note)
            except LogVerificationError:
                self._inconsistent()
                raise
        self._timestamp(head.checkpoint.size, head.note)
        self._locate([(first + i, entry) for i, (_, entry) in enumerate(batch)])
        self.state.log_done(self.writer, [key for key, _ in batch], head.note)
        self.metrics.log_checkpoint(appended=len(batch), size=head.checkpoint.size, now=self.clock())
        self._report()
        return len(batch)

    def run(self, stop: threading.Event) -> None:
        """The stage's thread until ``stop``: at once (the log is opened and checked at start), then
        every ``interval``; a last batch on the way out."""
        stopping = False
        while True:
            try:
                while self.run_once() == BATCH:
                    pass
            except LogVerificationError as exc:
                log.error("transparency log %s is inconsistent, no longer appending: %s", self.writer, exc)
            except StoreError as exc:
                log.warning("transparency log %s: store error, retrying in %.0f s: %s", self.writer, self.interval, exc)
            except ArchiverError as exc:
                log.error("transparency log %s: %s", self.writer, exc)
                self.metrics.error("tlog")
            except Exception:
                log.exception("transparency log %s: unexpected error", self.writer)
                self.metrics.error("tlog")
            if stopping:
                return
            stopping = stop.wait(self.interval)
