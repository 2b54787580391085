"""HTTP transport of the fake service: threaded HTTP/1.1 server, auth, fault injection, chunked responses.

Follow streams without a fault are handed to the one-thread `FollowHub` once their headers are out,
so a fleet of them costs a socket each, not a thread each."""

from __future__ import annotations

import contextlib
import logging
import math
import socket
import ssl
import struct
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from archiver.fake import control, endpoints, routes
from archiver.fake.errors import HttpProblem
from archiver.fake.faults import FaultSpec
from archiver.fake.followhub import FollowHub
from archiver.fake.oracle import Tally, counted
from archiver.fake.routes import Context, FollowFrom, Request, Response
from archiver.fake.wire import ERROR_CODES, REASONS, dumps, error_body, html_gateway_page

log = logging.getLogger(__name__)

#: Largest request body accepted; the interface's bodies are a few KB.
MAX_BODY = 1024 * 1024
#: Bytes per piece of a "drip" fault.
DRIP_PIECE = 8
_WRONG_TYPES = dumps({"sessions": "not-a-list", "id": 42, "count": "many", "players": {}, "exists": "maybe"})


class FakeHTTPServer(ThreadingHTTPServer):
    """ThreadingHTTPServer that knows its open connections and handler threads, so ``stop`` can
    end idle keep-alive connections and long streams instead of leaving threads behind."""

    daemon_threads = True
    #: The listen backlog: a burst of a thousand connections (a fleet of followers reopening at
    #: once) waits to be accepted instead of being reset, as with the standard library's 5.
    request_queue_size = 4096

    def __init__(self, address: tuple[str, int], context: Context, tls: ssl.SSLContext | None = None) -> None:
        self.context = context
        #: Serve HTTPS with this context (`archiver fake-service --web.config.file`); None: plain HTTP.
        self.tls = tls
        self._lock = threading.Lock()
        self._connections: set[socket.socket] = set()
        self._handler_threads: set[threading.Thread] = set()
        self._to_reset: set[socket.socket] = set()
        #: Connections whose follow stream goes to the hub once their handler finished.
        self._handoffs: dict[socket.socket, tuple[FollowFrom, bool]] = {}
        self.hub = FollowHub(context, self.process_request)
        if ":" in address[0]:  # an IPv6 literal such as ::1
            self.address_family = socket.AF_INET6
        super().__init__(address, _Handler)

    def get_request(self) -> tuple[socket.socket, Any]:
        request, client_address = super().get_request()
        if self.tls is not None:
            # The handshake runs at the connection's first read, on its own thread, never in the accept loop.
            request = self.tls.wrap_socket(request, server_side=True, do_handshake_on_connect=False)
        return request, client_address

    def process_request(self, request: Any, client_address: Any) -> None:
        thread = threading.Thread(target=self._serve_one, args=(request, client_address), name="fake-http", daemon=True)
        with self._lock:
            self._connections.add(request)
            self._handler_threads.add(thread)
        thread.start()

    def _serve_one(self, request: socket.socket, client_address: Any) -> None:
        try:
            self.process_request_thread(request, client_address)
        finally:
            with self._lock:
                self._connections.discard(request)
                self._handler_threads.discard(threading.current_thread())
                handoff = self._handoffs.pop(request, None)
            if handoff is not None and not self.hub.add(request, client_address, handoff[0], keep_alive=handoff[1]):
                with contextlib.suppress(OSError):
                    request.close()  # the fake is stopping: the stream is cut, as on the threaded path

    def hand_off(self, sock: socket.socket, follow: FollowFrom, *, keep_alive: bool) -> None:
        """Give ``sock``'s follow stream to the hub once its handler returns (instead of closing it)."""
        with self._lock:
            self._handoffs[sock] = (follow, keep_alive)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away mid-request (a killed daemon, a reset) is what the fake is
        there to survive, not an error to print with a traceback; anything else still is."""
        if isinstance(sys.exc_info()[1], ConnectionError | TimeoutError | ssl.SSLError):  # a failed handshake too
            return
        super().handle_error(request, client_address)

    def mark_reset(self, sock: socket.socket) -> None:
        """Close this connection with an RST (no FIN, no response) when the handler finishes."""
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        with self._lock:
            self._to_reset.add(sock)

    def shutdown_request(self, request: Any) -> None:
        with self._lock:
            if request in self._handoffs:
                return  # its stream goes on, on the hub
            reset = request in self._to_reset
            self._to_reset.discard(request)
        if reset:
            request.close()  # with SO_LINGER 0: the peer gets ECONNRESET
        else:
            super().shutdown_request(request)

    def close_all(self, timeout: float) -> None:
        """Shut down every open connection and wait for the handler threads."""
        self.hub.close(timeout)
        with self._lock:
            conns, threads = list(self._connections), list(self._handler_threads)
        for conn in conns:
            with contextlib.suppress(OSError):  # already closed by its handler
                conn.shutdown(socket.SHUT_RDWR)
        for thread in threads:
            thread.join(timeout)


def _subject(route: endpoints.Route, query: str) -> tuple[str | None, bool]:
    """The session a request names (for per-session faults) and whether it asks for a follow stream."""
    args = parse_qs(query, keep_blank_values=True)
    names = ("id", "matchKey", "session") if route.key != endpoints.QUERY_LOG else ("matchKey", "id")
    session = route.params.get("id") or next((args[n][0] for n in names if args.get(n)), None)
    follow = route.key == endpoints.LOGS and (args.get("follow") or [""])[0].strip().lower() in ("true", "1", "yes")
    return session, follow


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: FakeHTTPServer
    server_version = "fake-session-host"
    # Headers and body go out in separate writes; with Nagle on, delayed ACKs add ~40 ms to
    # every keep-alive response.
    disable_nagle_algorithm = True
    sys_version = ""

    def do_GET(self) -> None:
        self._dispatch()

    do_POST = do_PUT = do_DELETE = do_PATCH = do_GET

    def log_message(self, format: str, *args: Any) -> None:
        # Request lines only (no headers: the token travels in one), at debug level.
        log.debug("%s " + format, self.address_string(), *args)

    # --- request --------------------------------------------------------------------------------

    def _read_body(self) -> bytes | None:
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            return self._read_chunked()
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            return None
        if length < 0 or length > MAX_BODY:
            return None
        return self.rfile.read(length)

    def _read_chunked(self) -> bytes | None:
        parts: list[bytes] = []
        total = 0
        while True:
            line = self.rfile.readline(1024)
            try:
                size = int(line.split(b";")[0].strip(), 16)
            except ValueError:
                return None
            if size == 0:
                while self.rfile.readline(1024) not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                return b"".join(parts)
            total += size
            if total > MAX_BODY:
                return None
            parts.append(self.rfile.read(size))
            self.rfile.readline(1024)

    def _dispatch(self) -> None:
        ctx = self.server.context
        state = ctx.state
        body = self._read_body()
        url = urlsplit(self.path)
        path = url.path or "/"
        if body is None:
            self.close_connection = True
            self._send(
                self._problem_response(HttpProblem(413, "PAYLOAD_TOO_LARGE", "Unreadable or too large body."), path)
            )
            return
        route = endpoints.match(self.command, path)
        state.count_request(route.key)
        fault = None
        if route.key in endpoints.SPEC_ENDPOINTS:
            session, follow = _subject(route, url.query)
            fault = state.faults.draw(route.key, session=session, follow=follow)
        if fault is not None and self._inject(fault, path):
            return
        try:
            response = self._handle(route, path, url.query, body)
        except HttpProblem as problem:
            response = self._problem_response(problem, path)
        except Exception:  # the request edge: a bug answers 500 instead of killing the connection thread
            log.exception("fake service failed on %s %s", self.command, route.key)
            response = self._problem_response(HttpProblem(500, "INTERNAL_SERVER_ERROR", "Internal error."), path)
        if response.follow is not None and fault is None:
            self._start_follow(response, response.follow)
            return
        self._send(response, fault)

    def _start_follow(self, response: Response, follow: FollowFrom) -> None:
        """Send a follow stream's headers and the log so far; the hub serves the rest."""
        try:
            self._send_head(response)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            if follow.first:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(follow.first), follow.first))
        except OSError:  # the client went away: nothing left to tell it
            self.close_connection = True
            return
        keep_alive = not self.close_connection
        self.close_connection = True  # this thread is done with the connection; the hub has it
        self.server.hand_off(self.connection, follow, keep_alive=keep_alive)

    def _handle(self, route: endpoints.Route, path: str, query: str, body: bytes) -> Response:
        ctx = self.server.context
        auth = self.headers.get("Authorization") or ""
        scheme, _, token = auth.partition(" ")
        org = ctx.state.org_for(token.strip()) if scheme.lower() == "bearer" else None
        if org is None:
            raise HttpProblem(
                401, "UNAUTHORIZED", "You are not authorized. Make sure your bearer token is correct.",
                "The bearer token is missing, malformed, expired or not valid for this environment.",
            )  # fmt: skip
        handler = routes.HANDLERS.get(route.key) or control.HANDLERS.get(route.key)
        if handler is None:
            raise HttpProblem(404, "RESOURCE_NOT_FOUND", f"No endpoint {self.command} {path}.")
        request = Request(
            method=self.command, path=path, query=parse_qs(query, keep_blank_values=True),
            headers=self.headers, body=body, org=org, params=route.params,
        )  # fmt: skip
        return handler(ctx, request)

    def _problem_response(self, problem: HttpProblem, path: str) -> Response:
        now = self.server.context.state.clock.now()
        body = error_body(problem.status, problem.code, problem.message, problem.details, path, now, problem.violations)
        return Response(problem.status, body)

    # --- faults ---------------------------------------------------------------------------------

    def _inject(self, fault: FaultSpec, path: str) -> bool:
        """Apply a fired fault; True when it replaced the response entirely."""
        if fault.latency and self.server.context.stopping.wait(fault.latency):
            self.close_connection = True
            return True
        if fault.kind == "reset":
            self.close_connection = True
            self.server.mark_reset(self.connection)
            return True
        if fault.kind == "garbage":
            self._send(Response(200, b"<<garbage>> this is not JSON {", content_type="application/json"))
            return True
        if fault.kind == "wrong_types":
            self._send(Response(200, _WRONG_TYPES))
            return True
        if fault.kind == "html" and fault.status is not None:
            self._send(Response(fault.status, html_gateway_page(fault.status), content_type="text/html"))
            return True
        if fault.kind != "status" or fault.status is None:
            return False  # latency only, or a transport fault applied while sending
        headers: list[tuple[str, str]] = []
        retry_after = fault.retry_after if fault.retry_after is not None else (1.0 if fault.status == 429 else None)
        if retry_after is not None:
            headers.append(("Retry-After", str(math.ceil(retry_after))))
        if fault.status in (502, 504):
            self._send(
                Response(fault.status, html_gateway_page(fault.status), content_type="text/html", headers=headers)
            )
            return True
        code = ERROR_CODES.get(fault.status, "ERROR")
        problem = HttpProblem(fault.status, code, "Injected failure.", "A fault switch of the fake service answered.")
        response = self._problem_response(problem, path)
        response.headers.extend(headers)
        self._send(response)
        return True

    # --- response -------------------------------------------------------------------------------

    def _send_head(self, response: Response) -> None:
        """The status line, the content type and the response's own headers (not yet ended)."""
        self.send_response(response.status, REASONS.get(response.status))
        if response.content_type:
            self.send_header("Content-Type", response.content_type)
        for name, value in response.headers:
            self.send_header(name, value)

    def _send(self, response: Response, fault: FaultSpec | None = None) -> None:
        mode = fault.kind if fault is not None and fault.kind in ("truncate", "drip", "cut") else None
        body = response.body
        # A 200 log or artifact body goes into the oracle: what was produced, and whether all of it went out.
        served_as = response.served_as if response.status == 200 else None
        tally = Tally()
        complete = False
        try:
            self._send_head(response)
            if isinstance(body, bytes):
                tally.add(body)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                complete = self._write_fixed(body, mode, fault)
            else:
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                complete = self._write_chunked(counted(body, tally) if served_as else body, mode, fault)
        except (BrokenPipeError, ConnectionResetError, TimeoutError, OSError):
            self.close_connection = True  # the client went away: nothing left to tell it
            complete = False
        finally:
            close = getattr(body, "close", None)
            if close is not None:
                close()
            if served_as is not None:
                self.server.context.state.oracle.body_served(served_as, tally.sha256, tally.size, complete=complete)

    def _write_fixed(self, body: bytes, mode: str | None, fault: FaultSpec | None) -> bool:
        """Write a Content-Length body; True when all of it was written."""
        if mode in ("truncate", "cut"):
            # Content-Length promised the whole body; part of it arrives, then the connection ends.
            cut_at = len(body) // 2 if fault is None or fault.after is None else fault.after
            if cut_at >= len(body) and mode == "cut":
                self.wfile.write(body)
                return True
            self.wfile.write(body[:cut_at])
            self.close_connection = True
            return False
        if mode == "drip" and fault is not None:
            return self._drip(body, fault)
        self.wfile.write(body)
        return True

    def _write_chunked(self, chunks: Iterator[bytes], mode: str | None, fault: FaultSpec | None) -> bool:
        """Write a chunked body; True when all of it and the terminating chunk were written."""
        stopping = self.server.context.stopping
        sent = 0
        for chunk in chunks:
            if not chunk:
                continue
            if stopping.is_set():
                self.close_connection = True
                return False
            if mode in ("truncate", "cut"):
                # The chunk that crosses the cut point (without `after`: the first, at its half) is
                # announced whole, sent in part (possibly mid-line), and the connection closed: the
                # body never ends.
                after = None if fault is None else fault.after
                cut_at = len(chunk) // 2 if after is None else after - sent
                if cut_at < len(chunk):
                    self.wfile.write(b"%x\r\n" % len(chunk) + chunk[: max(0, cut_at)])
                    self.close_connection = True
                    return False
                sent += len(chunk)
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                continue
            if mode == "drip" and fault is not None:
                for i in range(0, len(chunk), DRIP_PIECE):
                    if stopping.wait(fault.interval):
                        self.close_connection = True
                        return False
                    piece = chunk[i : i + DRIP_PIECE]
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                continue
            self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        if stopping.is_set():
            # A stream cut short by shutdown must not look complete: no terminating chunk.
            self.close_connection = True
            return False
        self.wfile.write(b"0\r\n\r\n")
        return True

    def _drip(self, body: bytes, fault: FaultSpec) -> bool:
        stopping = self.server.context.stopping
        # Headers went out at once; every piece of the body waits ``interval`` first.
        for i in range(0, len(body), DRIP_PIECE):
            if stopping.wait(fault.interval):
                self.close_connection = True
                return False
            self.wfile.write(body[i : i + DRIP_PIECE])
        return True
