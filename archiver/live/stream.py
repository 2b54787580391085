"""One follow stream on asyncio: ``GET /logs?id=…&follow=true`` over its own HTTP/1.1 connection, framed by h11.

No task and no buffer per stream beyond h11's: the protocol object hands each piece of the body to
its sink as it arrives, so thousands of streams cost a few kilobytes each. The stream reports its
answer's status and content type, the body's pieces, and exactly one end: the body ended
properly, the connection broke (before or after the answer), the answer was not HTTP, or the
caller aborted it. The token is put into the request's header only, never into anything reported.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol
from urllib.parse import quote, urlsplit

import h11

from archiver import __version__
from archiver.errors import ConfigError
from archiver.upstream.transport import retry_after_seconds

#: Ask for NDJSON `{streamType, line}` entries; a service that only knows text sends text.
ACCEPT = "application/json, text/plain;q=0.5"
#: TCP keep-alive: a peer that vanished (no FIN, no RST) is noticed after about a minute without
#: replaying anything, where the stall timeout is long (an idle game server writes nothing).
_KEEPALIVE = (("TCP_KEEPIDLE", 30), ("TCP_KEEPINTVL", 10), ("TCP_KEEPCNT", 3))


class Closed(StrEnum):
    """How a stream ended."""

    ENDED = "ended"  # the body ended properly (a 200's or an error answer's)
    BROKEN = "broken"  # the connection closed or failed before the body ended
    NOT_HTTP = "not_http"  # the bytes received are not an HTTP/1.1 answer
    ABORTED = "aborted"  # the caller aborted it (stall, stop)


class StreamSink(Protocol):
    """Told about one stream: ``head`` once for a 200 answer, ``body`` for each piece of its body,
    ``closed`` exactly once at the end (with the answer's status, None before any answer)."""

    def head(self, content_type: str) -> None: ...
    def body(self, data: bytes) -> None: ...
    def closed(self, how: Closed, status: int | None, retry_after: float | None) -> None: ...


@dataclass(frozen=True, slots=True)
class Target:
    """Where follow streams connect: the API's base URL taken apart."""

    host: str
    port: int
    host_header: str
    path_prefix: str
    tls: bool

    @classmethod
    def from_url(cls, base_url: str) -> Target:
        parts = urlsplit(base_url.rstrip("/"))
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(f"follow streams need an http:// or https:// API URL, got {base_url!r}")
        tls = parts.scheme == "https"
        port = parts.port or (443 if tls else 80)
        default = port == (443 if tls else 80)
        host = parts.hostname
        shown = f"[{host}]" if ":" in host else host
        return cls(host, port, shown if default else f"{shown}:{port}", parts.path, tls)

    def request(self, session_id: str, token: str) -> h11.Request:
        """The follow request of one session, its bearer token in the header."""
        target = f"{self.path_prefix}/logs?id={quote(session_id, safe='')}&follow=true"
        return h11.Request(
            method="GET",
            target=target,
            headers=[
                ("Host", self.host_header),
                ("Authorization", f"Bearer {token}"),
                ("Accept", ACCEPT),
                ("User-Agent", f"session-archiver/{__version__}"),
            ],
        )


class FollowStream(asyncio.Protocol):
    """The protocol of one follow connection (see the module docstring)."""

    __slots__ = (
        "_clock", "_conn", "_done", "_request", "_retry_after", "_sink", "_status", "_transport", "answered",
        "last_byte", "opened",
    )  # fmt: skip

    def __init__(self, request: h11.Request, sink: StreamSink, clock: Callable[[], float] = time.monotonic) -> None:
        self._conn = h11.Connection(h11.CLIENT)
        self._request = request
        self._sink = sink
        self._transport: asyncio.Transport | None = None
        self._status: int | None = None
        self._retry_after: float | None = None
        self._done = False
        self._clock = clock
        #: When the stream was made (before its connection), and when the last byte arrived (the
        #: caller's first-byte and stall checks read them); ``answered``: any byte arrived at all.
        self.opened = self.last_byte = clock()
        self.answered = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            _keepalive(sock)
        conn = self._conn
        transport.write((conn.send(self._request) or b"") + (conn.send(h11.EndOfMessage()) or b""))

    def data_received(self, data: bytes) -> None:
        self.last_byte = self._clock()
        self.answered = True
        if self._done:
            return
        self._conn.receive_data(data)
        self._events()

    def eof_received(self) -> bool:
        if not self._done:
            self._conn.receive_data(b"")
            self._events()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._finish(Closed.BROKEN)

    def abort(self) -> None:
        """Close the connection now (stall, stop); the sink hears ``ABORTED``."""
        self._finish(Closed.ABORTED)

    def _events(self) -> None:
        conn = self._conn
        while not self._done:
            try:
                event = conn.next_event()
            except h11.RemoteProtocolError:
                # A body cut short ends here too ("peer closed connection without sending complete
                # message body"): broken once an answer came, not HTTP before one.
                self._finish(Closed.BROKEN if self._status is not None else Closed.NOT_HTTP)
                return
            kind = type(event)
            if kind is h11.Data:
                if self._status == 200:
                    self._sink.body(event.data)  # type: ignore[union-attr]
            elif event is h11.NEED_DATA:
                return
            elif kind is h11.Response:
                self._answer(event)  # type: ignore[arg-type]
            elif kind is h11.EndOfMessage:
                self._finish(Closed.ENDED)
            elif kind is h11.ConnectionClosed or event is h11.PAUSED:
                self._finish(Closed.BROKEN)

    def _answer(self, response: h11.Response) -> None:
        self._status = response.status_code
        content_type = ""
        for name, value in response.headers:
            if name == b"content-type":
                content_type = value.decode("latin-1")
            elif name == b"retry-after":
                self._retry_after = retry_after_seconds(value.decode("latin-1"))
        if self._status == 200:
            self._sink.head(content_type)
        else:
            self._finish(Closed.ENDED)  # an error answer: its body is not needed

    def _finish(self, how: Closed) -> None:
        if self._done:
            return
        self._done = True
        if self._transport is not None:
            if how is Closed.ENDED:
                self._transport.close()
            else:
                self._transport.abort()
        self._sink.closed(how, self._status, self._retry_after)


def _keepalive(sock: socket.socket) -> None:
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for name, value in _KEEPALIVE:
            option = getattr(socket, name, None)
            if option is not None:
                sock.setsockopt(socket.IPPROTO_TCP, option, value)
    except OSError:
        pass  # keep-alive is a refinement; the stall timeout still applies


async def open_stream(target: Target, stream: FollowStream, *, tls: ssl.SSLContext | None, timeout: float) -> None:
    """Connect ``stream`` and send its request; it then lives on the loop's callbacks alone.
    OSError or TimeoutError when no connection could be made (the stream's sink is not told:
    the caller aborts the stream, which tells it)."""
    loop = asyncio.get_running_loop()
    async with asyncio.timeout(timeout):
        await loop.create_connection(
            lambda: stream,
            target.host,
            target.port,
            ssl=tls if target.tls else None,
            server_hostname=target.host if target.tls else None,
        )
