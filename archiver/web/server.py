"""The HTTP server the /metrics endpoints and the evidence browser share: a background server on one
address (IPv4 or IPv6, TLS and basic auth from the web config) and a read-only GET/HEAD handler.
"""

from __future__ import annotations

import logging
import socket
import socketserver
import ssl
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self

from archiver.errors import ConfigError
from archiver.web.webconfig import BasicAuth, WebConfig

log = logging.getLogger("archiver.http")

#: Seconds a connection may stay silent (TLS handshake, request, keep-alive idle) before it is closed,
#: so a stuck or idle client cannot hold a thread forever.
CONNECTION_TIMEOUT = 30.0


class OwnedServer(ThreadingHTTPServer):
    """ThreadingHTTPServer carrying its owner (the object the handlers serve); handler threads are
    daemons so stop() never waits on an idle keep-alive connection."""

    daemon_threads = True
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], owner: Any, handler: type[BaseHTTPRequestHandler]) -> None:
        self.owner = owner
        super().__init__(address, handler)

    def server_bind(self) -> None:
        # HTTPServer.server_bind resolves the host's FQDN (a DNS lookup that can stall start-up); the
        # name is never used here.
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name = str(host)
        self.server_port = int(port)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # Called for exceptions escaping a handler, e.g. a failed TLS handshake in setup(): the
        # default prints a traceback to stderr. Client-side failures are routine, not errors.
        exc = sys.exc_info()[1]
        if isinstance(exc, ssl.SSLError | ConnectionError | TimeoutError):
            log.debug("connection from %s failed: %s", client_address[0], exc)
            return
        self.owner.connection_failed()
        log.error("HTTP connection from %s failed", client_address[0], exc_info=exc)


class OwnedServer6(OwnedServer):
    address_family = socket.AF_INET6


class BackgroundHTTPServer:
    """A server on `listen` (IPv4 or IPv6; TLS when the web config has it) run by a daemon thread:
    the lifecycle the /metrics server and the evidence browser share. Subclasses set `handler`."""

    handler: type[BaseHTTPRequestHandler]
    thread_name = "http-server"

    def __init__(self, listen: tuple[str, int], web_config: WebConfig | None) -> None:
        self.auth = BasicAuth(web_config.basic_auth_users) if web_config and web_config.basic_auth_users else None
        context = web_config.ssl_context() if web_config is not None else None
        host, port = listen
        server_class = OwnedServer6 if ":" in host else OwnedServer
        try:
            self._httpd = server_class((host, port), self, self.handler)
        except OSError as exc:
            raise ConfigError(f"cannot listen on {_format_host(host)}:{port}: {exc.strerror or exc}") from None
        if context is not None:
            self._httpd.socket = context.wrap_socket(
                self._httpd.socket, server_side=True, do_handshake_on_connect=False
            )
        self._scheme = "https" if context is not None else "http"
        self._thread: threading.Thread | None = None

    def connection_failed(self) -> None:
        """A handler raised something that is not a client's routine failure (count it, if anywhere)."""

    @property
    def address(self) -> tuple[str, int]:
        """The bound address (the real port when `listen` asked for port 0)."""
        host, port = self._httpd.server_address[:2]
        return str(host), int(port)

    @property
    def url(self) -> str:
        """Base URL to reach the server locally, e.g. `http://127.0.0.1:9108`."""
        host, port = self.address
        if host in ("", "0.0.0.0"):
            host = "127.0.0.1"
        elif host == "::":
            host = "::1"
        return f"{self._scheme}://{_format_host(host)}:{port}"

    def start(self) -> None:
        """Serve on a background thread (returns at once)."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.2}, name=self.thread_name, daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop accepting, wait for the accept loop to end and close the socket; idempotent."""
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join()
            self._thread = None
        self._httpd.server_close()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


class ReadOnlyHandler(BaseHTTPRequestHandler):
    """What the /metrics and browser handlers share: HTTP/1.1 keep-alive, the TLS handshake on the
    connection's own thread, GET/HEAD to `_dispatch`, every other method refused with 405."""

    server: OwnedServer
    protocol_version = "HTTP/1.1"
    sys_version = ""  # do not advertise the Python version
    timeout = CONNECTION_TIMEOUT
    # A body is written as a few large sendall() calls after the headers; with Nagle on, the last
    # small write can wait for a delayed ACK (~40 ms) on loopback.
    disable_nagle_algorithm = True

    def setup(self) -> None:
        if isinstance(self.request, ssl.SSLSocket):
            # The listening socket does not handshake in accept() (that would let one slow client
            # block every other one); each connection handshakes here, on its own thread.
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
        # The request may carry a body we do not read: close rather than misparse the next request.
        self.close_connection = True
        self._refuse_method()

    do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _not_allowed

    def _dispatch(self, *, head: bool) -> None:
        raise NotImplementedError

    def _refuse_method(self) -> None:
        """Answer 405 with `Allow: GET, HEAD`."""
        raise NotImplementedError


def _format_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
