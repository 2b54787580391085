"""Decoding of the HTTP/1.1 chunked transfer coding (RFC 9112 section 7.1) from raw connection reads,
strictly: a body either comes out whole or the decoder raises; it never guesses where a chunk ends."""

from __future__ import annotations

import re
from collections.abc import Callable, Generator

import httpcore

#: Longest size line or trailer line accepted (h11 allows a 16 KiB header block; extensions are rare).
MAX_LINE = 16 * 1024
#: Most trailer bytes accepted after the last chunk: a server sending trailers forever is an error,
#: not a stall the read timeout would end.
MAX_TRAILERS = 64 * 1024
# chunk-size [BWS chunk-ext]: 1 to 16 hex digits (a size past 2**64 is no real body), then
# extensions we skip but check for control characters (a bare LF inside a line is a framing error).
_SIZE_LINE = re.compile(rb"([0-9A-Fa-f]{1,16})[ \t]*(;[^\x00-\x08\x0a-\x1f\x7f]*)?")
_TRAILER_LINE = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+:[^\x00-\x08\x0a-\x1f\x7f]*")


def decode_chunked(buffered: bytes, read: Callable[[], bytes]) -> Generator[bytes, None, int]:
    """The body's data, from `buffered` (raw bytes already received past the headers) then `read()`
    (the next raw bytes; b"" when the peer closed). Ends after the last chunk and its trailers;
    bytes after those are not asked for, and how many of them were already read is the generator's
    return value (0: the connection is at the start of the next response). A malformed framing
    raises `httpcore.RemoteProtocolError`, a body cut short `httpcore.ReadError`.

    Chunk data is yielded as slices of the reads (a read wholly inside a chunk is yielded as is):
    one copy at most per byte."""
    data, pos = buffered, 0
    while True:
        line, data, pos = _line(data, pos, read, "chunk size line")
        match = _SIZE_LINE.fullmatch(line)
        if match is None:
            raise httpcore.RemoteProtocolError(f"malformed chunk size line {line[:40]!r}")
        size = int(match[1], 16)
        if size == 0:
            break
        while size:
            if pos == len(data):
                data, pos = _more(read, "mid-chunk"), 0
            end = min(len(data), pos + size)
            yield data[pos:end]  # the whole of `data` is the same object, no copy
            size -= end - pos
            pos = end
        while len(data) - pos < 2:
            data, pos = data[pos:] + _more(read, "before a chunk's CRLF"), 0
        if data[pos : pos + 2] != b"\r\n":
            raise httpcore.RemoteProtocolError("chunk data not followed by CRLF (wrong chunk size?)")
        pos += 2
    trailers = 0
    while True:
        line, data, pos = _line(data, pos, read, "trailers")
        if not line:
            return len(data) - pos
        trailers += len(line) + 2
        if trailers > MAX_TRAILERS or _TRAILER_LINE.fullmatch(line) is None:
            raise httpcore.RemoteProtocolError(f"malformed or oversized trailer {line[:40]!r}")


def _line(data: bytes, pos: int, read: Callable[[], bytes], what: str) -> tuple[bytes, bytes, int]:
    """The next CRLF-terminated line (without CRLF) and where the rest starts."""
    searched = pos
    while True:
        end = data.find(b"\r\n", searched)
        if (end if end >= 0 else len(data)) - pos > MAX_LINE:
            raise httpcore.RemoteProtocolError(f"{what}: a line longer than {MAX_LINE} bytes")
        if end >= 0:
            return data[pos:end], data, end + 2
        # A CR may end this read and its LF start the next: search again from that CR.
        searched = max(0, len(data) - pos - 1)
        data, pos = data[pos:] + _more(read, what), 0


def _more(read: Callable[[], bytes], where: str) -> bytes:
    chunk = read()
    if not chunk:
        raise httpcore.ReadError(f"the server closed the connection {where} (incomplete chunked body)")
    return chunk
