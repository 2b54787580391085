"""The fake's follow-stream hub: one thread and one selector serve every fault-free ``/logs?follow=true`` stream.

A follow stream lives for as long as its session runs, so a thread per stream does not hold a
fleet: 5,000 threads each waking every ``FOLLOW_POLL`` to take the state lock starve the accept
loop, and connections are reset. The request thread answers the headers and the log so far, then
hands the socket here; one tick every ``FOLLOW_POLL`` takes the state lock once for every stream,
and a stream whose session ended gets its last lines and the terminating chunk, after which the
connection goes back to the server for its next keep-alive request. The wire is the same as the
threaded path's (``routes._follow``), which still serves a stream a fault applies to.
"""

from __future__ import annotations

import contextlib
import logging
import selectors
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from archiver.fake.logs import LogLine
from archiver.fake.routes import FOLLOW_POLL, KEEPALIVE_AFTER, Context, FollowFrom

log = logging.getLogger(__name__)

#: Bytes a follower may have queued unsent before the hub stops reading its session for it (a
#: client that does not read gets its lines late, as from a real service, not all at once in RAM).
MAX_QUEUED = 1024 * 1024


@dataclass(eq=False)
class _Follower:
    sock: socket.socket
    address: Any
    source: FollowFrom
    keep_alive: bool
    last_out: float
    out: bytearray = field(default_factory=bytearray)
    done: bool = False


class FollowHub:
    """Serves handed-off follow streams until their session ends, the client leaves or the fake stops.

    ``resume(sock, address)`` is called (on the hub's thread) with a keep-alive connection whose
    stream ended properly, so the server reads its next request.
    """

    def __init__(self, context: Context, resume: Callable[[socket.socket, Any], None]) -> None:
        self._context = context
        self._resume = resume
        self._lock = threading.Lock()
        self._incoming: list[_Follower] = []
        self._followers: dict[socket.socket, _Follower] = {}
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        self._thread: threading.Thread | None = None
        self._closed = False

    def __len__(self) -> int:
        with self._lock:
            return len(self._followers) + len(self._incoming)

    def add(self, sock: socket.socket, address: Any, source: FollowFrom, *, keep_alive: bool) -> bool:
        """Take over ``sock`` (headers and the log so far already written); False once the hub closed."""
        with self._lock:
            if self._closed:
                return False
            self._incoming.append(_Follower(sock, address, source, keep_alive, time.monotonic()))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="fake-follow-hub", daemon=True)
                self._thread.start()
        self._wake()
        return True

    def close(self, timeout: float) -> None:
        """Stop: every open stream is cut (no terminating chunk, as on the threaded path)."""
        with self._lock:
            self._closed = True
            thread = self._thread
        self._wake()
        if thread is not None:
            thread.join(timeout)
        with self._lock:
            leftover = [f.sock for f in self._incoming]
            self._incoming.clear()
        for sock in leftover:
            _close(sock)
        self._selector.close()
        self._wake_r.close()
        self._wake_w.close()

    def _wake(self) -> None:
        with contextlib.suppress(OSError):  # full (a wake is pending anyway) or closed
            self._wake_w.send(b"x")

    # --- the loop (hub thread only) -------------------------------------------------------------

    def _run(self) -> None:
        stopping = self._context.stopping
        next_tick = time.monotonic()
        while True:
            with self._lock:
                closed = self._closed
                incoming, self._incoming = self._incoming, []
            if closed or stopping.is_set():
                break
            for f in incoming:
                self._register(f)
            now = time.monotonic()
            if now >= next_tick:
                try:
                    self._tick()
                except Exception:  # the loop edge: one bad tick must not end every stream
                    log.exception("fake follow hub tick failed")
                next_tick = now + FOLLOW_POLL
            for key, mask in self._selector.select(max(0.0, next_tick - time.monotonic())):
                if key.fileobj is self._wake_r:
                    with contextlib.suppress(OSError):
                        self._wake_r.recv(4096)
                    continue
                f = self._followers.get(key.fileobj)  # type: ignore[call-overload]
                if f is None:
                    continue
                if mask & selectors.EVENT_READ:
                    self._readable(f)
                if mask & selectors.EVENT_WRITE and f.sock in self._followers:
                    self._flush(f)
        for f in list(self._followers.values()):
            self._drop(f)

    def _register(self, f: _Follower) -> None:
        try:
            f.sock.setblocking(False)
            self._selector.register(f.sock, selectors.EVENT_READ)
        except (OSError, ValueError):
            _close(f.sock)
            return
        self._followers[f.sock] = f

    def _readable(self, f: _Follower) -> None:
        """The client spoke while its stream runs: a close (or reset) ends the stream."""
        try:
            data = f.sock.recv(65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._drop(f)

    def _tick(self) -> None:
        """One look at every stream's session under one hold of the state lock; send outside it."""
        state = self._context.state
        news: list[tuple[_Follower, list[LogLine] | None, bool]] = []
        with state.lock:
            now = state.refresh()
            for f in self._followers.values():
                if len(f.out) >= MAX_QUEUED:
                    continue
                src = f.source
                s = src.org.sessions.get(src.sid)
                if s is None:  # removed while following: nothing more will come
                    news.append((f, None, True))
                elif not s.active:
                    news.append((f, s.log(now), True))
                elif s.line_count(now) > src.sent:
                    news.append((f, s.log(now), False))
        keepalive = state.quirks.logs_keepalive
        clock = time.monotonic()
        for f, lines, done in news:
            src = f.source
            if lines is not None and len(lines) > src.sent:
                f.out += _chunk(src.render(lines[src.sent :]))
                src.sent = len(lines)
                f.last_out = clock
            if done:
                f.out += b"0\r\n\r\n"
                f.done = True
        if keepalive:
            for f in self._followers.values():
                if not f.done and clock - f.last_out >= KEEPALIVE_AFTER:
                    f.out += _chunk(b"\n")
                    f.last_out = clock
        for f in list(self._followers.values()):
            if f.out or f.done:
                self._flush(f)

    def _flush(self, f: _Follower) -> None:
        if f.out:
            try:
                sent = f.sock.send(f.out)
            except BlockingIOError:
                sent = 0
            except OSError:  # the client went away
                self._drop(f)
                return
            del f.out[:sent]
        if f.out:
            self._selector.modify(f.sock, selectors.EVENT_READ | selectors.EVENT_WRITE)
            return
        if not f.done:
            self._selector.modify(f.sock, selectors.EVENT_READ)
            return
        # The body ended properly: a keep-alive connection goes back for its next request.
        self._selector.unregister(f.sock)
        del self._followers[f.sock]
        if not f.keep_alive:
            _close(f.sock)
            return
        try:
            f.sock.setblocking(True)
            self._resume(f.sock, f.address)
        except Exception:  # the loop edge: a connection that cannot be resumed is closed
            log.exception("fake follow hub could not resume a connection")
            _close(f.sock)

    def _drop(self, f: _Follower) -> None:
        with contextlib.suppress(KeyError, ValueError, OSError):
            self._selector.unregister(f.sock)
        self._followers.pop(f.sock, None)
        _close(f.sock)


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()
