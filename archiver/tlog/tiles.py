"""C2SP tlog-tiles, pure: tile and entry-bundle paths, bundle encoding, a tree's right edge, subtree hashes from tiles.

https://c2sp.org/tlog-tiles. A level-L tile holds up to 256 hashes of Merkle level 8L; full tiles
are immutable, a partial tile's path carries its width (``.p/<W>``), so every tile object is
written once. :class:`TreeEdge` is the writer's whole memory of its log: the hashes of the
rightmost (partial) tile of every level and the rightmost partial entry bundle; appending a leaf
completes full tiles as it goes. :class:`TileHashes` answers ``mth(lo, hi)`` for proofs from tiles
read through a callback.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from archiver.errors import LogError, LogVerificationError
from archiver.tlog.merkle import HASH_SIZE, leaf_hash, node_hash, root_of

TILE_WIDTH = 256
TILE_HEIGHT = 8
MAX_ENTRY = 0xFFFF

#: Reads a tile: (level, index, width) → its bytes; level -1 is the entry bundle.
ReadTile = Callable[[int, int, int], bytes]


def index_path(n: int) -> str:
    """``<N>`` of a tile path: 3-digit groups, all but the last prefixed with ``x`` (1234067 → x001/x234/067)."""
    if n < 0:
        raise LogError("a tile index is not negative")
    groups = [f"{n % 1000:03d}"]
    n //= 1000
    while n:
        groups.append(f"x{n % 1000:03d}")
        n //= 1000
    return "/".join(reversed(groups))


def tile_path(level: int, n: int, width: int = TILE_WIDTH) -> str:
    """``tile/<L>/<N>[.p/<W>]``; level -1 means the entry bundle ``tile/entries/<N>[.p/<W>]``."""
    if not 1 <= width <= TILE_WIDTH or not -1 <= level <= 63:
        raise LogError(f"no tile of level {level} and width {width}")
    head = "tile/entries" if level < 0 else f"tile/{level}"
    tail = "" if width == TILE_WIDTH else f".p/{width}"
    return f"{head}/{index_path(n)}{tail}"


def encode_bundle(entries: Sequence[bytes]) -> bytes:
    """An entry bundle: each entry as a big-endian uint16 length and its bytes."""
    out = bytearray()
    for entry in entries:
        if len(entry) > MAX_ENTRY:
            raise LogError(f"a log entry of {len(entry)} bytes is longer than {MAX_ENTRY}")
        out += len(entry).to_bytes(2, "big") + entry
    return bytes(out)


def decode_bundle(data: bytes) -> list[bytes]:
    """The entries of a bundle; ``LogError`` when it is truncated."""
    entries: list[bytes] = []
    pos = 0
    while pos < len(data):
        if pos + 2 > len(data):
            raise LogError("an entry bundle ends inside a length")
        size = int.from_bytes(data[pos : pos + 2], "big")
        if pos + 2 + size > len(data):
            raise LogError("an entry bundle ends inside an entry")
        entries.append(data[pos + 2 : pos + 2 + size])
        pos += 2 + size
    return entries


def split_hashes(data: bytes) -> list[bytes]:
    if len(data) % HASH_SIZE or not data:
        raise LogError(f"a hash tile of {len(data)} bytes is not a whole number of hashes")
    return [data[i : i + HASH_SIZE] for i in range(0, len(data), HASH_SIZE)]


def widths(size: int) -> list[tuple[int, int, int]]:
    """The partial tiles of a tree of ``size`` leaves: (level, index, width) for each non-empty one."""
    out: list[tuple[int, int, int]] = []
    level, count = 0, size
    while count:
        if count % TILE_WIDTH:
            out.append((level, count // TILE_WIDTH, count % TILE_WIDTH))
        level, count = level + 1, count // TILE_WIDTH
    return out


def _perfect_subtrees(hashes: Sequence[bytes]) -> list[bytes]:
    """Roots of the perfect subtrees that ``hashes`` (aligned at a tile start) decompose into, left to right."""
    out: list[bytes] = []
    pos, n = 0, len(hashes)
    while pos < n:
        k = 1 << ((n - pos).bit_length() - 1)
        out.append(root_of(hashes[pos : pos + k]))
        pos += k
    return out


@dataclass
class TreeEdge:
    """A log's right edge: enough to append leaves, name the objects to write, and compute the root."""

    size: int = 0
    #: Per level, the hashes in its rightmost, not yet full tile.
    levels: list[list[bytes]] = field(default_factory=lambda: [[]])
    #: Entries of the rightmost, not yet full bundle.
    entries: list[bytes] = field(default_factory=list)

    def append(self, entry: bytes) -> list[tuple[str, bytes]]:
        """Add one entry; the full bundle and tiles it completed, as (path, bytes) to write create-once."""
        if len(entry) > MAX_ENTRY:
            raise LogError(f"a log entry of {len(entry)} bytes is longer than {MAX_ENTRY}")
        done: list[tuple[str, bytes]] = []
        n = self.size // TILE_WIDTH
        self.entries.append(entry)
        if len(self.entries) == TILE_WIDTH:
            done.append((tile_path(-1, n), encode_bundle(self.entries)))
            self.entries = []
        value = leaf_hash(entry)
        level = 0
        index = self.size
        while True:
            tier = self.levels[level]
            tier.append(value)
            if len(tier) < TILE_WIDTH:
                break
            index //= TILE_WIDTH
            done.append((tile_path(level, index), b"".join(tier)))
            value = root_of(tier)
            self.levels[level] = []
            level += 1
            if level == len(self.levels):
                self.levels.append([])
        self.size += 1
        return done

    def partials(self) -> list[tuple[str, bytes]]:
        """The partial bundle and tiles of the current size (what a checkpoint at this size needs)."""
        out: list[tuple[str, bytes]] = []
        for level, n, width in widths(self.size):
            if level == 0:
                out.append((tile_path(-1, n, width), encode_bundle(self.entries)))
            out.append((tile_path(level, n, width), b"".join(self.levels[level])))
        return out

    def root(self) -> bytes:
        subtrees: list[bytes] = []
        for tier in reversed(self.levels):
            subtrees.extend(_perfect_subtrees(tier))
        if not subtrees:
            return root_of([])
        root = subtrees[-1]
        for left in reversed(subtrees[:-1]):
            root = node_hash(left, root)
        return root

    @classmethod
    def from_partials(cls, size: int, read: ReadTile) -> TreeEdge:
        """Rebuild the edge of a tree of ``size`` from its partial tiles (read through ``read``)."""
        levels: list[list[bytes]] = [[]]
        entries: list[bytes] = []
        for level, n, width in widths(size):
            while len(levels) <= level:
                levels.append([])
            hashes = split_hashes(read(level, n, width))
            if len(hashes) != width:
                raise LogError(f"tile {tile_path(level, n, width)} holds {len(hashes)} hashes, not {width}")
            levels[level] = hashes
            if level == 0:
                entries = decode_bundle(read(-1, n, width))
                if len(entries) != width or [leaf_hash(e) for e in entries] != hashes:
                    raise LogVerificationError(f"entry bundle {tile_path(-1, n, width)} does not match its hash tile")
        return cls(size, levels, entries)


class TileHashes:
    """``mth(lo, hi)`` of a tree of ``size`` leaves from its tiles, each tile read at most once."""

    def __init__(self, size: int, read: ReadTile) -> None:
        self.size = size
        self._read = read
        self._tiles: dict[tuple[int, int], list[bytes]] = {}

    def _tile(self, level: int, n: int) -> list[bytes]:
        cached = self._tiles.get((level, n))
        if cached is None:
            available = self.size // TILE_WIDTH**level
            width = min(TILE_WIDTH, available - n * TILE_WIDTH)
            if width <= 0:
                raise LogError(f"tile {level}/{n} is beyond a tree of size {self.size}")
            cached = split_hashes(self._read(level, n, width))
            if len(cached) != width:
                raise LogError(f"tile {tile_path(level, n, width)} holds {len(cached)} hashes, not {width}")
            self._tiles[(level, n)] = cached
        return cached

    def node(self, height: int, index: int) -> bytes:
        """The hash of the perfect subtree of 2**height leaves starting at leaf index * 2**height."""
        level, rest = divmod(height, TILE_HEIGHT)
        first = index << rest
        tile = self._tile(level, first // TILE_WIDTH)
        offset = first % TILE_WIDTH
        return root_of(tile[offset : offset + (1 << rest)])

    def mth(self, lo: int, hi: int) -> bytes:
        """MTH(D[lo:hi]) for a range RFC 6962's recursion asks for (lo aligned to the range's split)."""
        if not 0 <= lo < hi <= self.size:
            raise LogError(f"no subtree [{lo}, {hi}) in a tree of size {self.size}")
        parts: list[bytes] = []
        pos = lo
        while pos < hi:
            height = (pos & -pos).bit_length() - 1 if pos else 64
            while pos + (1 << height) > hi:
                height -= 1
            parts.append(self.node(height, pos >> height))
            pos += 1 << height
        root = parts[-1]
        for left in reversed(parts[:-1]):
            root = node_hash(left, root)
        return root
