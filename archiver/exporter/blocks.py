"""The per-session series of a poll kept in blocks of sessions: each family's part of a block is joined,
checksummed and compressed once and reused, byte for byte, until one of the block's sessions changes.

Why blocks, and why this size. A poll that changes 2 % of the sessions should not pay for the other
98 %: unchanged sessions keep their rendered lines (`exposition._Entry`), and here unchanged *blocks*
keep their joined bytes, their CRC-32 and their compressed form. A block's compressed part is a
self-contained deflate segment (the shared compressor is reset by a full flush after every part),
so parts can be stitched in any order into the one gzip member a scrape sends.

Each part's full flush costs about as much as compressing a few KB, and a small block compresses
worse on its own, so small blocks cost more than they save; and sessions that end at random positions
leave almost every small block dirty anyway. So blocks are large (`BLOCK_SESSIONS`): a random churn
then costs about what one full pass costs, while the common shapes cost a fraction: player counts
changing touch only the players family's parts, new sessions fill the tail block, and sessions
ending oldest-first empty the head blocks. `benchmarks/scrape.py` (`--churn random|oldest`) guards it.
"""

from __future__ import annotations

import operator
import threading
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

from isal import isal_zlib

from archiver.exporter.snapshot import LEVEL

#: Sessions per block: parts of tens of KB, so a full flush's cost is noise and a poll's joins reuse
#: heap memory rather than being mapped and faulted in afresh (glibc maps large allocations of their
#: own).
BLOCK_SESSIONS = 512
#: Chunks a scrape writes are coalesced up to about this size (one write each, heap-sized).
CHUNK_BYTES = 192 * 1024
#: Dirty bytes from which a build compresses on two threads (below, the hand-off costs more).
PARALLEL_BYTES = 512 * 1024

#: One session's sample lines, one bytes per family (b"" when it has no sample in that family).
Lines = Sequence[bytes]


class _Block:
    """Some sessions (in insertion order) and, per family, their joined lines and what derives from them."""

    __slots__ = ("crc", "deflated", "dirty", "members", "raw")

    def __init__(self, families: int) -> None:
        #: Each member's id and current lines: a build reads them in order, with no look-up per id.
        self.members: dict[str, Lines] = {}
        self.raw: list[bytes] = [b""] * families
        self.deflated: list[bytes] = [b""] * families
        self.crc: list[int] = [0] * families
        #: Families whose part must be built again (all of them for a new block).
        self.dirty: set[int] = set(range(families))


class SessionBlocks:
    """Blocks of exported sessions and their built parts, updated by the sessions that changed.

    Not thread-safe: the renderer (one poller thread) owns it. `update` takes what changed since the
    last call (and the new lines of the sessions added or changed); `build` re-joins and
    re-compresses the dirty parts only; `family_parts` then hands out one family's parts in block order.
    """

    def __init__(self, families: int, *, block_sessions: int = BLOCK_SESSIONS) -> None:
        if block_sessions < 1:
            raise ValueError("block_sessions must be at least 1")
        self._families = families
        #: Each family's line out of a member's lines.
        self._line_of = tuple(map(operator.itemgetter, range(families)))
        self._size = block_sessions
        self._blocks: list[_Block] = []
        self._where: dict[str, _Block] = {}
        #: How many parts `build` compressed since construction: lets tests observe reuse.
        self.parts_built = 0

    @property
    def blocks(self) -> int:
        return len(self._blocks)

    def update(
        self,
        *,
        removed: Iterable[str],
        added: Iterable[str],
        changed: Mapping[str, Iterable[int]],
        lines_of: Mapping[str, Lines],
    ) -> None:
        """Record a poll's changes: ids no longer exported, ids newly exported (appended to the tail
        block), and ids whose lines changed in the given families; `lines_of[id]` are the current
        lines of every added and changed id."""
        families = range(self._families)
        emptied = False
        for sid in removed:
            block = self._where.pop(sid)
            del block.members[sid]
            block.dirty.update(families)
            emptied = emptied or not block.members
        for sid, which in changed.items():
            block = self._where[sid]
            block.members[sid] = lines_of[sid]
            block.dirty.update(which)
        tail = self._blocks[-1] if self._blocks else None
        for sid in added:
            if tail is None or len(tail.members) >= self._size:
                tail = _Block(self._families)
                self._blocks.append(tail)
            tail.members[sid] = lines_of[sid]
            tail.dirty.update(families)
            self._where[sid] = tail
        if emptied:
            self._blocks = [block for block in self._blocks if block.members]
        # Ends at random positions thin blocks out: once there are twice as many as full blocks would
        # need, all are packed again (one full build, amortised over the polls that thinned them).
        if len(self._blocks) > 2 * (-(-len(self._where) // self._size)) + 1:
            self._repack()

    def _repack(self) -> None:
        members = {sid: lines for block in self._blocks for sid, lines in block.members.items()}
        self._blocks, self._where = [], {}
        self.update(removed=(), added=members, changed={}, lines_of=members)

    def build(self) -> None:
        """Join, checksum and compress every dirty part from its members' current lines."""
        todo: list[tuple[_Block, int]] = []
        for block in self._blocks:
            if not block.dirty:
                continue
            lines = block.members.values()
            for family in sorted(block.dirty):
                # One family's column read straight from the members' lines: a zip of all of them
                # touched every family's bytes objects (one cache miss each, for every session of
                # the block) where most polls rebuild only the players part of a block.
                raw = block.raw[family] = b"".join(map(self._line_of[family], lines))
                if raw:
                    todo.append((block, family))
                else:
                    block.deflated[family], block.crc[family] = b"", 0
            block.dirty.clear()
        self.parts_built += len(todo)
        if len(todo) < 2 or sum(len(block.raw[family]) for block, family in todo) < PARALLEL_BYTES:
            _compress(todo)
            return
        # Like pigz: ISA-L releases the GIL while it compresses, so a second thread halves the wall
        # time of a big build (every block dirty). Interleaved halves get
        # a similar mix of families, hence of bytes.
        helper = _helper_pool().submit(_compress, todo[1::2])
        _compress(todo[::2])
        helper.result()

    def family_parts(self, family: int) -> tuple[list[bytes], list[bytes], list[int]]:
        """One family's built parts in block order: raw bytes, deflate segments and CRC-32s."""
        blocks = self._blocks
        raw = list(map(operator.itemgetter(family), map(operator.attrgetter("raw"), blocks)))
        deflated = list(map(operator.itemgetter(family), map(operator.attrgetter("deflated"), blocks)))
        crcs = list(map(operator.itemgetter(family), map(operator.attrgetter("crc"), blocks)))
        return raw, deflated, crcs


def _compress(parts: Sequence[tuple[_Block, int]]) -> None:
    """Checksum and compress these parts of their blocks, each a self-contained deflate segment."""
    compressor = isal_zlib.compressobj(LEVEL, isal_zlib.DEFLATED, -15)
    for block, family in parts:
        raw = block.raw[family]
        block.crc[family] = isal_zlib.crc32(raw)
        # A full flush ends the part byte-aligned and resets the compressor's history, so the part
        # never refers to bytes before it: it stays valid next to any other part.
        block.deflated[family] = compressor.compress(raw) + compressor.flush(isal_zlib.Z_FULL_FLUSH)


_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _helper_pool() -> ThreadPoolExecutor:
    """The process's one compression helper thread, started on the first big build. Shared by every
    renderer (a sharded test runs several): a build only waits for its own half."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="exposition-deflate")
        return _pool


def combine_crc(crc: int, parts: Iterable[bytes], crcs: Iterable[int]) -> int:
    """The CRC-32 of the bytes before `parts` (`crc`) continued over `parts`, from their own CRCs."""
    combine = isal_zlib.crc32_combine
    for part, part_crc in zip(parts, crcs, strict=True):
        if part:
            crc = combine(crc, part_crc, len(part))
    return crc


def coalesce(parts: Iterable[bytes], limit: int = CHUNK_BYTES) -> tuple[bytes, ...]:
    """`parts` joined into chunks of about `limit` bytes (a part larger than `limit` stays whole), so a
    scrape writes a few chunks rather than hundreds of parts, and no chunk is a fresh large mapping."""
    chunks: list[bytes] = []
    pending: list[bytes] = []
    size = 0
    for part in parts:
        if not part:
            continue
        if size and size + len(part) > limit:
            chunks.append(b"".join(pending))
            pending, size = [], 0
        pending.append(part)
        size += len(part)
    if pending:
        chunks.append(b"".join(pending))
    return tuple(chunks)
