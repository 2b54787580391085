"""Streaming gunzip and hashing of stored logs: read back (`archiver logs/grep`) and compared by content (uploads)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator

# ISA-L's inflate (already the exporter's deflate): the zlib API at 2-3 times zlib's speed, which
# is most of what `archiver grep` spends its CPU on.
from isal import isal_zlib

from archiver.errors import ArchiveIntegrityError
from archiver.textsafe import printable

#: What ISA-L raises for data that is not valid gzip (its stub calls it an instance, not a class).
_INFLATE_ERROR: type[Exception] = isal_zlib.error  # type: ignore[assignment]
#: Most decompressed bytes one step yields: memory stays flat however well the logs compress.
MAX_DECOMPRESSED_CHUNK = 1024 * 1024


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
