"""The wire-level pieces of the session hosting API client: bearer auth (the token never in a repr),
streamed bodies, and the helpers that read headers."""

from __future__ import annotations

import email.utils
import time
from collections.abc import Generator, Iterator
from types import TracebackType
from typing import Protocol
from urllib.parse import quote

import httpcore
import httpx

from archiver.config import inputs
from archiver.config.credentials import Token
from archiver.errors import ApiRequestError, ApiTransportError


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
        """`iter_bytes` of a large plain HTTP/1.1 body with a Content-Length, with a third of its CPU:
        past the first chunk, the body is read from the connection itself rather than through
        httpx's HTTP/1.1 parser, which copies every byte four more times (h11's buffer, two slices,
        `bytes()`; the large session list, ARCHITECTURE.md §11 "Direct read of large list bodies").

        Only public APIs: h11 hands over everything it has buffered after the headers in its first
        data event, so after the first chunk the rest of the body is still in the socket: exactly
        `Content-Length` bytes (at least `DIRECT_MIN_BYTES`) are read from httpcore's
        `network_stream` (its documented response extension; TLS included). The connection is not
        reused afterwards (h11 still waits for the body, so httpcore closes it on `close`): one new
        connection per large body. Anything else (a small body, no length, chunked framing, a
        content encoding, HTTP/2, a transport without a network stream such as a test's mock)
        takes `iter_bytes`."""
        response = self._response
        stream = response.extensions.get("network_stream")
        length = self.content_length
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
        request = response.request
        try:
            while left > 0:
                chunk = stream.read(min(left, _DIRECT_READ), self._read_timeout())
                if not chunk:
                    raise httpcore.ReadError("the server closed the connection")
                left -= len(chunk)
                yield chunk
        except (httpcore.TimeoutException, httpcore.NetworkError, httpcore.ProtocolError) as exc:
            # As `iter_bytes` raises a broken body.
            raise ApiTransportError(
                f"{request.method} {request_path(request)} broke mid-body: {type(exc).__name__}: {exc}",
                method=request.method,
                path=request_path(request),
            ) from None
        finally:
            del parsed

    def _read_timeout(self) -> float | None:
        timeout: float | None = self._response.request.extensions.get("timeout", {}).get("read")
        return timeout

    def _identity(self) -> bool:
        encoding: str = self._response.headers.get("content-encoding", "identity")
        return encoding.strip().lower() == "identity"

    def close(self) -> None:
        self._response.close()

    def __enter__(self) -> Download:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


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
    """An artifact path as a request may carry it (``inputs.sendable_path``); ApiRequestError otherwise."""
    try:
        return inputs.sendable_path(path)
    except ValueError as exc:
        raise ApiRequestError(str(exc)) from None


def quote_segment(value: str) -> str:
    # Session ids are any string the caller chose: '/', '?', '#' and '%' must not change the path,
    # and a segment of only dots must not be removed as a dot segment by URL normalisation. An empty
    # segment would name another endpoint (`/session/` is the list).
    quoted = quote(sendable(value, "URL path segment"), safe="")
    return quoted.replace(".", "%2E") if set(value) == {"."} else quoted
