"""Deterministic file content of a session's virtual filesystem: same session id and path, same bytes."""

from __future__ import annotations

import hashlib
import posixpath
import random
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Literal

#: Generation block: large enough to amortise Python overhead, small enough to keep memory flat.
BLOCK_SIZE = 64 * 1024

SERVER_LOG = "/var/log/game/server.log"
REPLAY = "/srv/replays/match.replay"
CRASH_CORE = "/srv/crash/core.txt"

DEFAULT_SIZES: Mapping[str, int] = {SERVER_LOG: 256 * 1024, REPLAY: 1024 * 1024}
CRASH_CORE_SIZE = 16 * 1024

#: Files with these suffixes get text content; everything else is incompressible binary.
TEXT_SUFFIXES = (".log", ".txt", ".json", ".cfg", ".ini", ".csv", ".yaml", ".yml")

FileKind = Literal["text", "binary"]


@dataclass(frozen=True, slots=True)
class FileSpec:
    """One file of a session's container: absolute normalised path, exact size, kind of content."""

    path: str
    size: int
    kind: FileKind


def seed_for(session_id: str, purpose: str) -> int:
    """A seed stable across processes (sha256, never Python's randomised ``hash()``)."""
    raw = f"{session_id}\0{purpose}".encode("utf-8", "surrogatepass")
    return int.from_bytes(hashlib.sha256(raw).digest()[:16], "big")


def normalise_path(path: str) -> str | None:
    """The canonical absolute form of a container path, or None if it is not absolute."""
    if not path.startswith("/"):
        return None
    norm = posixpath.normpath(path)
    # normpath keeps a leading "//" (POSIX allows it to mean something else); containers do not.
    return "/" + norm.lstrip("/")


def file_kind(path: str) -> FileKind:
    """Text for log-like suffixes, binary otherwise."""
    return "text" if path.lower().endswith(TEXT_SUFFIXES) else "binary"


def session_files(extra: Mapping[str, int], *, crashed: bool) -> dict[str, FileSpec]:
    """Every session's default files (plus the crash core when it crashed), then ``extra`` sizes.

    ``extra`` maps absolute paths to sizes; a default path in it changes that file's size.
    Raises ValueError for a relative path or a negative size.
    """
    sizes = dict(DEFAULT_SIZES)
    if crashed:
        sizes[CRASH_CORE] = CRASH_CORE_SIZE
    for raw_path, size in extra.items():
        path = normalise_path(raw_path)
        if path is None or path == "/":
            raise ValueError(f"file path must be absolute and name a file: {raw_path!r}")
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise ValueError(f"file size must be a non-negative integer: {raw_path!r}")
        sizes[path] = size
    return {p: FileSpec(p, s, file_kind(p)) for p, s in sorted(sizes.items())}


def iter_file(session_id: str, spec: FileSpec) -> Iterator[bytes]:
    """The file's bytes in blocks of at most ``BLOCK_SIZE``, generated as they are consumed."""
    seed = seed_for(session_id, "file:" + spec.path)
    if spec.kind == "binary":
        yield from _binary_blocks(seed, spec.size)
    else:
        pool = _CRASH_POOL if "crash" in spec.path or "core" in spec.path else _LOG_POOL
        yield from _text_blocks(random.Random(seed), spec.size, pool)


def _binary_blocks(seed: int, size: int) -> Iterator[bytes]:
    # SHAKE-128 of (seed, block number): incompressible like random bytes, at about three times the
    # speed of Mersenne Twister's randbytes, so that in the benchmarks the stand-in upstream takes
    # less of the machine's CPU from the archiver it serves.
    remaining = size
    index = 0
    while remaining > 0:
        n = min(BLOCK_SIZE, remaining)
        remaining -= n
        yield hashlib.shake_128(b"%d:%d" % (seed, index)).digest(n)
        index += 1


def _text_blocks(rng: random.Random, size: int, templates: tuple[str, ...]) -> Iterator[bytes]:
    # Lines come from a per-file pool of 256 rendered lines picked by random byte, with an uptime
    # mark every 512 lines: joining pre-rendered bytes runs at hundreds of MB/s where formatting
    # every line would not.
    pool = [
        (templates[rng.randrange(len(templates))] % (rng.randint(1, 64), rng.randint(1, 999))).encode() + b"\n"
        for _ in range(256)
    ]
    remaining = size
    buf = b""
    batch = 0
    while remaining > 0:
        while len(buf) < BLOCK_SIZE:
            mark = b"[%09.3f] INFO  -- mark %d --\n" % (batch * 25.6, batch)
            buf += mark + b"".join([pool[p] for p in rng.randbytes(512)])
            batch += 1
        n = min(BLOCK_SIZE, remaining)
        out, buf = buf[:n], buf[n:]
        remaining -= n
        yield out


# Templates take two integers (%d, %d).
_LOG_POOL: tuple[str, ...] = (
    "INFO  tick rate 60Hz, %d entities replicated, %d bytes",
    "INFO  player joined slot %d (rtt %dms)",
    "INFO  player left slot %d after %ds (disconnect)",
    "INFO  round %d started, %d spectators",
    "INFO  round ended, score %d-%d",
    "INFO  checkpoint %d saved in %dms",
    "WARN  tick %d took %dms (budget 16ms)",
    "WARN  packet loss %d%% on slot %d",
    "DEBUG snapshot %d delta %d bytes",
    "ERROR asset cache miss %d: textures/flag_%d.dds",
)

_CRASH_POOL: tuple[str, ...] = (
    "#%d  0x00007f3a2c1d4e10 in GameLoop::tick() at game_loop.cpp:%d",
    "#%d  0x00007f3a2c1d2b77 in World::step(float) at world.cpp:%d",
    "#%d  0x00007f3a2c1c9a01 in Server::run() at server.cpp:%d",
    "thread %d: frame %d: <optimised out>",
    "signal SIGSEGV (thread %d, address 0x%08x)",
)
