"""Serving the browser's pages over HTTP(S): the daemon's web config (TLS, bcrypt basic auth) guards every path.

Each connection runs on its own daemon thread (ThreadingHTTPServer); a response body is written chunk
by chunk as the app yields it, so a 100 MB download never sits in memory.
"""

from __future__ import annotations

import logging
import socket
import socketserver
import ssl
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from archiver import __version__
from archiver.browse.app import BrowseApp, Response
from archiver.errors import ConfigError
from archiver.exporter.httpserver import CONNECTION_TIMEOUT
from archiver.exporter.webconfig import BasicAuth, WebConfig

log = logging.getLogger("archiver.browse")


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 64

    def __init__(self, address: tuple[str, int], owner: BrowseServer) -> None:
        self.owner = owner
        super().__init__(address, _Handler)

    def server_bind(self) -> None:
        # Skip HTTPServer's FQDN lookup (a DNS query that can stall start-up); the name is unused.
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name = str(host)
        self.server_port = int(port)

    def handle_error(self, request: Any, client_address: Any) -> None:
        exc = sys.exc_info()[1]
        if isinstance(exc, ssl.SSLError | ConnectionError | TimeoutError):
            log.debug("connection from %s failed: %s", client_address[0], exc)
            return
        log.error("HTTP connection from %s failed", client_address[0], exc_info=exc)


class _Server6(_Server):
    address_family = socket.AF_INET6


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"
    server_version = f"session-archiver-browse/{__version__}"
    sys_version = ""
    timeout = CONNECTION_TIMEOUT
    disable_nagle_algorithm = True

    def setup(self) -> None:
        if isinstance(self.request, ssl.SSLSocket):
            # Handshake here, on the connection's own thread, never in accept().
            self.request.settimeout(self.timeout)
            self.request.do_handshake()
        super().setup()

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)

    def do_GET(self) -> None:
        self._dispatch(head=False)

    def do_HEAD(self) -> None:
        self._dispatch(head=True)

    def _not_allowed(self) -> None:
        # Read-only: anything but GET/HEAD is refused, and its unread body ends the connection.
        self.close_connection = True
        self._send(Response(405, "text/plain; charset=utf-8", (b"Method Not Allowed\n",), 19, {"Allow": "GET, HEAD"}))

    do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _not_allowed

    def _dispatch(self, *, head: bool) -> None:
        owner = self.server.owner
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
            self._send(owner.app.handle(self.path), head=head)
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
        if response.length is not None:
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


class BrowseServer:
    """The browser app on ``listen``, served by daemon threads; TLS and basic auth from the web config."""

    def __init__(self, listen: tuple[str, int], app: BrowseApp, *, web_config: WebConfig | None = None) -> None:
        self.app = app
        self.auth = BasicAuth(web_config.basic_auth_users) if web_config and web_config.basic_auth_users else None
        context = web_config.ssl_context() if web_config is not None else None
        host, port = listen
        server_class = _Server6 if ":" in host else _Server
        try:
            self._httpd = server_class((host, port), self)
        except OSError as exc:
            raise ConfigError(f"cannot listen on {_format_host(host)}:{port}: {exc.strerror or exc}") from None
        if context is not None:
            self._httpd.socket = context.wrap_socket(
                self._httpd.socket, server_side=True, do_handshake_on_connect=False
            )
        self._scheme = "https" if context is not None else "http"
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """Base URL to reach the server locally, e.g. ``http://127.0.0.1:9110``."""
        host, port = self._httpd.server_address[:2]
        host = str(host)
        if host in ("", "0.0.0.0"):
            host = "127.0.0.1"
        elif host == "::":
            host = "::1"
        return f"{self._scheme}://{_format_host(host)}:{int(port)}"

    def start(self) -> None:
        """Serve on a background thread (returns at once)."""
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._httpd.serve_forever, kwargs={"poll_interval": 0.2}, name="browse-server", daemon=True
            )
            self._thread.start()

    def stop(self) -> None:
        """Stop accepting, wait for the accept loop and close the socket; idempotent."""
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join()
            self._thread = None
        self._httpd.server_close()

    def __enter__(self) -> BrowseServer:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def _format_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
