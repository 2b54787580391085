"""The stored logs' gzip both ways: deterministic compression (fetch, live capture) and streaming
gunzip and hashing (read back by `archiver logs/grep`, compared by content by uploads)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator

# ISA-L's inflate (already the exporter's deflate): the zlib API at 2-3 times zlib's speed, which
# is most of what `archiver grep` spends its CPU on.
from isal import isal_zlib

from archiver.errors import ArchiveIntegrityError
from archiver.textsafe import printable

#: ISA-L level 1: a small fraction of the CPU zlib's level 6 takes, for a stored log somewhat larger
#: (when thousands of sessions end at once, the CPU is the limit). The stored bytes therefore differ
#: from an older archiver's; replicas compare logs by their uncompressed content (`Uploader.upload`),
#: so that is no conflict.
GZIP_LEVEL = 1
#: The pieces logs are compressed in (see `gzip_blocks`).
DEFLATE_BLOCK = 64 * 1024
#: What ISA-L raises for data that is not valid gzip (its stub calls it an instance, not a class).
_INFLATE_ERROR: type[Exception] = isal_zlib.error  # type: ignore[assignment]
#: Most decompressed bytes one step yields: memory stays flat however well the logs compress.
MAX_DECOMPRESSED_CHUNK = 1024 * 1024


def gzip_blocks(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """One gzip member of `chunks` (mtime 0, no name), fed to ISA-L in blocks of `DEFLATE_BLOCK` bytes.

    ISA-L's output depends on how its input is cut (zlib's does not), and chunks arrive as the
    network cuts them: re-cut into fixed blocks, the same log always gives the same bytes (with the
    same ISA-L), so two fetches of it, or a fetch and a live capture's seal, store one object.
    """
    compressor = isal_zlib.compressobj(GZIP_LEVEL, isal_zlib.DEFLATED, 31)  # 31: gzip
    pending = bytearray()
    for chunk in chunks:
        pending += chunk
        whole = len(pending) - len(pending) % DEFLATE_BLOCK
        if not whole:
            continue
        with memoryview(pending) as view:
            for start in range(0, whole, DEFLATE_BLOCK):
                data = compressor.compress(view[start : start + DEFLATE_BLOCK])
                if data:
                    yield data
        del pending[:whole]
    yield compressor.compress(pending) + compressor.flush()


def gunzip(chunks: Iterable[bytes], key: str, max_out: int = MAX_DECOMPRESSED_CHUNK) -> Iterator[bytes]:
    """Decompress a gzip stream incrementally (several members allowed); corrupt → ArchiveIntegrityError.

    Yields at most ``max_out`` bytes at a time (a megabyte of gzip may inflate to a gigabyte).
    A stream cut inside a member yields what could be decoded, then raises: for forensics the
    readable start of a damaged log is still worth seeing.
    """
    decoder = isal_zlib.decompressobj(isal_zlib.MAX_WBITS | 16)
    in_member = False
    for chunk in chunks:
        data = chunk
        drain = False
        while data or drain:
            in_member = True
            try:
                out = decoder.decompress(data, max_out)
            except _INFLATE_ERROR as exc:
                raise ArchiveIntegrityError(f"{printable(key)} is not valid gzip ({exc})") from None
            if out:
                yield out
            if decoder.eof:
                # Concatenated gzip members are one valid stream (`cat a.gz b.gz`).
                data = decoder.unused_data
                decoder = isal_zlib.decompressobj(isal_zlib.MAX_WBITS | 16)
                in_member = False
                drain = False
            else:
                data = decoder.unconsumed_tail
                # Output cut at max_out may leave decoded bytes inside the inflater with no input left.
                drain = len(out) == max_out
    if in_member:
        tail = decoder.flush()
        if tail:
            yield tail
        raise ArchiveIntegrityError(f"{printable(key)} ends in the middle of its gzip data (truncated)")


class Hashing:
    """Passes chunks through while hashing and counting them (verification after streaming)."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._chunks = chunks
        self.digest = hashlib.sha256()
        self.size = 0
        self.complete = False

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self._chunks:
            self.digest.update(chunk)
            self.size += len(chunk)
            yield chunk
        self.complete = True
