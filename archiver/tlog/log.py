"""One writer's transparency log in the object store: open (check, repair), append batches, read tiles and proofs.

Layout under ``{prefix}log/{writer}/`` (C2SP tlog-tiles): ``tile/entries/<N>[.p/<W>]``,
``tile/<L>/<N>[.p/<W>]`` and ``checkpoint``, plus ``checkpoints/<size>`` (every checkpoint ever
signed, so each size stays provable and a rollback shows). Every tile, bundle and history entry is
a create-once write (a partial tile's key names its width, so it too is written once); only
``checkpoint`` is replaced.

Order of a batch: full bundles and tiles as the appends complete them, then the partial ones, then
the checkpoint's history entry, then the checkpoint. A crash in between leaves tiles beyond the
checkpoint: :meth:`TileLog.open` adopts their entries (re-appending them in the same order writes
the same bytes, so every create-once write is ``ALREADY_PRESENT``) and signs a checkpoint over
them; the caller learns which entries were adopted so it does not append them twice.

Before replacing the checkpoint the writer reads it back: it must be the one it wrote last (a
second writer of the same name, a rollback or a rewrite is refused, ``LogVerificationError``),
and the new tree must be consistent with it, proved from the tiles as stored.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from archiver.errors import LogError, LogVerificationError, ObjectConflictError, ObjectNotFoundError
from archiver.layout import keys
from archiver.store.base import ObjectStore
from archiver.tlog import checkpoint as cp
from archiver.tlog import merkle, note
from archiver.tlog.checkpoint import Checkpoint
from archiver.tlog.tiles import TILE_WIDTH, TileHashes, TreeEdge, decode_bundle, index_path, tile_path

TILE_TYPE = "application/octet-stream"
CHECKPOINT_TYPE = "text/plain; charset=utf-8"


HISTORY = "checkpoints/"


def history_path(size: int) -> str:
    """``checkpoints/<size, 20 digits>``: every checkpoint signed, kept create-once (sorted by size)."""
    return f"{HISTORY}{size:020d}"


def read_object(store: ObjectStore, key: str) -> bytes:
    return b"".join(store.iter_bytes(key))


def writers(store: ObjectStore) -> list[str]:
    """The writers that have a log in this store (from ``log-writers/``, a few keys, sorted here:
    some S3-compatible stores do not list in key order)."""
    root = keys.log_writers_root(store.prefix)
    return sorted(key[len(root) :] for key in store.list_keys(root))


@dataclass(frozen=True, slots=True)
class Head:
    """A verified checkpoint and its signed bytes."""

    checkpoint: Checkpoint
    note: bytes


class LogReader:
    """Read access to one writer's log: its checkpoint, tiles, entries and proofs (no key needed)."""

    def __init__(self, store: ObjectStore, writer: str) -> None:
        self.store = store
        self.writer = writer
        self.base = keys.log_prefix(store.prefix, writer)

    def key(self, path: str) -> str:
        return self.base + path

    def read_tile(self, level: int, n: int, width: int) -> bytes:
        return read_object(self.store, self.key(tile_path(level, n, width)))

    def head(self, verifier: note.Verifier | None) -> Head | None:
        """The stored checkpoint, verified with the log's key; None while the log has none. Without a
        key (the evidence browser) it is only parsed: whoever receives a bundle verifies it."""
        try:
            raw = read_object(self.store, self.key("checkpoint"))
        except ObjectNotFoundError:
            return None
        if verifier is None:
            text, _ = note.parse(raw)
            return Head(Checkpoint.parse(text), raw)
        return Head(cp.open_signed(raw, verifier), raw)

    def hashes(self, size: int) -> TileHashes:
        return TileHashes(size, self.read_tile)

    def entries(self, start: int, end: int, size: int) -> Iterator[tuple[int, bytes]]:
        """Entries ``[start, end)`` of a tree of ``size`` ≥ end leaves, from its bundles."""
        n = start // TILE_WIDTH
        while n * TILE_WIDTH < end:
            width = min(TILE_WIDTH, size - n * TILE_WIDTH)
            bundle = decode_bundle(self.read_tile(-1, n, width))
            if len(bundle) != width:
                raise LogError(f"entry bundle {tile_path(-1, n, width)} holds {len(bundle)} entries, not {width}")
            for i, entry in enumerate(bundle):
                index = n * TILE_WIDTH + i
                if start <= index < end:
                    yield index, entry
            n += 1

    def inclusion(self, index: int, size: int) -> list[bytes]:
        return merkle.inclusion_proof(index, size, self.hashes(size).mth)

    def consistency(self, old_size: int, new_size: int) -> list[bytes]:
        return merkle.consistency_proof(old_size, new_size, self.hashes(new_size).mth)

    def check_consistent(self, old: Checkpoint, new: Checkpoint) -> None:
        """``LogVerificationError`` unless ``new`` extends ``old`` (proved from the stored tiles)."""
        if old.origin != new.origin:
            raise LogVerificationError(f"checkpoints of two logs: {old.origin!r} and {new.origin!r}")
        if old.size == 0:
            return
        if new.size < old.size:
            raise LogVerificationError(f"the log was rolled back from {old.size} to {new.size} leaves")
        proof = self.consistency(old.size, new.size) if new.size > old.size else []
        merkle.verify_consistency(old.size, new.size, old.root, new.root, proof)

    def check_head(self, head: Head) -> None:
        """``LogVerificationError`` unless the stored tiles give the checkpoint's root."""
        size = head.checkpoint.size
        root = TreeEdge.from_partials(size, self.read_tile).root() if size else merkle.EMPTY_ROOT
        if root != head.checkpoint.root:
            raise LogVerificationError(f"the tiles of log {self.writer!r} do not give its checkpoint's root")


class TileLog(LogReader):
    """One writer's log, appended to by this process only (a log per writer: no coordination)."""

    def __init__(self, store: ObjectStore, writer: str, signer: note.Signer) -> None:
        super().__init__(store, writer)
        self.signer = signer
        self.origin = f"{signer.name}/{writer}"
        self.edge = TreeEdge()
        self.last: Head | None = None
        #: Called once a batch's tiles are stored, before its checkpoint (the crash tests' hook).
        self.on_tiles_written: Callable[[], None] = lambda: None

    @property
    def size(self) -> int:
        return self.edge.size

    def open(self, kept: Checkpoint | None = None) -> list[bytes]:
        """Load the log's edge from the store and check it: the checkpoint's signature, the tiles
        against its root, consistency from ``kept`` (a checkpoint remembered elsewhere) when given.
        Adopts entries a crash left beyond the checkpoint and returns them (signed in a new checkpoint)."""
        head = self.head(self.signer.verifier)
        if head is not None and head.checkpoint.origin != self.origin:
            raise LogVerificationError(f"log {self.writer!r} holds a checkpoint of {head.checkpoint.origin!r}")
        size = head.checkpoint.size if head else 0
        self.edge = TreeEdge.from_partials(size, self.read_tile) if size else TreeEdge()
        if head is not None and self.edge.root() != head.checkpoint.root:
            raise LogVerificationError(f"the tiles of log {self.writer!r} do not give its checkpoint's root")
        self.last = head
        if kept is not None:
            if head is None:
                raise LogVerificationError(f"log {self.writer!r} has no checkpoint, a kept one has {kept.size} leaves")
            self.check_consistent(kept, head.checkpoint)
        adopted = self._adopt()
        if adopted:
            self._checkpoint()
        return adopted

    def _adopt(self) -> list[bytes]:
        """Entries of bundles written after the checkpoint (a crash before it was replaced)."""
        adopted: list[bytes] = []
        while True:
            n, have = divmod(self.edge.size, TILE_WIDTH)
            bundle = self._furthest_bundle(n)
            if len(bundle) <= have:
                return adopted
            for entry in bundle[have:]:
                adopted.append(entry)
                self._write(self.edge.append(entry))
            if len(bundle) < TILE_WIDTH:
                return adopted

    def _furthest_bundle(self, n: int) -> list[bytes]:
        try:
            return decode_bundle(self.read_tile(-1, n, TILE_WIDTH))
        except ObjectNotFoundError:
            pass
        head = self.key(f"tile/entries/{index_path(n)}.p/")
        widths = [int(k[len(head) :]) for k in self.store.list_keys(head) if k[len(head) :].isdigit()]
        return decode_bundle(self.read_tile(-1, n, max(widths))) if widths else []

    def _register(self) -> None:
        """The log's marker under ``log-writers/`` (before its first checkpoint): readers find it there."""
        marker = keys.log_writer_key(self.store.prefix, self.writer)
        try:
            self.store.put_bytes(marker, f"{self.origin}\n".encode(), content_type=CHECKPOINT_TYPE)
        except ObjectConflictError:
            raise LogVerificationError(f"log {self.writer!r} belongs to another origin than {self.origin!r}") from None

    def _write(self, objects: Sequence[tuple[str, bytes]]) -> None:
        for path, data in objects:
            self.store.put_bytes(self.key(path), data, content_type=TILE_TYPE)

    def append(self, entries: Sequence[bytes]) -> int:
        """Append ``entries`` (in order) and sign a checkpoint over them; the index of the first."""
        first = self.edge.size
        for entry in entries:
            self._write(self.edge.append(entry))
        self._checkpoint()
        return first

    def _checkpoint(self) -> None:
        self._write(self.edge.partials())
        self.on_tiles_written()
        new = Checkpoint(self.origin, self.edge.size, self.edge.root())
        stored = self.head(self.signer.verifier)
        if (stored.note if stored else None) != (self.last.note if self.last else None):
            raise LogVerificationError(
                f"the checkpoint of log {self.writer!r} changed behind its writer (another writer of that name?)"
            )
        if self.last is not None:
            self.check_consistent(self.last.checkpoint, new)
        else:
            self._register()
        signed = cp.sign(new, self.signer)
        try:
            # The history, create-once: every size ever signed stays provable (its partial tiles are
            # required), and a rollback of ``checkpoint`` shows against it.
            self.store.put_bytes(self.key(history_path(new.size)), signed, content_type=CHECKPOINT_TYPE)
        except ObjectConflictError:
            raise LogVerificationError(
                f"log {self.writer!r} already holds another checkpoint of {new.size} leaves: a fork"
            ) from None
        self.store.replace_bytes(self.key("checkpoint"), signed, content_type=CHECKPOINT_TYPE)
        self.last = Head(new, signed)
