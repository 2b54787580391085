"""The fake service holds a fleet over real loopback sockets: a burst of connections, hundreds of follow streams."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Callable

import h11

from archiver.app.process import raise_file_limit
from archiver.fake import FakeClock, FakeService
from archiver.fake.logs import render_ndjson, render_text
from archiver.live.loop import files_for
from archiver.live.stream import Closed, FollowStream, Target, open_stream
from tests.fixtures_fake import TEST_TOKEN

FROZEN = 1_700_000_000.0
BURST = 1000
#: Follow streams in `make test`; benchmarks/mass_end.py runs 5,000.
STREAMS = 300


def _request(path: str) -> bytes:
    auth = f"Authorization: Bearer {TEST_TOKEN}"
    return f"GET {path} HTTP/1.1\r\nHost: fake\r\n{auth}\r\nConnection: close\r\n\r\n".encode()


def _read_status(sock: socket.socket) -> int:
    """The status of the one answer on ``sock`` (read to the end; the fake closes after it)."""
    conn = h11.Connection(h11.CLIENT)
    conn.send(h11.Request(method="GET", target="/", headers=[("Host", "fake")]))
    conn.send(h11.EndOfMessage())
    status = 0
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            conn.receive_data(sock.recv(65536))
        elif isinstance(event, h11.Response):
            status = event.status_code
        elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
            return status


def test_a_burst_of_a_thousand_connections_is_answered_with_no_reset(
    fake_service_factory: Callable[..., FakeService],
) -> None:
    """A thousand clients connect at once before any is served, then all ask: every one gets its
    200, none is reset or refused (the listen backlog holds them all)."""
    # Both ends of every connection are in this process: two descriptors each.
    assert raise_file_limit(files_for(BURST)) >= files_for(BURST), "the open-file limit leaves no room for the burst"
    svc = fake_service_factory(clock=FakeClock(FROZEN, time_scale=0))
    svc.add_session(TEST_TOKEN)
    host, port = svc.base_url.removeprefix("http://").rsplit(":", 1)
    socks: list[socket.socket] = []
    resets = 0
    statuses: list[int] = []
    try:
        for _ in range(BURST):
            # A connection not accepted within 10 s (SYNs dropped by a full backlog) fails the client.
            sock = socket.create_connection((host, int(port)), timeout=10)
            socks.append(sock)
        for sock in socks:
            sock.sendall(_request("/session"))
        for sock in socks:
            try:
                statuses.append(_read_status(sock))
            except ConnectionResetError:
                resets += 1
    finally:
        for sock in socks:
            sock.close()
    assert resets == 0
    assert statuses == [200] * BURST


class _Sink:
    def __init__(self, done: asyncio.Future[None], remaining: list[int]) -> None:
        self.data = bytearray()
        self.how: Closed | None = None
        self._done = done
        self._remaining = remaining

    def head(self, content_type: str) -> None:
        pass

    def body(self, data: bytes) -> None:
        self.data += data

    def closed(self, how: Closed, status: int | None, retry_after: float | None) -> None:
        self.how = how
        self._remaining[0] -= 1
        if self._remaining[0] == 0 and not self._done.done():
            self._done.set_result(None)


def test_hundreds_of_follow_streams_are_served_by_one_thread_and_each_ends_with_its_whole_log(
    fake_service_factory: Callable[..., FakeService],
) -> None:
    """Hundreds of concurrent follow streams (the product's own stream client) cost the fake no
    thread each; when every session ends at once, each stream ends properly with exactly its log."""
    svc = fake_service_factory(clock=FakeClock(FROZEN, time_scale=0))
    sids = [svc.add_session(TEST_TOKEN) for _ in range(STREAMS)]
    svc.advance(30)
    target = Target.from_url(svc.base_url)
    threads_before = threading.active_count()

    async def follow_all() -> tuple[list[_Sink], int]:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        remaining = [STREAMS]
        sinks = [_Sink(done, remaining) for _ in sids]
        for sid, sink in zip(sids, sinks, strict=True):
            await open_stream(target, FollowStream(target.request(sid, TEST_TOKEN), sink), tls=None, timeout=30)
        # Every stream has its first bytes before the sessions end (the hub holds them all).
        async with asyncio.timeout(30):
            while any(not sink.data for sink in sinks):
                await asyncio.sleep(0.05)
        threads_during = threading.active_count()
        for sid in sids:
            svc.end_session(TEST_TOKEN, sid)
        async with asyncio.timeout(60):
            await done
        return sinks, threads_during

    sinks, threads_during = asyncio.run(follow_all())
    assert threads_during - threads_before < 20, "a thread per stream"
    for sid, sink in zip(sids, sinks, strict=True):
        assert sink.how is Closed.ENDED
        assert bytes(sink.data) == render_ndjson(svc.log_lines(TEST_TOKEN, sid))


def test_a_keep_alive_connection_serves_its_next_request_after_a_follow_stream_ended(
    fake_service_factory: Callable[..., FakeService],
) -> None:
    """The hub hands a connection whose stream ended properly back to the server: the same socket
    answers the next request."""
    svc = fake_service_factory(clock=FakeClock(FROZEN, time_scale=0))
    sid = svc.add_session(TEST_TOKEN)
    host, port = svc.base_url.removeprefix("http://").rsplit(":", 1)
    conn = h11.Connection(h11.CLIENT)
    headers = [("Host", "fake"), ("Authorization", f"Bearer {TEST_TOKEN}")]
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        answers: list[tuple[int, bytes]] = []
        for target in (f"/logs?id={sid}&follow=true", f"/session/{sid}"):
            sock.sendall(conn.send(h11.Request(method="GET", target=target, headers=headers)) or b"")
            sock.sendall(conn.send(h11.EndOfMessage()) or b"")
            status, body = 0, bytearray()
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    conn.receive_data(sock.recv(65536))
                elif isinstance(event, h11.Response):
                    status = event.status_code
                    if target.startswith("/logs"):
                        svc.end_session(TEST_TOKEN, sid)
                elif isinstance(event, h11.Data):
                    body += event.data
                elif isinstance(event, h11.EndOfMessage):
                    break
            answers.append((status, bytes(body)))
            conn.start_next_cycle()
    assert answers[0] == (200, render_text(svc.log_lines(TEST_TOKEN, sid)))
    assert answers[1][0] == 200 and sid.encode() in answers[1][1]
