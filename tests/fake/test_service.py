"""The fake hosting service over real loopback sockets: lifecycle, auth, shapes, quirks, faults, streaming."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import socket
import struct
import subprocess
import sys
import tarfile
import threading
import time
import tracemalloc
import uuid
from collections.abc import Callable
from datetime import datetime
from urllib.parse import quote

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from archiver.fake import FakeClock, FakeConfigError, FakeService, FaultSpec, parse_fault_spec, parse_quirk
from archiver.fake.main import (
    FakeServiceOptions,
    options_from_cli,
    parse_capacity,
    parse_duration,
    parse_listen,
    serve_forever,
)
from tests.fixtures_fake import TEST_TOKEN, openapi_hooks
from tests.openapi_check import ContractViolation, validate_response
from tests.support import wait_until

RETENTION = 4 * 3600


def sid_path(sid: str) -> str:
    return "/session/" + quote(sid, safe="")


def untar(body: bytes) -> dict[str, bytes | None]:
    """Member name → content (None for directories) of a .tar.gz body, read as a stream."""
    out: dict[str, bytes | None] = {}
    with tarfile.open(fileobj=io.BytesIO(body), mode="r|gz") as tf:
        for member in tf:
            f = tf.extractfile(member) if member.isfile() else None
            out[member.name] = None if f is None else f.read()
    return out


def client_for(svc: FakeService, token: str, *, validated: bool = True) -> httpx.Client:
    return httpx.Client(
        base_url=svc.base_url,
        headers={"Authorization": f"Bearer {token}", "Accept": "application/json"},
        event_hooks=openapi_hooks() if validated else None,
        timeout=30.0,
    )


# --- lifecycle ----------------------------------------------------------------------------------


def test_session_lifecycle_create_list_describe_stop_artifacts_then_removal(
    fake_service: FakeService, validated_client: httpx.Client
) -> None:
    """A session is listed while active, refuses artifacts, stops with 204 then 409, serves a
    deterministic .tar.gz after termination, and is 404 everywhere after the retention window."""
    c = validated_client
    r = c.post("/session", json={"id": "match-1", "location": "eu-west-1", "image": "demo-game"})
    assert r.status_code == 201
    created = r.json()
    assert created["id"] == "match-1"
    assert created["host"] in ("203.0.113.10", "203.0.113.11")
    assert created["ports"] == [{"type": "udp", "container": 7777, "host": created["ports"][0]["host"]}]

    assert [s["id"] for s in c.get("/session").json()["sessions"]] == ["match-1"]
    described = c.get(sid_path("match-1")).json()
    assert (described["status"], described["tag"]) == ("running", "1.1.0")

    refused = c.get("/artifacts", params={"session": "match-1", "path": "/srv/replays/match.replay"})
    assert refused.status_code == 404
    assert "still running" in refused.json()["message"]

    assert c.delete(sid_path("match-1")).status_code == 204
    again = c.delete(sid_path("match-1"))
    assert again.status_code == 409 and again.json()["code"] == "CONFLICT"

    assert c.get("/session").json()["sessions"] == []
    [ended] = c.get("/session", params={"all": "true"}).json()["sessions"]
    assert ended["status"] == "exited"
    assert c.get(sid_path("match-1")).json()["status"] == "exited"

    art = c.get("/artifacts", params={"session": "match-1", "path": "/srv/replays/match.replay"})
    assert art.status_code == 200
    assert art.headers["content-type"] == "application/gzip"
    assert art.content[:2] == b"\x1f\x8b"
    members = untar(art.content)
    assert list(members) == ["match.replay"]
    assert len(members["match.replay"] or b"") == 1024 * 1024
    assert art.content == b"".join(fake_service.artifact_bytes(TEST_TOKEN, "match-1", "/srv/replays/match.replay"))
    again_bytes = c.get("/artifacts", params={"session": "match-1", "path": "/srv/replays/match.replay"}).content
    assert again_bytes == art.content

    fake_service.clock.advance(RETENTION + 1)
    assert c.get(sid_path("match-1")).status_code == 404
    assert c.get(sid_path("match-1")).json()["code"] == "RESOURCE_NOT_FOUND"
    assert c.delete(sid_path("match-1")).status_code == 404
    gone = c.get("/artifacts", params={"session": "match-1", "path": "/srv"})
    assert gone.status_code == 404
    assert c.get("/logs", params={"id": "match-1"}).status_code == 404
    assert c.get("/session", params={"all": "true"}).json()["sessions"] == []


def test_removal_happens_exactly_after_retention(fake_service_factory: Callable[..., FakeService]) -> None:
    """With a frozen clock, a terminated session is still described one second before the
    retention window closes and gone at its end."""
    svc = fake_service_factory(clock=FakeClock(1_700_000_000, time_scale=0), retention=600)
    sid = svc.add_session(TEST_TOKEN)
    svc.end_session(TEST_TOKEN, sid)
    with client_for(svc, TEST_TOKEN) as c:
        svc.advance(599)
        assert c.get(sid_path(sid)).status_code == 200
        svc.advance(1)
        assert c.get(sid_path(sid)).status_code == 404


def test_create_without_id_generates_a_uuid_and_version_picks_the_tag(validated_client: httpx.Client) -> None:
    """An omitted id becomes a UUIDv4; an omitted version runs the highest-priority tag."""
    r = validated_client.post("/session", json={"location": "us-east-1", "image": "demo-game"})
    assert r.status_code == 201
    sid = r.json()["id"]
    assert uuid.UUID(sid).version == 4
    assert validated_client.get(sid_path(sid)).json()["tag"] == "1.1.0"
    old = validated_client.post("/session", json={"location": "us-east-1", "image": "demo-game", "version": "1.0.0"})
    assert validated_client.get(sid_path(old.json()["id"])).json()["tag"] == "1.0.0"


def test_ttl_ends_the_session_and_logs_show_the_shutdown(
    fake_service: FakeService, validated_client: httpx.Client
) -> None:
    """A ttl of 1m terminates the session (exited) once a virtual minute has passed."""
    r = validated_client.post(
        "/session", json={"id": "short", "location": "eu-west-1", "image": "demo-game", "ttl": "1m"}
    )
    assert r.status_code == 201
    assert validated_client.get(sid_path("short")).json()["status"] == "running"
    fake_service.clock.advance(61)
    assert validated_client.get(sid_path("short")).json()["status"] == "exited"
    text = validated_client.get("/logs", params={"id": "short"}, headers={"Accept": "text/plain"}).text
    assert text.rstrip("\n").endswith("shutdown complete")


def test_ids_with_any_characters_round_trip(validated_client: httpx.Client) -> None:
    """Ids holding '/', '?', '#', '%', spaces, unicode, or looking like sub-paths work when
    percent-encoded; 'player/join' as an id is not the join endpoint."""
    for sid in ("a/b", "q?x=1#frag", "100% sure", "ünï-çødé ✓", "player/join", "../../etc/passwd"):
        assert (
            validated_client.post(
                "/session", json={"id": sid, "location": "eu-west-1", "image": "demo-game"}
            ).status_code
            == 201
        )
        assert validated_client.get(sid_path(sid)).json()["id"] == sid
        assert validated_client.delete(sid_path(sid)).status_code == 204
        logs = validated_client.get("/logs", params={"id": sid}, headers={"Accept": "text/plain"})
        assert logs.status_code == 200


# --- errors and auth ----------------------------------------------------------------------------


def test_unauthorized_requests_get_the_standard_error_body(fake_service: FakeService) -> None:
    """Missing, unknown or non-bearer credentials answer 401 with every ErrorResponse field."""
    for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": f"Basic {TEST_TOKEN}"}):
        with httpx.Client(base_url=fake_service.base_url, event_hooks=openapi_hooks()) as c:
            r = c.get("/session", headers=headers)
        assert r.status_code == 401
        body = r.json()
        assert body["statusCode"] == 401
        assert body["code"] == "UNAUTHORIZED"
        assert body["message"] and body["details"]
        assert body["path"] == "/session"
        assert datetime.fromisoformat(body["timestamp"].replace("Z", "+00:00")).tzinfo is not None
        assert uuid.UUID(body["identifier"])
        assert TEST_TOKEN not in r.text


def test_control_api_needs_a_token_too(fake_service: FakeService) -> None:
    """/_fake/ is not an open door: without a valid bearer token it answers 401."""
    r = httpx.post(fake_service.base_url + "/_fake/clock/advance", json={"seconds": 99999})
    assert r.status_code == 401


def test_create_rejects_bad_bodies_with_violations(validated_client: httpx.Client) -> None:
    """Wrong types, missing fields, unknown fields and bad ttl answer 422 naming each field; env
    values are never echoed back."""
    r = validated_client.post(
        "/session",
        json={
            "location": 7, "env": {"API_KEY": 987654321}, "labels": {"a": 1}, "args": ["ok", 3],
            "restart": "yes", "ttl": "90s", "surprise": True,
        },
    )  # fmt: skip
    assert r.status_code == 422
    fields = {v["field"] for v in r.json()["violations"]}
    assert fields == {"location", "image", "env.API_KEY", "labels.a", "args", "restart", "ttl", "surprise"}
    assert "987654321" not in r.text
    assert validated_client.post("/session", content=b"{not json").status_code == 422
    assert validated_client.post("/session", json=["a"]).status_code == 422


def test_create_answers_404_409_for_unknown_things_and_duplicates(validated_client: httpx.Client) -> None:
    """Unknown image, location or version are 404; a reused id is 409."""
    base = {"location": "eu-west-1", "image": "demo-game"}
    assert validated_client.post("/session", json={**base, "image": "nope"}).status_code == 404
    assert validated_client.post("/session", json={**base, "location": "mars-1"}).status_code == 404
    assert validated_client.post("/session", json={**base, "version": "9.9.9"}).status_code == 404
    assert validated_client.post("/session", json={**base, "id": "dup"}).status_code == 201
    dup = validated_client.post("/session", json={**base, "id": "dup"})
    assert dup.status_code == 409


def test_capacity_and_start_rate_limits_answer_420(fake_service_factory: Callable[..., FakeService]) -> None:
    """A full location and too many starts per minute both answer 420 with an error body."""
    svc = fake_service_factory(capacity={"eu-west-1": 1}, start_rate_per_min=2, clock=FakeClock(time_scale=0))
    body = {"location": "eu-west-1", "image": "demo-game"}
    with client_for(svc, TEST_TOKEN) as c:
        assert c.post("/session", json=body).status_code == 201
        full = c.post("/session", json=body)
        assert full.status_code == 420 and full.reason_phrase == "Enhance Your Calm"
        assert full.json()["statusCode"] == 420
        assert [loc["id"] for loc in c.get("/available-location/demo-game").json()["locations"]] == [
            "us-east-1", "ap-southeast-1",
        ]  # fmt: skip
        assert c.post("/session", json={**body, "location": "us-east-1"}).status_code == 201
        assert c.post("/session", json={**body, "location": "us-east-1"}).status_code == 420  # 3rd start in a minute
        svc.advance(61)
        assert c.post("/session", json={**body, "location": "us-east-1"}).status_code == 201


def test_token_isolation(fake_service_factory: Callable[..., FakeService]) -> None:
    """Each token is its own organisation: another org's session is 404 and never listed."""
    svc = fake_service_factory(("tok-a", "tok-b"))
    sid = svc.add_session("tok-a", id="shared-name")
    svc.add_session("tok-a", id="ended")
    svc.end_session("tok-a", "ended")
    with client_for(svc, "tok-b") as b, client_for(svc, "tok-a") as a:
        assert b.get("/session", params={"all": "true"}).json()["sessions"] == []
        assert b.get(sid_path(sid)).status_code == 404
        assert b.delete(sid_path(sid)).status_code == 404
        assert b.get("/artifacts", params={"session": "ended", "path": "/srv"}).status_code == 404
        assert b.get("/logs", params={"id": sid}).status_code == 404
        assert b.put("/session/player/join", json={"session": sid, "players": ["x"]}).status_code == 404
        assert b.get("/metrics").text == "session_count 0\n"
        assert a.get("/metrics").text == "session_count 1\n"
        # The same id is free in the other organisation.
        assert (
            b.post("/session", json={"id": "shared-name", "location": "eu-west-1", "image": "demo-game"}).status_code
            == 201
        )


# --- shapes -------------------------------------------------------------------------------------


def test_list_entry_looks_like_the_real_sample(fake_service: FakeService, validated_client: httpx.Client) -> None:
    """labels.env is a JSON string of the caller env plus GAMEYE_SESSION_ID/HOST, labels.tags a
    JSON string of the caller labels, created epoch ms, port {"7777/udp": 20000-30000}."""
    before = fake_service.clock.now() * 1000
    validated_client.post(
        "/session",
        json={
            "id": "s1",
            "location": "ap-southeast-1",
            "image": "demo-game",
            "env": {"MODE": "x"},
            "labels": {"mode": "duel"},
        },
    )
    [entry] = validated_client.get("/session").json()["sessions"]
    assert set(entry) == {
        "id",
        "image",
        "tag",
        "location",
        "host",
        "created",
        "port",
        "status",
        "labels",
        "playerCount",
    }
    env = json.loads(entry["labels"]["env"])
    assert env == {"MODE": "x", "GAMEYE_SESSION_ID": "s1", "GAMEYE_HOST": entry["host"]}
    assert json.loads(entry["labels"]["tags"]) == {"mode": "duel"}
    assert isinstance(entry["created"], int) and before - 1 <= entry["created"] <= fake_service.clock.now() * 1000
    [(key, port)] = entry["port"].items()
    assert key == "7777/udp" and 20000 <= port <= 30000
    assert entry["host"] in ("192.0.2.30", "192.0.2.31")
    assert (entry["status"], entry["playerCount"]) == ("running", 0)


def test_list_filters(fake_service: FakeService, validated_client: httpx.Client) -> None:
    """filter[k]=v (exact, ANDed), location, image, tag, host, playerCount[lt|gt] and all=true."""
    fs = fake_service
    fs.add_session(TEST_TOKEN, id="a", labels={"mode": "duel", "tier": "gold"}, players=["p1"])
    fs.add_session(TEST_TOKEN, id="b", labels={"mode": "duel", "tier": "silver"}, location="us-east-1", tag="1.0.0")
    fs.add_session(TEST_TOKEN, id="c", labels={"mode": "team"}, players=["p1", "p2", "p3"])
    fs.add_session(TEST_TOKEN, id="d", labels={"mode": "duel", "tier": "gold"})
    fs.end_session(TEST_TOKEN, "d")

    def ids(**params: str) -> list[str]:
        return [s["id"] for s in validated_client.get("/session", params=params).json()["sessions"]]

    assert ids() == ["a", "b", "c"]
    assert ids(**{"filter[mode]": "duel"}) == ["a", "b"]
    assert ids(**{"filter[mode]": "duel", "filter[tier]": "gold"}) == ["a"]
    assert ids(**{"filter[mode]": "Duel"}) == []
    assert ids(location="us-east-1") == ["b"]
    assert ids(tag="1.0.0") == ["b"]
    assert ids(image="demo-game") == ["a", "b", "c"]
    assert ids(image="other") == []
    host_of_c = validated_client.get(sid_path("c")).json()["host"]
    assert "c" in ids(host=host_of_c) and all(
        validated_client.get(sid_path(s)).json()["host"] == host_of_c for s in ids(host=host_of_c)
    )
    assert ids(**{"playerCount[gt]": "0"}) == ["a", "c"]
    assert ids(**{"playerCount[lt]": "2"}) == ["a", "b"]
    assert ids(**{"playerCount[gt]": "0", "playerCount[lt]": "2"}) == ["a"]
    assert ids(all="true") == ["a", "b", "c", "d"]
    assert ids(all="true", **{"filter[tier]": "gold"}) == ["a", "d"]


def test_players_join_is_idempotent_and_leave_needs_a_session(validated_client: httpx.Client) -> None:
    """Join twice counts once; leave removes; leave without session is 404; bad bodies are 422."""
    c = validated_client
    c.post("/session", json={"id": "pj", "location": "eu-west-1", "image": "demo-game"})
    assert c.put("/session/player/join", json={"session": "pj", "players": ["p1", "p2"]}).json() == {
        "count": 2, "players": ["p1", "p2"],
    }  # fmt: skip
    assert c.put("/session/player/join", json={"session": "pj", "players": ["p2", "p3"]}).json()["count"] == 3
    left = c.request("DELETE", "/session/player/leave", json={"session": "pj", "players": ["p1"]})
    assert left.json() == {"count": 2, "players": ["p2", "p3"]}
    assert c.get(sid_path("pj")).json()["players"] == {"joined": ["p2", "p3"], "joinedCount": 2}
    assert c.request("DELETE", "/session/player/leave", json={"players": ["p2"]}).status_code == 404
    assert c.put("/session/player/join", json={"session": "nope", "players": ["x"]}).status_code == 404
    bad = c.put("/session/player/join", json={"session": "pj", "players": "p9"})
    assert bad.status_code == 422 and bad.json()["violations"][0]["field"] == "players"
    assert c.request("DELETE", "/session/player/leave", json={"session": "pj", "players": [1]}).status_code == 422


def test_locations_and_tags(fake_service: FakeService, validated_client: httpx.Client) -> None:
    """available-location lists the catalogue with ips; tag answers exists true/false; unknown
    image is 404 on both; the tag_absent_404 quirk turns exists:false into 404."""
    locs = validated_client.get("/available-location/demo-game").json()["locations"]
    assert [loc["id"] for loc in locs] == ["eu-west-1", "us-east-1", "ap-southeast-1"]
    assert all(loc["ips"] for loc in locs)
    assert validated_client.get("/available-location/nope").status_code == 404
    assert validated_client.get("/tag/eu-west-1/demo-game/1.0.0").json() == {"exists": True}
    assert validated_client.get("/tag/eu-west-1/demo-game/2.0.0").json() == {"exists": False}
    assert validated_client.get("/tag/eu-west-1/nope/1.0.0").status_code == 404
    fake_service.set_quirks(tag_absent_404=True)
    assert validated_client.get("/tag/eu-west-1/demo-game/2.0.0").status_code == 404


# --- content ------------------------------------------------------------------------------------


def test_artifact_folders_include_everything_and_crashes_have_a_core(
    fake_service: FakeService, validated_client: httpx.Client
) -> None:
    """A folder request archives every file under it (with directory entries); a dead session
    also has /srv/crash/core.txt; unknown and relative paths are 404."""
    sid = fake_service.add_session(TEST_TOKEN, crashed=True, files={"/srv/data/extra.bin": 5000})
    fake_service.end_session(TEST_TOKEN, sid)
    assert validated_client.get(sid_path(sid)).json()["status"] == "dead"
    r = validated_client.get("/artifacts", params={"session": sid, "path": "/srv"})
    members = untar(r.content)
    assert list(members) == [  # tarfile reports directories without their trailing slash
        "srv", "srv/crash", "srv/crash/core.txt", "srv/data", "srv/data/extra.bin", "srv/replays",
        "srv/replays/match.replay",
    ]  # fmt: skip
    assert len(members["srv/data/extra.bin"] or b"") == 5000
    assert b"SIGSEGV" in (members["srv/crash/core.txt"] or b"")
    log = untar(
        validated_client.get("/artifacts", params={"session": sid, "path": "/var/log/game/server.log/"}).content
    )
    assert (log["server.log"] or b"").count(b"\n") > 1000
    for path in ("/srv/nothing", "srv/replays", "/srv/replays/match.replay/x"):
        assert validated_client.get("/artifacts", params={"session": sid, "path": path}).status_code == 404


def test_content_is_deterministic_across_processes(fake_service: FakeService, validated_client: httpx.Client) -> None:
    """The same session id yields the same artifact bytes in another process with another hash seed."""
    sid = fake_service.add_session(TEST_TOKEN, id="same-everywhere")
    fake_service.end_session(TEST_TOKEN, sid)
    served = validated_client.get("/artifacts", params={"session": sid, "path": "/srv/replays"}).content
    script = (
        "import hashlib; from archiver.fake.content import session_files;"
        "from archiver.fake.tarstream import artifact_stream;"
        "body = artifact_stream('same-everywhere', session_files({}, crashed=False), '/srv/replays');"
        "print(hashlib.sha256(b''.join(body)).hexdigest())"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True,
        env={**os.environ, "PYTHONHASHSEED": "12345"},
    )  # fmt: skip
    assert out.stdout.strip() == hashlib.sha256(served).hexdigest()
    other = fake_service.add_session(TEST_TOKEN, id="different")
    fake_service.end_session(TEST_TOKEN, other)
    assert validated_client.get("/artifacts", params={"session": other, "path": "/srv/replays"}).content != served


def test_logs_plain_json_and_legacy_name(fake_service: FakeService, validated_client: httpx.Client) -> None:
    """/logs answers text lines by default and {streamType, line} NDJSON for Accept JSON; the old
    matchKey name works; a crashed session ends with a stderr stack trace."""
    sid = fake_service.add_session(TEST_TOKEN, crashed=True)
    fake_service.end_session(TEST_TOKEN, sid)
    truth = fake_service.log_lines(TEST_TOKEN, sid)
    assert len(truth) > 100 and {s for s, _ in truth} == {1, 2}
    text = validated_client.get("/logs", params={"id": sid, "follow": "false"}, headers={"Accept": "text/plain"})
    assert text.headers["content-type"].startswith("text/plain")
    assert text.text.splitlines() == [line for _, line in truth]
    nd = validated_client.get("/logs", params={"matchKey": sid})
    entries = [json.loads(x) for x in nd.text.splitlines()]
    assert [(e["streamType"], e["line"]) for e in entries] == truth
    assert truth[-1][0] == 2 and "core dumped" in truth[-1][1]
    assert any("FATAL" in line for s, line in truth[-8:] if s == 2)


def test_active_session_logs_grow_with_the_clock(fake_service_factory: Callable[..., FakeService]) -> None:
    """While running, the log is what was written so far (a prefix of the final log)."""
    svc = fake_service_factory(clock=FakeClock(1_700_000_000, time_scale=0))
    sid = svc.add_session(TEST_TOKEN)
    first = svc.log_lines(TEST_TOKEN, sid)
    svc.advance(20)
    later = svc.log_lines(TEST_TOKEN, sid)
    svc.end_session(TEST_TOKEN, sid)
    final = svc.log_lines(TEST_TOKEN, sid)
    assert len(first) < len(later) < len(final)
    assert later[: len(first)] == first and final[: len(later)] == later


def test_follow_streams_until_the_session_terminates(fake_service: FakeService, validated_client: httpx.Client) -> None:
    """follow=true keeps the response open and ends it after the last line once the container stops."""
    sid = fake_service.add_session(TEST_TOKEN)
    params = {"id": sid, "follow": "true"}
    with validated_client.stream("GET", "/logs", params=params, headers={"Accept": "text/plain"}) as r:
        assert r.headers["transfer-encoding"] == "chunked"
        lines = r.iter_lines()
        got = [next(lines)]
        fake_service.end_session(TEST_TOKEN, sid)
        got.extend(lines)
    assert got == [line for _, line in fake_service.log_lines(TEST_TOKEN, sid)]
    assert got[-1].endswith("shutdown complete")


def test_query_log_shapes(fake_service: FakeService, raw_client: httpx.Client) -> None:
    """/query/log answers text by default; the quirk selects NDJSON or the legacy line map."""
    sid = fake_service.add_session(TEST_TOKEN)
    fake_service.end_session(TEST_TOKEN, sid)
    truth = fake_service.log_lines(TEST_TOKEN, sid)
    assert raw_client.get("/query/log", params={"matchKey": sid}).text.splitlines() == [x for _, x in truth]
    fake_service.set_quirks(query_log_shape="ndjson")
    nd = raw_client.get("/query/log", params={"matchKey": sid}).text.splitlines()
    assert [tuple(json.loads(x).values()) for x in nd] == truth
    fake_service.set_quirks(query_log_shape="legacy")
    legacy = raw_client.get("/query/log", params={"matchKey": sid}).json()["line"]
    assert legacy["1"] == {"lineKey": "1", "payload": truth[0][1]}
    assert [legacy[str(i)]["payload"] for i in range(1, len(truth) + 1)] == [x for _, x in truth]
    assert raw_client.get("/query/log", params={"matchKey": "nope"}).status_code == 404


def test_metrics_session_count_and_extra_families(fake_service: FakeService, raw_client: httpx.Client) -> None:
    """/metrics is `session_count N` for the caller; the quirk adds typed families."""
    fake_service.add_session(TEST_TOKEN, players=["a", "b"])
    fake_service.add_session(TEST_TOKEN)
    r = raw_client.get("/metrics")
    assert r.text == "session_count 2\n"
    fake_service.set_quirks(metrics_extra_families=True)
    families = {f.name: f for f in text_string_to_metric_families(raw_client.get("/metrics").text)}
    assert families["session_count"].type == "gauge"
    assert families["sessions_started"].type == "counter"
    assert families["sessions_started"].samples[0].value == 2
    assert families["session_players"].samples[0].labels == {"location": "eu-west-1"}
    assert families["session_players"].samples[0].value == 2


# --- quirks -------------------------------------------------------------------------------------


def _first(c: httpx.Client) -> dict[str, object]:
    entry: dict[str, object] = c.get("/session").json()["sessions"][0]
    return entry


def _create(c: httpx.Client, **extra: str) -> dict[str, object]:
    body: dict[str, object] = c.post("/session", json={"location": "eu-west-1", "image": "demo-game", **extra}).json()
    return body


# name, flags, check on the wire (raw client, session "q1" seeded), whether the shape is within the OpenAPI
QUIRK_CASES: list[tuple[str, dict[str, bool | str], Callable[[httpx.Client], bool], bool]] = [
    ("port_as_string", {"port_as_string": True},
     lambda c: json.loads(str(_first(c)["port"])).keys() == {"7777/udp"}, False),
    ("port_wrapped", {"port_wrapped": True},
     lambda c: list(c.get(sid_path("q1")).json()["port"]) == ["port"], False),
    ("port_as_string+wrapped", {"port_as_string": True, "port_wrapped": True},
     lambda c: isinstance(c.get(sid_path("q1")).json()["port"]["port"], str), False),
    ("labels_as_string", {"labels_as_string": True},
     lambda c: json.loads(json.loads(str(_first(c)["labels"]))["tags"]) == {"mode": "duel"}, False),
    ("labels_wrapped", {"labels_wrapped": True},
     lambda c: set(c.get(sid_path("q1")).json()["labels"]["labels"]) == {"env", "tags"}, False),
    ("omit_optional_list_fields", {"omit_optional_list_fields": True},
     lambda c: not {"tag", "status", "playerCount"} & set(_first(c)), True),
    ("player_count_null", {"player_count_null": True}, lambda c: _first(c)["playerCount"] is None, False),
    ("omit_create_id", {"omit_create_id": True},
     lambda c: "id" not in _create(c, id="x") and "id" in _create(c), True),
    ("delete_returns_200", {"delete_returns_200": True},
     lambda c: (lambda r: (r.status_code, r.content) == (200, b""))(c.delete(sid_path("q1"))), True),
    ("extra_fields", {"extra_fields": True}, lambda c: "enableMetrics" in _first(c), True),
    ("float_created", {"float_created": True},
     lambda c: isinstance(c.get(sid_path("q1")).json()["created"], float), True),
]  # fmt: skip


@pytest.mark.parametrize(("name", "flags", "check", "in_contract"), QUIRK_CASES, ids=[c[0] for c in QUIRK_CASES])
def test_each_quirk_changes_the_wire_shape(
    fake_service: FakeService,
    raw_client: httpx.Client,
    name: str,
    flags: dict[str, bool | str],
    check: Callable[[httpx.Client], bool],
    in_contract: bool,
) -> None:
    """Each quirk produces its shape; shapes outside the OpenAPI are caught by the contract
    validator (so the validator would notice them anywhere else)."""
    fake_service.add_session(TEST_TOKEN, id="q1", labels={"mode": "duel"}, players=["p"])
    fake_service.set_quirks(**flags)
    assert check(raw_client), name
    listed, described = raw_client.get("/session", params={"all": "true"}), raw_client.get(sid_path("q1"))
    if in_contract:
        validate_response("GET", "/session?all=true", 200, dict(listed.headers), listed.content)
        validate_response("GET", sid_path("q1"), 200, dict(described.headers), described.content)
    else:
        with pytest.raises(ContractViolation):
            validate_response("GET", "/session?all=true", 200, dict(listed.headers), listed.content)


def test_quirks_are_off_by_default(fake_service: FakeService, raw_client: httpx.Client) -> None:
    """Without switches the shapes are the documented ones (ints, objects, all fields)."""
    fake_service.add_session(TEST_TOKEN, id="q1")
    entry = _first(raw_client)
    assert isinstance(entry["port"], dict) and isinstance(entry["labels"], dict)
    assert isinstance(entry["created"], int) and entry["playerCount"] == 0
    assert "id" in _create(raw_client, id="x")
    assert raw_client.delete(sid_path("q1")).status_code == 204


def test_artifacts_content_type_quirk_keeps_gzip_bytes(
    fake_service: FakeService, validated_client: httpx.Client
) -> None:
    """With the quirk the body is labelled application/x-tar but is still gzip."""
    sid = fake_service.add_session(TEST_TOKEN)
    fake_service.end_session(TEST_TOKEN, sid)
    fake_service.set_quirks(artifacts_content_type_tar=True)
    r = validated_client.get("/artifacts", params={"session": sid, "path": "/var/log"})
    assert r.headers["content-type"] == "application/x-tar"
    assert gzip.decompress(r.content)[:512].startswith(b"log/")


def test_unknown_quirks_are_rejected(fake_service: FakeService) -> None:
    with pytest.raises(FakeConfigError, match="unknown quirk"):
        fake_service.set_quirks(no_such_quirk=True)
    with pytest.raises(FakeConfigError):
        fake_service.set_quirks(query_log_shape="xml")


def test_logs_keepalive_quirk_sends_blank_lines_while_idle(
    fake_service_factory: Callable[..., FakeService],
) -> None:
    """With the keep-alive quirk a follower sees blank lines while nothing is written."""
    svc = fake_service_factory(clock=FakeClock(time_scale=0), quirks={"logs_keepalive": True})
    sid = svc.add_session(TEST_TOKEN)
    with (
        client_for(svc, TEST_TOKEN) as c,
        c.stream("GET", "/logs", params={"id": sid, "follow": "true"}) as r,
    ):
        lines = r.iter_lines()
        for _ in range(4):  # the boot lines
            next(lines)
        assert next(lines) == ""
        svc.end_session(TEST_TOKEN, sid)
        rest = [x for x in lines if x]
    assert rest and json.loads(rest[-1])["line"].endswith("shutdown complete")


# --- faults -------------------------------------------------------------------------------------


def test_fault_count_fails_the_next_requests_then_recovers(
    fake_service: FakeService, validated_client: httpx.Client
) -> None:
    """count=2 with 502 answers two HTML gateway pages, then the real response; requests counted."""
    fake_service.set_fault("GET /session", status=502, count=2)
    for _ in range(2):
        r = validated_client.get("/session")
        assert r.status_code == 502
        assert r.headers["content-type"] == "text/html"
        assert b"502 Bad Gateway" in r.content and r.content.startswith(b"<html>")
    assert validated_client.get("/session").status_code == 200
    assert fake_service.request_count("GET /session") == 3
    assert validated_client.get("/metrics").status_code == 200  # other endpoints unaffected


def test_fault_statuses_and_retry_after(fake_service: FakeService, validated_client: httpx.Client) -> None:
    """429 carries Retry-After; 503/500 carry the JSON error body; 420 on create is documented."""
    fake_service.set_fault("GET /session", status=429, count=1, retry_after=3)
    r = validated_client.get("/session")
    assert (r.status_code, r.headers["retry-after"]) == (429, "3")
    assert r.json()["code"] == "TOO_MANY_REQUESTS"
    fake_service.set_fault("GET /session", status=503, count=1)
    r = validated_client.get("/session")
    assert r.status_code == 503 and r.json()["statusCode"] == 503
    fake_service.set_fault("POST /session", status=420, count=1)
    r = validated_client.post("/session", json={"location": "eu-west-1", "image": "demo-game"})
    assert r.status_code == 420 and r.json()["statusCode"] == 420
    assert validated_client.post("/session", json={"location": "eu-west-1", "image": "demo-game"}).status_code == 201


def test_fault_rate_is_seeded_and_star_applies_everywhere(
    fake_service_factory: Callable[..., FakeService],
) -> None:
    """rate=0.5 fails some but not all requests, the same ones for the same seed; count caps the
    failures; '*' covers every endpoint and an endpoint's own fault wins over it; clear_faults
    removes all."""

    def pattern(seed: int) -> list[int]:
        svc = fake_service_factory(seed=seed)
        svc.set_fault("GET /metrics", status=500, rate=0.5)
        with client_for(svc, TEST_TOKEN) as c:
            return [c.get("/metrics").status_code for _ in range(30)]

    first, again = pattern(7), pattern(7)
    assert first == again and 0 < first.count(500) < 30
    capped = fake_service_factory()
    capped.set_fault("GET /metrics", status=500, rate=1.0, count=2)
    with client_for(capped, TEST_TOKEN) as c:
        assert [c.get("/metrics").status_code for _ in range(4)] == [500, 500, 200, 200]
    capped.set_fault("GET /metrics", status=500, rate=0.5, count=3)
    with client_for(capped, TEST_TOKEN) as c:
        assert [c.get("/metrics").status_code for _ in range(40)].count(500) == 3
    svc = fake_service_factory()
    svc.set_fault("*", status=503)
    svc.set_fault("GET /metrics", status=500)
    with client_for(svc, TEST_TOKEN) as c:
        assert c.get("/session").status_code == 503
        assert c.get("/available-location/demo-game").status_code == 503
        assert c.get("/metrics").status_code == 500
        assert c.get("/_fake/state").status_code == 200  # the control API is never faulted
        svc.clear_faults()
        assert c.get("/session").status_code == 200


def test_fault_latency_delays_the_response(fake_service: FakeService, validated_client: httpx.Client) -> None:
    fake_service.set_fault("GET /session", latency=0.3, count=1)
    start = time.monotonic()
    assert validated_client.get("/session").status_code == 200
    assert time.monotonic() - start >= 0.3


def test_fault_truncate_breaks_fixed_and_chunked_bodies(fake_service: FakeService, raw_client: httpx.Client) -> None:
    """A truncated body (Content-Length or chunked) is a protocol error for the client, and the
    service keeps serving afterwards."""
    fake_service.add_session(TEST_TOKEN, id="t")
    fake_service.end_session(TEST_TOKEN, "t")
    fake_service.set_fault("GET /session", kind="truncate", count=1)
    with pytest.raises(httpx.RemoteProtocolError):
        raw_client.get("/session", params={"all": "true"})
    fake_service.set_fault("GET /artifacts", kind="truncate", count=1)
    with pytest.raises(httpx.RemoteProtocolError):
        raw_client.get("/artifacts", params={"session": "t", "path": "/srv"})
    assert raw_client.get("/artifacts", params={"session": "t", "path": "/srv"}).status_code == 200


def test_fault_reset_closes_without_a_response(fake_service: FakeService, raw_client: httpx.Client) -> None:
    fake_service.set_fault("GET /session/{id}", kind="reset", count=1)
    with pytest.raises(httpx.TransportError):
        raw_client.get(sid_path("anything"))
    assert raw_client.get(sid_path("anything")).status_code == 404
    assert fake_service.request_count("GET /session/{id}") == 2


def test_fault_drip_sends_the_real_body_slowly(fake_service: FakeService, raw_client: httpx.Client) -> None:
    """Drip delivers the correct body piece by piece; a client read timeout shorter than the
    interval gives up."""
    fake_service.set_fault("GET /metrics", kind="drip", interval=0.01, count=1)
    assert raw_client.get("/metrics").text == "session_count 0\n"
    fake_service.set_fault("GET /metrics", kind="drip", interval=2.0, count=1)
    with pytest.raises(httpx.ReadTimeout):
        raw_client.get("/metrics", timeout=httpx.Timeout(5.0, read=0.2))


def test_fault_garbage_and_wrong_types(fake_service: FakeService, raw_client: httpx.Client) -> None:
    """garbage: 200 with a body that is not JSON; wrong_types: 200 JSON of the wrong types, and
    the contract validator rejects both."""
    fake_service.set_fault("GET /session", kind="garbage", count=1)
    r = raw_client.get("/session")
    assert r.status_code == 200
    with pytest.raises(json.JSONDecodeError):
        r.json()
    with pytest.raises(ContractViolation):
        validate_response("GET", "/session", r.status_code, dict(r.headers), r.content)
    fake_service.set_fault("GET /session", kind="wrong_types", count=1)
    r = raw_client.get("/session")
    assert r.json()["sessions"] == "not-a-list"
    with pytest.raises(ContractViolation):
        validate_response("GET", "/session", r.status_code, dict(r.headers), r.content)


def test_fault_specs_parse_and_reject_nonsense() -> None:
    assert parse_fault_spec("GET /session:status=502,count=3") == (
        "GET /session",
        FaultSpec(status=502, count=3),
    )
    assert parse_fault_spec("*:status=429,retry-after=2,rate=0.25") == (
        "*", FaultSpec(status=429, retry_after=2.0, rate=0.25),
    )  # fmt: skip
    assert parse_fault_spec("GET /artifacts:truncate,count=1") == (
        "GET /artifacts",
        FaultSpec(kind="truncate", count=1),
    )
    assert parse_fault_spec("GET /metrics:latency=1.5") == ("GET /metrics", FaultSpec(latency=1.5))
    for bad in ("GET /session", "GET /nope:status=500", "*:status=200", "*:rate=2", "*:explode",
                "*:status=abc", "*:count=1.5", "*:truncate,status=500", "*:colour=red"):  # fmt: skip
        with pytest.raises(FakeConfigError):
            parse_fault_spec(bad)


# --- control API --------------------------------------------------------------------------------


def test_control_api_drives_the_service(fake_service: FakeService, raw_client: httpx.Client) -> None:
    """Seed, end as crashed, set quirks and faults, advance the clock and read the state over HTTP."""
    c = raw_client
    seed = {
        "id": "ctl",
        "labels": {"k": "v"},
        "players": ["a"],
        "crash": True,
        "files": {"/srv/big/x.bin": 10},
    }
    seeded = c.post("/_fake/sessions", json=seed)
    assert seeded.status_code == 201 and seeded.json()["id"] == "ctl"
    assert c.get(sid_path("ctl")).json()["players"]["joinedCount"] == 1
    assert c.post("/_fake/sessions", json={"files": {"relative": 1}}).status_code == 422
    assert c.post("/_fake/sessions", json={"colour": "red"}).status_code == 422

    ended = c.post("/_fake/sessions/ctl/end", json={"status": "dead"})
    assert ended.json() == {"id": "ctl", "status": "dead"}
    assert c.post("/_fake/sessions/ctl/end", json={}).status_code == 404
    assert c.post("/_fake/sessions/x/end", json={"status": "zombie"}).status_code == 422
    assert list(untar(c.get("/artifacts", params={"session": "ctl", "path": "/srv/big"}).content)) == [
        "big",
        "big/x.bin",
    ]

    assert c.put("/_fake/quirks", json={"port_as_string": True}).json()["port_as_string"] is True
    assert isinstance(c.get("/session", params={"all": "true"}).json()["sessions"][0]["port"], str)
    assert c.put("/_fake/quirks", json={"nope": True}).status_code == 422

    assert c.put("/_fake/faults", json={"endpoint": "GET /metrics", "status": 503, "count": 1}).status_code == 200
    assert c.get("/metrics").status_code == 503
    assert c.put("/_fake/faults", json={"endpoint": "GET /nope", "status": 503}).status_code == 422
    c.put("/_fake/faults", json={"endpoint": "GET /metrics", "status": 500})
    assert c.delete("/_fake/faults").json() == {}
    assert c.get("/metrics").status_code == 200

    state = c.get("/_fake/state").json()
    assert state["requests"]["GET /metrics"] == 2
    assert [s["id"] for s in state["sessions"]] == ["ctl"]
    assert state["sessions"][0]["status"] == "dead"

    now = c.post("/_fake/clock/advance", json={"seconds": RETENTION + 1}).json()["now"]
    assert now >= fake_service.clock.now() - 1
    assert c.get(sid_path("ctl")).status_code == 404
    assert c.post("/_fake/clock/advance", json={"seconds": -5}).status_code == 422


def test_control_api_traffic_start_and_stop(fake_service_factory: Callable[..., FakeService]) -> None:
    svc = fake_service_factory(clock=FakeClock(time_scale=60))
    with client_for(svc, TEST_TOKEN, validated=False) as c:
        r = c.post("/_fake/traffic", json={"action": "start", "rate_per_min": 120, "min_duration": 30,
                                           "max_duration": 60, "max_active": 3})  # fmt: skip
        assert r.json()["traffic"]["rate_per_min"] == 120
        wait_until(lambda: c.get("/session").json()["sessions"], timeout=10)
        assert c.post("/_fake/traffic", json={"action": "stop"}).json() == {"traffic": None}
        assert c.post("/_fake/traffic", json={"action": "start", "rate_per_min": -1}).status_code == 422
        assert c.post("/_fake/traffic", json={"action": "dance"}).status_code == 422


# --- traffic, streaming, shutdown ---------------------------------------------------------------


def test_traffic_generator_starts_and_ends_sessions_under_a_scaled_clock(
    fake_service_factory: Callable[..., FakeService],
) -> None:
    """At 60 virtual seconds per real second, traffic sessions start, gain players and end (some
    crashed) within real seconds; nobody calls the API for them to end."""
    svc = fake_service_factory(clock=FakeClock(time_scale=60), seed=3)
    svc.start_traffic(TEST_TOKEN, rate_per_min=120, min_duration=20, max_duration=40, crash_ratio=0.5, max_active=8)
    with client_for(svc, TEST_TOKEN) as c:

        def statuses() -> set[str]:
            return {s["status"] for s in c.get("/session", params={"all": "true"}).json()["sessions"]}

        wait_until(lambda: {"running", "exited", "dead"} <= statuses(), timeout=10)
        active = c.get("/session").json()["sessions"]
        assert 0 < len(active) <= 8
        assert all(json.loads(s["labels"]["tags"])["source"] == "traffic" for s in active)
        wait_until(lambda: any(s["playerCount"] > 1 for s in c.get("/session").json()["sessions"]), timeout=10)
    svc.stop_traffic(TEST_TOKEN)


def test_large_artifact_streams_with_bounded_memory(fake_service: FakeService) -> None:
    """A 150 MB incompressible file streams as a >100 MB chunked .tar.gz while Python memory
    (server and client in this process) grows by less than 30 MB; bytes match the ground truth."""
    size = 150 * 1024 * 1024
    sid = fake_service.add_session(TEST_TOKEN, files={"/srv/dump/big.bin": size})
    fake_service.end_session(TEST_TOKEN, sid)
    digest, total = hashlib.sha256(), 0
    tracemalloc.start()
    try:
        base, _ = tracemalloc.get_traced_memory()
        with (
            client_for(fake_service, TEST_TOKEN) as c,
            c.stream("GET", "/artifacts", params={"session": sid, "path": "/srv/dump/big.bin"}) as r,
        ):
            assert r.status_code == 200 and r.headers["transfer-encoding"] == "chunked"
            first = True
            for chunk in r.iter_bytes():
                if first:
                    assert chunk[:2] == b"\x1f\x8b"
                    first = False
                digest.update(chunk)
                total += len(chunk)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert total > 100 * 1024 * 1024
    assert peak - base < 30 * 1024 * 1024
    truth = hashlib.sha256()
    for chunk in fake_service.artifact_bytes(TEST_TOKEN, sid, "/srv/dump/big.bin"):
        truth.update(chunk)
    assert digest.hexdigest() == truth.hexdigest()


def test_stop_ends_open_connections_and_joins_threads() -> None:
    """stop() returns promptly with an idle keep-alive connection and an open log follower, and
    leaves no service thread behind."""
    svc = FakeService().start()
    sid = svc.add_session(TEST_TOKEN)
    with client_for(svc, TEST_TOKEN) as c:
        assert c.get("/session").status_code == 200  # leaves an idle keep-alive connection
        with c.stream("GET", "/logs", params={"id": sid, "follow": "true"}) as r:
            assert r.status_code == 200
            start = time.monotonic()
            svc.stop()
            assert time.monotonic() - start < 3
            with pytest.raises(httpx.TransportError):
                for _ in r.iter_bytes():
                    pass
    leftovers = [t.name for t in threading.enumerate() if t.name.startswith("fake-")]
    assert leftovers == []


# --- the CLI entry --------------------------------------------------------------------------------


def test_cli_option_parsing() -> None:
    assert parse_listen("127.0.0.1:0") == ("127.0.0.1", 0)
    assert parse_listen("[::1]:8080") == ("::1", 8080)
    assert parse_duration("4h") == 14400 and parse_duration("1h30m") == 5400 and parse_duration("90s") == 90
    assert parse_duration("2.5") == 2.5
    assert parse_capacity("eu-west-1=3") == ("eu-west-1", 3)
    assert parse_quirk("query_log_shape=legacy") == ("query_log_shape", "legacy")
    assert parse_quirk("port-as-string") == ("port_as_string", True)
    opts = options_from_cli(
        listen="127.0.0.1:0", tokens=["a", "b"], retention="10m", quirks=["port_as_string"],
        faults=["GET /session:status=502,count=1"], capacity=["eu-west-1=2"], traffic=True,
    )  # fmt: skip
    assert opts.tokens == ("a", "b") and opts.retention == 600 and opts.quirks == {"port_as_string": True}
    assert opts.faults == (("GET /session", FaultSpec(status=502, count=1)),)
    for bad in (
        {"listen": "localhost"}, {"listen": "h:99999"}, {"retention": "soon"}, {"quirks": ["nope"]},
        {"quirks": ["query_log_shape"]}, {"faults": ["x"]}, {"capacity": ["eu-west-1"]}, {"time_scale": -1},
    ):  # fmt: skip
        with pytest.raises(FakeConfigError):
            options_from_cli(**bad)  # type: ignore[arg-type]


def test_serve_forever_prints_url_and_tokens_and_stops_cleanly() -> None:
    out = io.StringIO()
    stop = threading.Event()
    options = FakeServiceOptions(port=0, tokens=("cli-token",), quirks={"float_created": True},
                                 faults=(("GET /metrics", FaultSpec(status=500, count=1)),))  # fmt: skip
    runner = threading.Thread(target=serve_forever, args=(options,), kwargs={"out": out, "stop": stop})
    runner.start()
    try:
        prefix = "fake session hosting service: "

        def printed_url() -> str | None:
            return next((ln[len(prefix) :] for ln in out.getvalue().splitlines() if ln.startswith(prefix)), None)

        url = str(wait_until(printed_url, timeout=10))
        assert "token: cli-token" in out.getvalue()
        headers = {"Authorization": "Bearer cli-token"}
        assert httpx.get(url + "/metrics", headers=headers).status_code == 500
        assert httpx.get(url + "/metrics", headers=headers).text == "session_count 0\n"
    finally:
        stop.set()
        runner.join(10)
    assert not runner.is_alive()
    assert out.getvalue().rstrip().endswith("stopped")


def test_openapi_checker_is_not_vacuous() -> None:
    """The validator passes a correct body, rejects a wrong one and an undocumented status, and
    skips paths the OpenAPI does not describe."""
    ok = json.dumps({"sessions": []}).encode()
    assert validate_response("GET", "/session", 200, {"Content-Type": "application/json"}, ok) is True
    with pytest.raises(ContractViolation):
        validate_response("GET", "/session", 200, {"Content-Type": "application/json"}, b'{"sessions": 1}')
    with pytest.raises(ContractViolation):
        validate_response("GET", "/session", 418, {"Content-Type": "application/json"}, ok)
    assert validate_response("GET", "/metrics", 200, {"Content-Type": "text/plain"}, b"x 1\n") is False
    assert validate_response("GET", "/session", 502, {"Content-Type": "text/html"}, b"<html>") is False


def test_injected_raw_list_entries_are_appended_to_every_session_list_of_that_org_until_cleared(
    fake_service_factory: Callable[..., FakeService],
) -> None:
    """POST /_fake/list-entries: values no real session produces (1e30, lone surrogates) reach the client as sent."""
    svc = fake_service_factory(["org-a", "org-b"])
    svc.add_session("org-a", id="real")
    poisoned = [{"id": "bad\ud800", "playerCount": 1e30}, "not an object"]
    with (
        httpx.Client(base_url=svc.base_url, headers={"Authorization": "Bearer org-a"}) as a,
        httpx.Client(base_url=svc.base_url, headers={"Authorization": "Bearer org-b"}) as b,
    ):
        # json.dumps escapes the lone surrogate as the upstream would send it (httpx's json= cannot encode it).
        injected = a.post("/_fake/list-entries", content=json.dumps({"entries": poisoned}))
        assert injected.json() == {"injected": 2}
        raw = a.get("/session").content
        assert b'"bad\\ud800"' in raw and b"1e+30" in raw
        assert [e if isinstance(e, str) else e["id"] for e in json.loads(raw)["sessions"]] == [
            "real",
            "bad\ud800",
            "not an object",
        ]
        # Appended whatever the filter: they stand in for entries the upstream got wrong.
        assert len(a.get("/session", params={"location": "nowhere"}).json()["sessions"]) == 2
        assert b.get("/session").json()["sessions"] == []  # another organisation sees none
        assert a.post("/_fake/list-entries", json={"entries": {}}).status_code == 422
        assert a.delete("/_fake/list-entries").json() == {"injected": 0}
        assert [e["id"] for e in a.get("/session").json()["sessions"]] == ["real"]

    svc.inject_list_entries("org-b", [{"id": ""}])  # the same through the Python API
    with httpx.Client(base_url=svc.base_url, headers={"Authorization": "Bearer org-b"}) as b:
        assert b.get("/session").json()["sessions"] == [{"id": ""}]
        svc.clear_list_entries("org-b")
        assert b.get("/session").json()["sessions"] == []


# --- oracle (ground truth for chaos runs) ---------------------------------------------------------


def test_the_oracle_records_each_end_and_the_sha256_of_every_body_served_whole(
    fake_service: FakeService, raw_client: httpx.Client
) -> None:
    """Ends are recorded with their status; a log or artifact body served whole is recorded with
    the sha256 of exactly the bytes the client received."""
    sid = fake_service.add_session(TEST_TOKEN, id="oracle-1", crashed=True)
    assert fake_service.oracle.ended() == []
    fake_service.end_session(TEST_TOKEN, sid)
    (ended,) = fake_service.oracle.ended()
    assert (ended.session_id, ended.status, ended.org) == (sid, "dead", "org-1")
    assert ended.ended_at >= ended.created

    art = raw_client.get("/artifacts", params={"session": sid, "path": "/srv/replays"})
    log = raw_client.get("/query/log", params={"matchKey": sid})
    follow = raw_client.get("/logs", params={"id": sid, "follow": "false"})
    assert art.status_code == log.status_code == follow.status_code == 200
    # The server records a body after its last byte went out: the client may have it a moment before.
    wait_until(lambda: len(fake_service.oracle.served()) == 3, timeout=10)
    org = ended.org
    assert fake_service.oracle.complete_digests(org, sid, "/srv/replays") == {hashlib.sha256(art.content).hexdigest()}
    assert fake_service.oracle.complete_digests(org, sid, "logs") == {
        hashlib.sha256(log.content).hexdigest(),
        hashlib.sha256(follow.content).hexdigest(),  # NDJSON: the client asked for JSON
    }
    assert {(s.what, s.size, s.complete) for s in fake_service.oracle.served()} == {
        ("/srv/replays", len(art.content), True),
        ("logs", len(log.content), True),
        ("logs", len(follow.content), True),
    }
    assert raw_client.get("/session").status_code == 200
    assert len(fake_service.oracle.served()) == 3  # lists and describes are not bodies of a session


def test_a_body_cut_short_by_a_fault_is_recorded_incomplete_and_each_fired_fault_is_counted(
    fake_service: FakeService, raw_client: httpx.Client
) -> None:
    sid = fake_service.add_session(TEST_TOKEN, id="oracle-2")
    fake_service.end_session(TEST_TOKEN, sid)
    fake_service.set_fault("GET /artifacts", kind="truncate", count=1)
    fake_service.set_fault("GET /query/log", status=503, count=2)
    with pytest.raises(httpx.HTTPError):
        raw_client.get("/artifacts", params={"session": sid, "path": "/srv/replays"})
    whole = raw_client.get("/artifacts", params={"session": sid, "path": "/srv/replays"})
    assert [raw_client.get("/query/log", params={"matchKey": sid}).status_code for _ in range(3)] == [503, 503, 200]
    wait_until(lambda: len(fake_service.oracle.served()) == 3, timeout=10)  # recorded after the last byte went out
    cut, full, log = sorted(fake_service.oracle.served(), key=lambda s: (s.what != "/srv/replays", s.complete))
    assert (cut.what, cut.complete) == ("/srv/replays", False)
    assert (full.complete, full.sha256) == (True, hashlib.sha256(whole.content).hexdigest())
    assert (log.what, log.complete) == ("logs", True)
    assert fake_service.oracle.complete_digests("org-1", sid, "/srv/replays") == {full.sha256}
    assert fake_service.faults_fired() == {"truncate": 1, "503": 2}
    assert fake_service.faults_fired("GET /query/log") == {"503": 2}


def test_a_client_resetting_mid_request_is_survived_without_a_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    """A daemon killed mid-request resets its connections: the fake serves on and prints nothing."""
    with FakeService((TEST_TOKEN,)) as service:
        host, port = service.base_url.removeprefix("http://").rsplit(":", 1)
        sock = socket.create_connection((host, int(port)))
        sock.sendall(b"GET /session HTTP/1.1\r\nHost: x\r\n")  # a request cut short, then an RST
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()
        response = httpx.get(f"{service.base_url}/session", headers={"Authorization": f"Bearer {TEST_TOKEN}"})
        assert response.status_code == 200
    # Stopping joins every handler thread: the reset one has run into its ECONNRESET by now.
    assert "Traceback" not in capsys.readouterr().err
