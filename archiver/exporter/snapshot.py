"""The bytes of one poll's exposition (`Snapshot`) and how a scrape sends them: precompressed deflate
parts stitched into ONE gzip member per response (see `archiver.exporter.exposition` for why)."""

from __future__ import annotations

import functools
import struct
import zlib
from dataclasses import dataclass

# ISA-L's deflate: several times faster than zlib's at level 1 on metric text, and smaller.
from isal import isal_zlib

CONTENT_TYPE_TEXT = "text/plain; version=0.0.4; charset=utf-8"
CONTENT_TYPE_OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"

#: gzip header: deflate, no flags, mtime 0 (reproducible bytes), no extra flags, OS unknown.
GZIP_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"
#: Level 1: the body is compressed once per poll and served to every scrape, so speed matters more
#: than the last few percent of size that higher levels buy at several times the CPU.
LEVEL = 1


def deflate_segment(data: bytes) -> bytes:
    """Raw deflate of `data` ending in a sync flush: byte-aligned and not final, so more deflate
    blocks (another segment, or the final tail) can follow it inside the same gzip member."""
    if not data:
        return b""
    compressor = isal_zlib.compressobj(LEVEL, isal_zlib.DEFLATED, -15)
    return compressor.compress(data) + compressor.flush(isal_zlib.Z_SYNC_FLUSH)


def deflate_final(data: bytes) -> bytes:
    """Raw deflate of `data` that ends the stream (its last block is final); small inputs only."""
    compressor = zlib.compressobj(LEVEL, zlib.DEFLATED, -15)
    return compressor.compress(data) + compressor.flush()


#: The self-metrics tail, compressed: SelfMetrics.render hands out the same bytes object until an
#: event changes it, so consecutive scrapes compress it once (hashing bytes is cached per object).
_deflate_tail = functools.lru_cache(maxsize=8)(deflate_final)


def crc32(data: bytes, start: int = 0) -> int:
    """CRC-32 as gzip needs it, continuing from `start` (the CRC of the bytes before `data`)."""
    return isal_zlib.crc32(data, start)


def gzip_trailer(crc: int, length: int) -> bytes:
    return struct.pack("<II", crc & 0xFFFFFFFF, length & 0xFFFFFFFF)


def gzip_compress(data: bytes) -> bytes:
    """A complete single-member gzip of `data` built the same way as scrape responses."""
    return GZIP_HEADER + deflate_final(data) + gzip_trailer(crc32(data), len(data))


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The exposition bytes of one poll, ready to be written to any number of scrapes.

    Kept as parts rather than one body per format: the session block (megabytes) is shared by both
    formats, so no per-format copy of it exists in memory, and it is held as chunks of a few hundred
    KB (`blocks.coalesce`), never one fresh multi-megabyte allocation per poll. Order in a body:
    session block, upstream block, then the self metrics appended per scrape (see `scrape_parts`).
    The `text`/`openmetrics` properties join the parts (without self metrics) for tools and tests.
    """

    #: Aggregates, per-session families and archiver_sessions_exported/dropped; same in both formats.
    sessions_body: tuple[bytes, ...]
    #: The same as self-contained deflate segments (each byte-aligned, none final).
    sessions_deflate: tuple[bytes, ...]
    upstream_text: bytes
    upstream_text_deflate: bytes
    upstream_openmetrics: bytes
    upstream_openmetrics_deflate: bytes
    #: CRC-32 of sessions_body + upstream block, per format: what the gzip trailer continues from.
    crc_text: int
    crc_openmetrics: int
    rendered_at: float
    sessions_exported: int
    sessions_dropped: int
    #: Bytes in sessions_body.
    sessions_length: int = 0

    def body_parts(self, *, openmetrics: bool) -> tuple[bytes, ...]:
        """The uncompressed parts in order."""
        return (*self.sessions_body, self.upstream_openmetrics if openmetrics else self.upstream_text)

    def deflate_parts(self, *, openmetrics: bool) -> tuple[tuple[bytes, ...], int, int]:
        """The deflate parts, the CRC-32 and the length of the uncompressed body."""
        if openmetrics:
            deflated = (*self.sessions_deflate, self.upstream_openmetrics_deflate)
            return deflated, self.crc_openmetrics, self.sessions_length + len(self.upstream_openmetrics)
        deflated = (*self.sessions_deflate, self.upstream_text_deflate)
        return deflated, self.crc_text, self.sessions_length + len(self.upstream_text)

    @property
    def text(self) -> bytes:
        return b"".join(self.body_parts(openmetrics=False))

    @property
    def openmetrics(self) -> bytes:
        return b"".join(self.body_parts(openmetrics=True))

    @property
    def text_gzip(self) -> bytes:
        return b"".join(scrape_parts(self, b"", openmetrics=False, gzip=True))

    @property
    def openmetrics_gzip(self) -> bytes:
        return b"".join(scrape_parts(self, b"", openmetrics=True, gzip=True))


def scrape_parts(snapshot: Snapshot | None, self_metrics: bytes, *, openmetrics: bool, gzip: bool) -> tuple[bytes, ...]:
    """Everything a `/metrics` response body consists of, in order, ready to be written.

    `self_metrics` is rendered when it changed (for OpenMetrics it already ends with `# EOF`). With
    gzip, only `self_metrics` is compressed here (a few KB, once per distinct tail); the snapshot's
    deflate parts are reused and the trailer's CRC continues from the snapshot's precomputed one.
    """
    if not gzip:
        if snapshot is None:
            return (self_metrics,)
        return (*snapshot.body_parts(openmetrics=openmetrics), self_metrics)
    if snapshot is None:
        deflated: tuple[bytes, ...] = ()
        crc, length = 0, 0
    else:
        deflated, crc, length = snapshot.deflate_parts(openmetrics=openmetrics)
    trailer = gzip_trailer(crc32(self_metrics, crc), length + len(self_metrics))
    return (GZIP_HEADER, *deflated, _deflate_tail(self_metrics), trailer)
