"""The daemon's own HTTP server: `/metrics` from the pre-rendered snapshot, `/healthz`, `/readyz` and `/`.

Nothing here calls the upstream or the store, and a scrape renders nothing but the small self-metrics
registry: the snapshot bytes (and their gzip members) were produced by the poller.
"""

from __future__ import annotations

import html
import logging
import socket
import socketserver
import ssl
import sys
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self
from urllib.parse import urlsplit

from archiver import __version__
from archiver.errors import ConfigError
from archiver.exporter.exposition import CONTENT_TYPE_OPENMETRICS, CONTENT_TYPE_TEXT, Snapshot, scrape_parts
from archiver.exporter.selfmetrics import SelfMetrics
from archiver.exporter.webconfig import BasicAuth, WebConfig

log = logging.getLogger("archiver.http")

#: Seconds a connection may stay silent (TLS handshake, request, keep-alive idle) before it is closed,
#: so a stuck or idle client cannot hold a thread forever.
CONNECTION_TIMEOUT = 30.0

_TEXT_PLAIN = "text/plain; charset=utf-8"


def _qvalue(params: list[str]) -> float:
    for param in params:
        name, _, value = param.partition("=")
        if name.strip().lower() == "q":
            try:
                return max(0.0, min(1.0, float(value.strip())))
            except ValueError:
                return 0.0
    return 1.0


def wants_openmetrics(accept: str | None) -> bool:
    """Whether the Accept header prefers OpenMetrics over the text format (q-values honoured).

    Prometheus 2 and 3 both rank `application/openmetrics-text` first; curl's `*/*` and an absent header
    get the classic text format. On a tie the more specific OpenMetrics wins.
    """
    if not accept:
        return False
    best_om = best_text = 0.0
    for item in accept.split(","):
        media, *params = item.split(";")
        media = media.strip().lower()
        if media == "application/openmetrics-text":
            best_om = max(best_om, _qvalue(params))
        elif media in ("text/plain", "text/*", "*/*"):
            best_text = max(best_text, _qvalue(params))
    return best_om > 0 and best_om >= best_text


def accepts_gzip(accept_encoding: str | None) -> bool:
    """Whether the Accept-Encoding header allows gzip (explicitly or through `*`) with q > 0."""
    if not accept_encoding:
        return False
    gzip_q: float | None = None
    star_q: float | None = None
    for item in accept_encoding.split(","):
        coding, *params = item.split(";")
        coding = coding.strip().lower()
        if coding in ("gzip", "x-gzip"):
            gzip_q = _qvalue(params)
        elif coding == "*":
            star_q = _qvalue(params)
    q = gzip_q if gzip_q is not None else star_q
    return q is not None and q > 0


_LANDING = """<!doctype html>
<html><head><meta charset="utf-8"><title>session-archiver</title></head>
<body><h1>session-archiver</h1><p>Version {version}</p>
<ul>
<li><a href="/metrics">/metrics</a>: Prometheus metrics (text 0.0.4 or OpenMetrics)</li>
<li><a href="/healthz">/healthz</a>: the daemon's loops are alive</li>
<li><a href="/readyz">/readyz</a>: first poll done, state recovered, snapshot fresh</li>
</ul></body></html>
"""


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


class _Handler(ReadOnlyHandler):
    """One connection; HTTP/1.1 keep-alive, every response with a Content-Length."""

    server_version = f"session-archiver/{__version__}"

    def _refuse_method(self) -> None:
        self._reply(405, b"Method Not Allowed\n", _TEXT_PLAIN, head=False, extra={"Allow": "GET, HEAD"})

    def _dispatch(self, *, head: bool) -> None:
        self._headers_sent = False  # per request: one handler serves every request of a connection
        app: MetricsServer = self.server.owner
        try:
            if app.auth is not None and not app.auth.check(self.headers.get("Authorization")):
                self._reply(
                    401,
                    b"Unauthorized\n",
                    _TEXT_PLAIN,
                    head=head,
                    extra={"WWW-Authenticate": 'Basic realm="session-archiver", charset="UTF-8"'},
                )
                return
            path = urlsplit(self.path).path
            if path == "/metrics":
                self._metrics(head)
            elif path == "/healthz":
                self._probe(app.health, head)
            elif path == "/readyz":
                self._probe(app.ready, head)
            elif path == "/":
                body = _LANDING.format(version=html.escape(__version__)).encode()
                self._reply(200, body, "text/html; charset=utf-8", head=head)
            else:
                self._reply(404, b"Not Found\n", _TEXT_PLAIN, head=head)
        except (ConnectionError, TimeoutError):
            self.close_connection = True  # the client went away mid-response
        except Exception:  # the request edge: one bad request must not kill the server
            app.self_metrics.error("http")
            log.exception("HTTP request %s failed", self.path)
            self.close_connection = True
            if not self._headers_sent:
                self._reply(500, b"Internal Server Error\n", _TEXT_PLAIN, head=head)

    _headers_sent = False

    def _metrics(self, head: bool) -> None:
        app: MetricsServer = self.server.owner
        openmetrics = wants_openmetrics(self.headers.get("Accept"))
        gzip = accepts_gzip(self.headers.get("Accept-Encoding"))
        tail = app.self_metrics.render(openmetrics)
        parts = scrape_parts(app.snapshot_source(), tail, openmetrics=openmetrics, gzip=gzip)
        extra = {"Vary": "Accept, Accept-Encoding"}
        if gzip:
            extra["Content-Encoding"] = "gzip"
        content_type = CONTENT_TYPE_OPENMETRICS if openmetrics else CONTENT_TYPE_TEXT
        self._reply(200, parts, content_type, head=head, extra=extra)

    def _probe(self, check: Callable[[], tuple[bool, str]], head: bool) -> None:
        ok, reason = check()
        text = reason or ("ok" if ok else "not ok")
        self._reply(200 if ok else 503, (text + "\n").encode("utf-8", "replace"), _TEXT_PLAIN, head=head)

    def _reply(
        self,
        status: int,
        body: bytes | tuple[bytes, ...],
        content_type: str,
        *,
        head: bool,
        extra: dict[str, str] | None = None,
    ) -> None:
        parts = (body,) if isinstance(body, bytes) else body
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(sum(len(p) for p in parts)))
        for name, value in (extra or {}).items():
            self.send_header(name, value)
        if status >= 500:
            self.send_header("Cache-Control", "no-store")
        if self.close_connection:
            # Say so: a keep-alive client would otherwise reuse the connection we are closing and
            # lose its next request in a race with our FIN.
            self.send_header("Connection", "close")
        self.end_headers()
        self._headers_sent = True
        if not head:
            for part in parts:
                if part:
                    self.wfile.write(part)


class MetricsServer(BackgroundHTTPServer):
    """The daemon's HTTP endpoints on `listen`, served by daemon threads.

    `snapshot_source` returns the latest snapshot (None before the first poll: `/metrics` then serves
    the self metrics alone); `health` and `ready` return `(ok, reason)` and must be cheap, they run
    on every probe. With a web config, TLS wraps the socket and basic auth guards every path (as the
    exporter-toolkit does).
    """

    def __init__(
        self,
        listen: tuple[str, int],
        *,
        snapshot_source: Callable[[], Snapshot | None],
        self_metrics: SelfMetrics,
        health: Callable[[], tuple[bool, str]],
        ready: Callable[[], tuple[bool, str]],
        web_config: WebConfig | None = None,
    ) -> None:
        self.snapshot_source = snapshot_source
        self.self_metrics = self_metrics
        self.health = health
        self.ready = ready
        super().__init__(listen, web_config)

    handler = _Handler

    def connection_failed(self) -> None:
        self.self_metrics.error("http")


def _format_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
