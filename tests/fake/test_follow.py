"""The fake service's live-log switches over real loopback sockets: logs gone at termination, follow streams cut."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest

from archiver.fake import FakeClock, FakeConfigError, FakeService, FaultSpec, parse_fault_spec
from archiver.fake.logs import render_ndjson, render_text
from tests.fixtures_fake import TEST_TOKEN

FROZEN = 1_700_000_000.0


def _client(svc: FakeService) -> httpx.Client:
    return httpx.Client(
        base_url=svc.base_url, headers={"Authorization": f"Bearer {TEST_TOKEN}"}, timeout=httpx.Timeout(10.0)
    )


def _read_until_broken(client: httpx.Client, sid: str, *, accept: str = "application/json") -> tuple[bytes, bool]:
    """The body bytes a follow stream delivered, and whether it ended properly (False: cut)."""
    received = bytearray()
    params = {"id": sid, "follow": "true"}
    with client.stream("GET", "/logs", params=params, headers={"Accept": accept}) as response:
        assert response.status_code == 200
        try:
            for chunk in response.iter_raw():
                received += chunk
        except httpx.RemoteProtocolError:
            return bytes(received), False
    return bytes(received), True


def test_logs_gone_quirk_answers_the_api_404_once_terminated_on_both_log_endpoints(
    fake_service_factory: Callable[..., FakeService],
) -> None:
    """While the session runs both endpoints answer its log; once it ended, the API's own JSON 404
    (a RESOURCE_NOT_FOUND body, not a proxy's page), with and without follow; without the quirk
    the same requests answer the whole log."""
    svc = fake_service_factory(clock=FakeClock(FROZEN, time_scale=0), quirks={"logs_gone_at_termination": True})
    sid = svc.add_session(TEST_TOKEN)
    svc.advance(10)
    with _client(svc) as c:
        running = c.get("/logs", params={"id": sid, "follow": "false"})
        assert running.status_code == 200 and running.content == render_text(svc.log_lines(TEST_TOKEN, sid))
        assert c.get("/query/log", params={"matchKey": sid}).status_code == 200
        svc.end_session(TEST_TOKEN, sid)
        for path, params in (
            ("/logs", {"id": sid, "follow": "false"}),
            ("/logs", {"id": sid, "follow": "true"}),
            ("/query/log", {"matchKey": sid}),
        ):
            r = c.get(path, params=params)
            assert r.status_code == 404, path
            assert r.headers["content-type"] == "application/json"
            assert r.json()["code"] == "RESOURCE_NOT_FOUND"
        # The session itself is still there (describe answers), only its logs are gone.
        assert c.get(f"/session/{sid}").status_code == 200
        svc.set_quirks(logs_gone_at_termination=False)
        after = c.get("/logs", params={"id": sid, "follow": "false"})
        assert after.status_code == 200 and after.content == render_text(svc.log_lines(TEST_TOKEN, sid))


def test_a_follow_stream_open_when_the_session_ends_still_delivers_its_last_lines_with_the_quirk(
    fake_service_factory: Callable[..., FakeService],
) -> None:
    """The quirk refuses new requests after the end; a stream already following sees the shutdown
    block and a proper end of body, as a container's log stream does when it stops."""
    svc = fake_service_factory(clock=FakeClock(FROZEN, time_scale=0), quirks={"logs_gone_at_termination": True})
    sid = svc.add_session(TEST_TOKEN)
    with (
        _client(svc) as c,
        c.stream("GET", "/logs", params={"id": sid, "follow": "true"}, headers={"Accept": "text/plain"}) as r,
    ):
        lines = r.iter_lines()
        first = [next(lines) for _ in range(4)]  # the boot lines, there from the start
        svc.advance(6)
        svc.end_session(TEST_TOKEN, sid)
        rest = list(lines)
    got = first + rest
    assert got == [line for _, line in svc.log_lines(TEST_TOKEN, sid)]
    assert got[-1].endswith("shutdown complete")


def test_cut_fault_breaks_each_sessions_follow_stream_once_mid_line_and_leaves_other_requests_alone(
    fake_service_factory: Callable[..., FakeService],
) -> None:
    """``cut`` with after=150, per_session=1, follow_only: the first follow stream of every session
    delivers exactly 150 body bytes (mid-line) and breaks without ending the body; the next one of
    the same session is whole; plain reads are never cut."""
    svc = fake_service_factory(clock=FakeClock(FROZEN, time_scale=0))
    svc.set_fault("GET /logs", kind="cut", after=150, per_session=1, follow_only=True)
    a, b = svc.add_session(TEST_TOKEN), svc.add_session(TEST_TOKEN)
    svc.advance(20)
    with _client(svc) as c:
        plain = c.get("/logs", params={"id": a, "follow": "false"}, headers={"Accept": "application/json"})
        assert plain.status_code == 200
        whole = render_ndjson(svc.log_lines(TEST_TOKEN, a))
        assert plain.content == whole
        body, complete = _read_until_broken(c, a)
        assert not complete
        assert body == whole[:150] and not body.endswith(b"\n")  # mid-line
        svc.end_session(TEST_TOKEN, a)
        body, complete = _read_until_broken(c, a)
        assert complete and body == render_ndjson(svc.log_lines(TEST_TOKEN, a))
        # Another session has its own allowance: cut once as well.
        body_b, complete_b = _read_until_broken(c, b)
        assert not complete_b and len(body_b) == 150
    assert svc.faults_fired("GET /logs") == {"cut": 2}


def test_cut_fault_without_after_cuts_the_first_chunk_in_half_and_also_breaks_fixed_bodies(
    fake_service_factory: Callable[..., FakeService],
) -> None:
    """A cut without ``after`` delivers half of the first body chunk; on a Content-Length body it
    sends part of it and closes, which the client sees as a broken body; a cut beyond the end of
    a short body leaves that body whole."""
    svc = fake_service_factory(clock=FakeClock(FROZEN, time_scale=0))
    sid = svc.add_session(TEST_TOKEN)
    svc.advance(10)
    first = render_text(svc.log_lines(TEST_TOKEN, sid))
    svc.set_fault("GET /logs", kind="cut", count=1)
    with _client(svc) as c:
        body, complete = _read_until_broken(c, sid, accept="text/plain")
        assert not complete and body == first[: len(first) // 2]
        svc.set_fault("GET /query/log", kind="cut", after=10, count=1)
        with pytest.raises(httpx.RemoteProtocolError):
            c.get("/query/log", params={"matchKey": sid})
        svc.set_fault("GET /query/log", kind="cut", after=10**6, count=1)
        assert c.get("/query/log", params={"matchKey": sid}).content == first


def test_cut_fault_is_set_over_the_control_api_and_parsed_from_text() -> None:
    """The new options travel through the control API's mapping and the ``--fault`` text form;
    nonsense is refused with a FakeConfigError."""
    assert parse_fault_spec("GET /logs:cut,after=300,per_session=1,follow_only=true") == (
        "GET /logs",
        FaultSpec(kind="cut", after=300, per_session=1, follow_only=True),
    )
    for bad in (
        "GET /logs:status=500,after=3",  # after belongs to cut
        "GET /logs:cut,after=-1",
        "GET /logs:cut,after=1.5",
        "GET /logs:cut,per_session=-1",
        "GET /logs:cut,follow_only=maybe",
    ):
        with pytest.raises(FakeConfigError):
            parse_fault_spec(bad)
    with FakeService((TEST_TOKEN,), clock=FakeClock(FROZEN, time_scale=0)) as svc, _client(svc) as c:
        spec = {"kind": "cut", "after": 40, "per_session": 1, "follow_only": True}
        r = c.put("/_fake/faults", json={"endpoint": "GET /logs", **spec})
        assert r.status_code == 200, r.text
        installed = r.json()["GET /logs"]
        assert {k: installed[k] for k in spec} == spec
        sid = svc.add_session(TEST_TOKEN)
        body, complete = _read_until_broken(c, sid)
        assert not complete and len(body) == 40
        state = c.get("/_fake/state").json()
        assert state["faults_fired"] == {"cut": 1}
        assert body.startswith(b'{"streamType": 1, "line": "') and b"\n" not in body  # cut inside line 1


def test_logs_text_only_quirk_answers_plain_text_even_when_ndjson_is_asked_for(
    fake_service_factory: Callable[..., FakeService],
) -> None:
    svc = fake_service_factory(clock=FakeClock(FROZEN, time_scale=0), quirks={"logs_text_only": True})
    sid = svc.add_session(TEST_TOKEN)
    with _client(svc) as c:
        r = c.get("/logs", params={"id": sid}, headers={"Accept": "application/json"})
    assert r.headers["content-type"].startswith("text/plain")
    assert r.content == render_text(svc.log_lines(TEST_TOKEN, sid))
