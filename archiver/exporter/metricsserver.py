"""The daemon's own HTTP endpoints: `/metrics` from the pre-rendered snapshot, `/healthz`, `/readyz` and `/`.

Nothing here calls the upstream or the store, and a scrape renders nothing but the small self-metrics
registry: the snapshot bytes (and their gzip members) were produced by the poller. The server itself
(threads, TLS, basic auth) is the web room's (`archiver/web/server.py`).
"""

from __future__ import annotations

import html
import logging
from collections.abc import Callable
from urllib.parse import urlsplit

from archiver import __version__
from archiver.exporter.snapshot import CONTENT_TYPE_OPENMETRICS, CONTENT_TYPE_TEXT, Snapshot, scrape_parts
from archiver.metrics.selfmetrics import SelfMetrics
from archiver.web.server import BackgroundHTTPServer, ReadOnlyHandler
from archiver.web.webconfig import WebConfig

log = logging.getLogger("archiver.http")

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
