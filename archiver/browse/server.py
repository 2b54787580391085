"""Serving the browser's pages over HTTP(S): the daemon's web config (TLS, bcrypt basic auth) guards every path.

Each connection runs on its own daemon thread (ThreadingHTTPServer); a response body is written chunk
by chunk as the app yields it, so a 100 MB download never sits in memory; a streamed body (a log
search) stops at the first chunk after its client hung up.
"""

from __future__ import annotations

import logging
import select
import socket
import ssl

from archiver import __version__
from archiver.browse.app import BrowseApp
from archiver.browse.responses import Response
from archiver.web.server import BackgroundHTTPServer, ReadOnlyHandler
from archiver.web.webconfig import WebConfig

log = logging.getLogger("archiver.browse")


class _Handler(ReadOnlyHandler):
    server_version = f"session-archiver-browse/{__version__}"

    def _refuse_method(self) -> None:
        # Read-only: anything but GET/HEAD is refused.
        self._send(Response(405, "text/plain; charset=utf-8", (b"Method Not Allowed\n",), 19, {"Allow": "GET, HEAD"}))

    def _dispatch(self, *, head: bool) -> None:
        owner: BrowseServer = self.server.owner
        self._started = False
        try:
            if owner.auth is not None and not owner.auth.check(self.headers.get("Authorization")):
                body = b"Unauthorized\n"
                self._send(
                    Response(
                        401,
                        "text/plain; charset=utf-8",
                        (body,),
                        len(body),
                        {"WWW-Authenticate": 'Basic realm="session-archiver", charset="UTF-8"'},
                    ),
                    head=head,
                )
                return
            headers = {name.lower(): value for name, value in self.headers.items()}
            self._send(owner.app.handle(self.path, headers), head=head)
        except (ConnectionError, TimeoutError):
            self.close_connection = True  # the client went away mid-response
        except Exception:  # the request edge: one bad request must not take the server down
            log.exception("browse request %s failed", self.path)
            self.close_connection = True
            if not self._started:
                body = b"Internal Server Error\n"
                self._send(Response(500, "text/plain; charset=utf-8", (body,), len(body)), head=head)

    _started = False

    def _send(self, response: Response, *, head: bool = False) -> None:
        self.send_response(response.status)
        self.send_header("Content-Type", response.content_type)
        if response.status == 304:
            pass  # no body, and no Content-Length (it would have to be the whole object's)
        elif response.length is not None:
            self.send_header("Content-Length", str(response.length))
        else:
            self.close_connection = True  # the end of the body is the end of the connection
        for name, value in response.headers.items():
            self.send_header(name, value)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self._started = True
        body = iter(response.body)
        try:
            if head:
                return
            sent = 0
            for chunk in body:
                if chunk:
                    if response.length is None and self._peer_gone():
                        # A streamed page (a search) whose reader hung up: the first write would still
                        # succeed; stop now, and closing the body stops what produces it.
                        raise ConnectionResetError("the client closed the connection")
                    self.wfile.write(chunk)
                    sent += len(chunk)
            if response.length is not None and sent != response.length:
                # The object changed under us: the client must see a broken transfer, not a short file.
                log.error("%s: sent %d of %d bytes; closing", self.path, sent, response.length)
                self.close_connection = True
        finally:
            close = getattr(body, "close", None)
            if close is not None:
                close()  # releases the store's open file or HTTP stream when the client left early

    def _peer_gone(self) -> bool:
        """Whether the client closed its end (EOF waiting on the socket); False where that cannot be told (TLS)."""
        sock = self.connection
        if isinstance(sock, ssl.SSLSocket):
            return False  # no peeking under TLS: the failed write tells instead, a heartbeat later
        try:
            readable, _, _ = select.select([sock], [], [], 0)
            return bool(readable) and sock.recv(1, socket.MSG_PEEK) == b""
        except (OSError, ValueError):
            return True


class BrowseServer(BackgroundHTTPServer):
    """The browser app on ``listen``, served by daemon threads; TLS and basic auth from the web config."""

    handler = _Handler
    thread_name = "browse-server"

    def __init__(self, listen: tuple[str, int], app: BrowseApp, *, web_config: WebConfig | None = None) -> None:
        self.app = app
        super().__init__(listen, web_config)
