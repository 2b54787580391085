"""The wire-level pieces of the session hosting API client: bearer auth (the token never in a repr),
streamed bodies, and the helpers that read headers."""

from __future__ import annotations

import email.utils
import time
from collections.abc import Generator, Iterator
from types import TracebackType
from typing import Protocol
from urllib.parse import quote

import h11
import httpcore
import httpx
from h11._receivebuffer import ReceiveBuffer  # private: guarded use in `_body_done`

from archiver import inputs
from archiver.credentials import Token
from archiver.errors import ApiRequestError, ApiTransportError
from archiver.upstream.chunked import decode_chunked


class BearerAuth(httpx.Auth):
    """Adds the bearer header per request, so the token is never part of the client's default headers.

    The token is asked for on every request (a token file is re-read when it changes); a 401 makes
    it re-read its file at once, and the request is sent once more if that gave a new token (the
    Secret was rotated upstream before its file changed here, or within the same mtime tick)."""

    def __init__(self, token: Token) -> None:
        self._token = token

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        request.headers["Authorization"] = f"Bearer {self._token.reveal()}"
        response = yield request
        if response.status_code == 401 and self._token.reload():
            request.headers["Authorization"] = f"Bearer {self._token.reveal()}"
            yield request

    def __repr__(self) -> str:
        return "BearerAuth(***)"


class RequestObserver(Protocol):
    """Told about every HTTP attempt (metrics): endpoint template, status code or 'error', seconds."""

    def __call__(self, endpoint: str, code: str, seconds: float) -> None: ...


#: From this size a body is read past httpx's parser (`Download.iter_direct`); below, the connection's
#: reuse is worth more than the copies.
DIRECT_MIN_BYTES = 1024 * 1024
#: Bytes asked of the connection per read: httpx's own reads are 64 KiB; 16 KiB reads measured 2x the
#: CPU, 128 KiB the same, and more would exceed the daemon's mmap threshold (fresh pages per read).
_DIRECT_READ = 64 * 1024


class Download:
    """A streamed response body (logs, artifacts): iterate it, then close it (or use `with`)."""

    def __init__(self, response: httpx.Response) -> None:
        self._response = response
        self.content_type = response.headers.get("content-type", "")
        length = response.headers.get("content-length")
        self.content_length = int(length) if length and length.isdigit() else None

    def iter_bytes(self) -> Iterator[bytes]:
        """Chunks as they arrive; a broken stream raises ApiTransportError (the caller retries the item)."""
        request = self._response.request
        try:
            # No chunk size: httpx's default is measured 2x faster than 1 MiB chunks.
            yield from self._response.iter_bytes()
        except httpx.TransportError as exc:
            raise ApiTransportError(
                f"{request.method} {request_path(request)} broke mid-body: {describe_transport_error(exc)}",
                method=request.method,
                path=request_path(request),
            ) from None

    def iter_direct(self) -> Iterator[bytes]:
        """`iter_bytes` of a large plain HTTP/1.1 body, with a third of its CPU: past the first chunk,
        the body is read from the connection itself rather than through httpx's HTTP/1.1 parser,
        which copies every byte four more times (h11's buffer, two slices, `bytes()`: at 50,000
        sessions a 32 MB list took ~45 ms of CPU to drain that way, ~10 ms directly).

        h11 hands over everything it has buffered after the headers in its first data event, so
        after the first chunk the rest of the body is still in the socket: exactly `Content-Length`
        bytes (at least `DIRECT_MIN_BYTES`) are read from httpcore's `network_stream` (the documented
        extension; TLS included). The connection is not reused afterwards (h11 still waits
        for the body, so httpcore closes it on `close`): one new connection per large body. A
        chunked body, whatever its size, is decoded from the raw bytes instead
        (`iter_chunked_direct`), and there the connection is kept. Anything else
        (a small body, no length, a content or transfer encoding, HTTP/2, a transport without a
        network stream such as a test's mock) takes `iter_bytes`."""
        response = self._response
        stream = response.extensions.get("network_stream")
        length = self.content_length
        if self._chunked():
            yield from self.iter_chunked_direct()
            return
        if (
            length is None
            or length < DIRECT_MIN_BYTES
            or not isinstance(stream, httpcore.NetworkStream)
            or response.http_version != "HTTP/1.1"
            or not self._identity()
            or "transfer-encoding" in response.headers  # chunked framing wins over a length (RFC 9112)
        ):
            yield from self.iter_bytes()
            return
        # Kept alive (not advanced, not closed) until the response closes: closing it would close
        # the connection under the reads below.
        parsed = self.iter_bytes()
        first = next(parsed, b"")
        if first:
            yield first
        left = length - len(first)

        def read() -> Generator[bytes, None, int]:
            nonlocal left
            while left > 0:
                chunk = stream.read(min(left, _DIRECT_READ), self._read_timeout())
                if not chunk:
                    raise httpcore.ReadError("the server closed the connection")
                left -= len(chunk)
                yield chunk
            return 0

        try:
            yield from self._raw(read())
        finally:
            del parsed

    def iter_chunked_direct(self) -> Iterator[bytes]:
        """`iter_bytes` of a chunked HTTP/1.1 body, decoded from the connection's raw bytes
        (`decode_chunked`) rather than by h11, which copies every byte several times and hands out
        one chunk per event (a 5 MB artifact: see README "Reading bodies past httpx").

        Nothing of the body has gone through h11 yet: what it buffered past the headers is its
        `trailing_data` (public API), the rest is read from httpcore's `network_stream`. Reaching
        h11's connection takes httpx's and httpcore's private attributes (`_h11_connection`): when
        one of them is not what it was (an upgrade), or the body is not plain chunked HTTP/1.1 over
        a network stream, this is `iter_bytes`; tests fail when the direct path is not taken. Once the
        body ended exactly where the reads did, h11 is told so (`_body_done`) and the connection is
        reused; otherwise (bytes past the end, an error, a body left unread) httpcore closes it."""
        response = self._response
        stream = response.extensions.get("network_stream")
        state = _h11_connection(response)
        if (
            state is None
            or not isinstance(stream, httpcore.NetworkStream)
            or not self._chunked()
            or not self._identity()
            or response.num_bytes_downloaded
            or response.is_stream_consumed
        ):
            yield from self.iter_bytes()
            return
        buffered, closed = state.trailing_data

        def read() -> bytes:
            return b"" if closed else stream.read(_DIRECT_READ, self._read_timeout())

        past_end = yield from self._raw(decode_chunked(buffered, read))
        if not past_end and not closed:
            _body_done(state, buffered)

    def _raw(self, chunks: Generator[bytes, None, int]) -> Generator[bytes, None, int]:
        """`chunks` read past httpx, with its errors as `iter_bytes` raises them."""
        request = self._response.request
        try:
            return (yield from chunks)
        except (httpcore.TimeoutException, httpcore.NetworkError, httpcore.ProtocolError) as exc:
            raise ApiTransportError(
                f"{request.method} {request_path(request)} broke mid-body: {type(exc).__name__}: {exc}",
                method=request.method,
                path=request_path(request),
            ) from None

    def _read_timeout(self) -> float | None:
        timeout: float | None = self._response.request.extensions.get("timeout", {}).get("read")
        return timeout

    def _identity(self) -> bool:
        encoding: str = self._response.headers.get("content-encoding", "identity")
        return encoding.strip().lower() == "identity"

    def _chunked(self) -> bool:
        # h11 accepts no other transfer coding: this is exactly when it decodes the body as chunked.
        response = self._response
        return (
            response.http_version == "HTTP/1.1"
            and response.headers.get("transfer-encoding", "").strip().lower() == "chunked"
        )

    def close(self) -> None:
        self._response.close()

    def __enter__(self) -> Download:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _h11_connection(response: httpx.Response) -> h11.Connection | None:
    """The h11 connection `response` is read through, or None when httpx's or httpcore's private
    attributes on the way are not what httpx 0.28 / httpcore 1.0 have (then the caller falls back).

    The way: httpx's BoundSyncStream `_stream` -> its transport's ResponseStream `_httpcore_stream`
    -> httpcore's PoolByteStream `_stream` -> HTTP11ConnectionByteStream `_connection` (an
    HTTP11Connection) -> `_h11_state`. Only a connection still waiting for this response's body
    (h11 `SEND_BODY`) is returned."""
    stream: object = response.stream
    for attribute in ("_stream", "_httpcore_stream", "_stream", "_connection"):
        stream = getattr(stream, attribute, None)
    if not isinstance(stream, httpcore.HTTP11Connection):
        return None
    state = getattr(stream, "_h11_state", None)
    if not isinstance(state, h11.Connection) or state.their_state is not h11.SEND_BODY:
        return None
    return state


def _body_done(state: h11.Connection, buffered: bytes) -> None:
    """Tells h11 that the chunked body it never read has ended, so httpcore reuses the connection.

    h11's receive buffer still holds the body's first bytes (`buffered`, copied out through
    `trailing_data`): it is replaced by an empty one (a private attribute: left alone unless it is
    h11 0.16's `ReceiveBuffer` holding just those bytes, then the connection is closed as after a
    Content-Length direct read), and a bare last-chunk is fed through the public API; h11 then
    reaches DONE, or MUST_CLOSE for a `Connection: close` response."""
    buffer = getattr(state, "_receive_buffer", None)
    if not isinstance(buffer, ReceiveBuffer) or len(buffer) != len(buffered) or state.their_state is not h11.SEND_BODY:
        return
    state._receive_buffer = ReceiveBuffer()
    try:
        state.receive_data(b"0\r\n\r\n")
        state.next_event()
    except h11.ProtocolError:
        return  # h11 is then in ERROR: httpcore closes the connection


def describe_transport_error(exc: httpx.TransportError) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def request_path(request: httpx.Request) -> str:
    return request.url.raw_path.decode("ascii", "replace")


def retry_after_seconds(value: str | None) -> float | None:
    """Retry-After in delta-seconds or as an HTTP date; None when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def sendable(value: str, what: str = "session id") -> str:
    """``value`` as a request may carry it (``inputs.sendable_id``: not empty, at most
    ``inputs.MAX_ID_BYTES``, UTF-8); ApiRequestError otherwise, never httpx's InvalidURL or a
    UnicodeEncodeError from deep inside a request."""
    try:
        return inputs.sendable_id(value, what)
    except ValueError as exc:
        raise ApiRequestError(str(exc)) from None


def sendable_path(path: str) -> str:
    """An artifact path as a request may carry it (``inputs.artifact_path``); ApiRequestError otherwise."""
    try:
        return inputs.artifact_path(path)
    except ValueError as exc:
        raise ApiRequestError(str(exc)) from None


def quote_segment(value: str) -> str:
    # Session ids are any string the caller chose: '/', '?', '#' and '%' must not change the path,
    # and a segment of only dots must not be removed as a dot segment by URL normalisation. An empty
    # segment would name another endpoint (`/session/` is the list).
    quoted = quote(sendable(value, "URL path segment"), safe="")
    return quoted.replace(".", "%2E") if set(value) == {"."} else quoted
