"""The API client against the fake service over loopback: every endpoint, every quirk, every fault.

Every response the fake sends here passes through the OpenAPI validating hook (tests/openapi_check.py).
"""

from __future__ import annotations

import io
import logging
import tarfile
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client import CollectorRegistry

from archiver import retry
from archiver.errors import (
    ApiDecodeError,
    ApiStatusError,
    ApiTransportError,
    ConflictError,
    NotFoundError,
    RateLimitedError,
    ServerError,
    UnauthorizedError,
    UnprocessableError,
)
from archiver.fake import FakeService
from archiver.metrics.selfmetrics import SelfMetrics
from archiver.retry import RetryPolicy
from archiver.upstream.api import SessionFilter, SessionHostClient, Token
from tests.fixtures_fake import TEST_TOKEN, openapi_hooks
from tests.support import sha256_of

FAST = RetryPolicy(attempts=4, max_elapsed=5.0, initial_wait=0.0, max_wait=0.0, jitter=0.0)


def make_client(fake: FakeService, token: str = TEST_TOKEN, *, validate: bool = True) -> SessionHostClient:
    """A client on the fake; with `validate`, every response is checked against the OpenAPI. Quirk
    switches make the fake answer the way the real service deviates from its OpenAPI, so tests of
    quirks turn validation off."""
    hooks = openapi_hooks() if validate else {}
    http = httpx.Client(base_url=fake.base_url, event_hooks=hooks, timeout=10.0)
    waits: list[float] = []
    client = SessionHostClient(http, Token(token), policy=FAST, sleep=waits.append)
    client.waits = waits  # type: ignore[attr-defined]
    return client


@pytest.fixture
def client(fake_service: FakeService) -> Iterator[SessionHostClient]:
    with make_client(fake_service) as c:
        yield c


@pytest.fixture
def lenient_client(fake_service: FakeService) -> Iterator[SessionHostClient]:
    with make_client(fake_service, validate=False) as c:
        yield c


def test_full_lifecycle_through_every_session_endpoint(client: SessionHostClient, fake_service: FakeService) -> None:
    created = client.create_session("eu-west-1", "demo-game", session_id="match-1", labels={"mode": "duel"})
    assert created.id == "match-1" and created.ports

    listed = client.list_sessions().sessions
    assert [s.id for s in listed] == ["match-1"]
    assert listed[0].tag == "1.1.0"  # the highest-priority tag when none was asked for
    assert listed[0].labels == {"mode": "duel"}

    joined = client.join_players("match-1", ["p1", "p2"])
    assert (joined.count, set(joined.players)) == (2, {"p1", "p2"})
    assert client.join_players("match-1", ["p2"]).count == 2  # idempotent
    assert client.leave_players("match-1", ["p1"]).count == 1
    described = client.describe_session("match-1")
    assert described.players == ("p2",) and described.status == "running"

    with pytest.raises(NotFoundError):  # artifacts are refused while the session is active (404 per the OpenAPI)
        client.open_artifact("match-1", "/srv/replays/match.replay").close()

    client.stop_session("match-1")
    with pytest.raises(ConflictError):
        client.stop_session("match-1")
    assert client.list_sessions().sessions == []
    assert client.describe_session("match-1").terminal

    with client.open_artifact("match-1", "/srv/replays/match.replay") as download:
        served = sha256_of(download.iter_bytes())
    assert served == sha256_of(fake_service.artifact_bytes(TEST_TOKEN, "match-1", "/srv/replays/match.replay"))

    fake_service.advance(4 * 3600 + 1)
    with pytest.raises(NotFoundError):
        client.open_artifact("match-1", "/srv/replays/match.replay").close()
    with pytest.raises(NotFoundError):
        client.describe_session("match-1")


def test_artifact_is_a_real_tar_gz_of_the_requested_file(client: SessionHostClient, fake_service: FakeService) -> None:
    sid = fake_service.add_session(TEST_TOKEN, crashed=True)
    fake_service.end_session(TEST_TOKEN, sid)
    with client.open_artifact(sid, "/srv/crash") as download:
        body = b"".join(download.iter_bytes())
    assert body[:2] == b"\x1f\x8b"
    with tarfile.open(fileobj=io.BytesIO(body), mode="r:gz") as tar:
        assert any(name.endswith("core.txt") for name in tar.getnames())


def test_logs_and_query_log_stream_every_line(client: SessionHostClient, fake_service: FakeService) -> None:
    sid = fake_service.add_session(TEST_TOKEN)
    fake_service.end_session(TEST_TOKEN, sid)
    truth = [line.line if hasattr(line, "line") else line[1] for line in fake_service.log_lines(TEST_TOKEN, sid)]
    with client.open_logs(sid) as download:
        text = b"".join(download.iter_bytes()).decode()
    assert text.splitlines() == truth
    with client.open_query_log(sid) as download:
        assert b"".join(download.iter_bytes()).decode().splitlines() == truth


def test_catalogue_endpoints(client: SessionHostClient) -> None:
    assert {loc.id for loc in client.available_locations("demo-game")} == {
        "eu-west-1",
        "us-east-1",
        "ap-southeast-1",
    }
    assert client.tag_exists("eu-west-1", "demo-game", "1.0.0") is True
    assert client.tag_exists("eu-west-1", "demo-game", "9.9.9") is False
    with pytest.raises(NotFoundError):
        client.available_locations("no-such-image")


def test_list_filters(client: SessionHostClient, fake_service: FakeService) -> None:
    fake_service.add_session(TEST_TOKEN, id="a", labels={"tournament": "spring"}, location="us-east-1")
    fake_service.add_session(TEST_TOKEN, id="b", labels={"tournament": "autumn"}, players=["p1", "p2", "p3"])
    assert [s.id for s in client.list_sessions(SessionFilter(labels={"tournament": "spring"})).sessions] == ["a"]
    assert [s.id for s in client.list_sessions(SessionFilter(location="eu-west-1")).sessions] == ["b"]
    assert [s.id for s in client.list_sessions(SessionFilter(player_count_gt=1)).sessions] == ["b"]


def test_metrics_text(client: SessionHostClient, fake_service: FakeService) -> None:
    fake_service.add_session(TEST_TOKEN)
    assert "session_count 1" in client.metrics_text()


def test_token_isolation_between_organisations(fake_service_factory: object) -> None:
    with (
        FakeService(["org-a", "org-b"]) as fake,
        make_client(fake, "org-a") as a,
        make_client(fake, "org-b") as b,
    ):
        sid = fake.add_session("org-a")
        assert [s.id for s in a.list_sessions().sessions] == [sid]
        assert b.list_sessions().sessions == []
        with pytest.raises(NotFoundError):
            b.describe_session(sid)


def test_unknown_token_is_unauthorized_and_never_echoed(fake_service: FakeService) -> None:
    with make_client(fake_service, "wrong-secret-token") as client, pytest.raises(UnauthorizedError) as info:
        client.list_sessions()
    assert info.value.code == "UNAUTHORIZED"
    assert "wrong-secret-token" not in str(info.value)
    assert "wrong-secret-token" not in repr(client.__dict__)


def test_bad_request_bodies_answer_422_with_violations(client: SessionHostClient) -> None:
    with pytest.raises(UnprocessableError) as info:
        client.create_session("", "demo-game")
    assert info.value.violations and info.value.status == 422
    with pytest.raises(NotFoundError):
        client.create_session("mars-1", "demo-game")


@pytest.mark.parametrize(
    "quirk",
    [
        {"port_as_string": True},
        {"port_wrapped": True},
        {"port_as_string": True, "port_wrapped": True},
        {"labels_as_string": True},
        {"labels_wrapped": True},
        {"labels_as_string": True, "labels_wrapped": True},
        {"extra_fields": True},
    ],
)
def test_every_quirk_parses_to_the_same_model(
    lenient_client: SessionHostClient, fake_service: FakeService, quirk: dict[str, bool]
) -> None:
    client = lenient_client
    fake_service.add_session(TEST_TOKEN, id="q", labels={"mode": "duel"}, env={"SECRET": "hunter2"})
    reference = client.list_sessions().sessions[0]
    described = client.describe_session("q")
    fake_service.set_quirks(**quirk)
    assert client.list_sessions().sessions[0] == reference
    assert client.describe_session("q") == described
    assert "hunter2" not in repr(reference)


def test_quirks_that_drop_fields_and_ids(lenient_client: SessionHostClient, fake_service: FakeService) -> None:
    client = lenient_client
    fake_service.set_quirks(
        omit_optional_list_fields=True, omit_create_id=True, delete_returns_200=True, float_created=True
    )
    created = client.create_session("eu-west-1", "demo-game", session_id="chosen")
    assert created.id == "chosen"
    [entry] = client.list_sessions().sessions
    assert (entry.tag, entry.status, entry.player_count) == ("", "unknown", None)
    assert isinstance(entry.created_ms, float)
    client.stop_session("chosen")
    fake_service.set_quirks(omit_optional_list_fields=False, player_count_null=True)
    fake_service.add_session(TEST_TOKEN, id="n")
    assert client.list_sessions().sessions[0].player_count is None


@pytest.mark.parametrize("status", [500, 502, 503, 420, 429])
def test_transient_statuses_are_retried_and_counted(
    lenient_client: SessionHostClient, fake_service: FakeService, status: int
) -> None:
    client = lenient_client  # injected faults answer outside the OpenAPI on purpose
    fake_service.add_session(TEST_TOKEN, id="r")
    fake_service.set_fault("GET /session", status=status, count=2, retry_after=1 if status in (420, 429) else None)
    assert [s.id for s in client.list_sessions().sessions] == ["r"]
    assert client.retries["GET /session"] == 2
    assert fake_service.request_count("GET /session") == 3
    if status in (420, 429):
        assert min(client.waits) >= 1.0  # type: ignore[attr-defined]  # Retry-After honoured


@pytest.mark.parametrize(("status", "error"), [(500, ServerError), (502, ServerError), (429, RateLimitedError)])
def test_persistent_failures_surface_as_typed_errors_after_bounded_attempts(
    client: SessionHostClient, fake_service: FakeService, status: int, error: type[ApiStatusError]
) -> None:
    fake_service.set_fault("GET /session", status=status, count=100)
    with pytest.raises(error) as info:
        client.list_sessions()
    assert fake_service.request_count("GET /session") == FAST.attempts
    if status == 502:
        assert "502" in str(info.value) and "html" in info.value.body_excerpt.lower()


@pytest.mark.parametrize("kind", ["reset", "truncate"])
def test_broken_connections_are_retried(client: SessionHostClient, fake_service: FakeService, kind: str) -> None:
    fake_service.add_session(TEST_TOKEN, id="c")
    fake_service.set_fault("GET /session", kind=kind, count=1)
    assert [s.id for s in client.list_sessions().sessions] == ["c"]
    assert client.retries["GET /session"] == 1


def test_persistent_resets_become_a_transport_error(client: SessionHostClient, fake_service: FakeService) -> None:
    fake_service.set_fault("GET /session", kind="reset", count=100)
    with pytest.raises(ApiTransportError):
        client.list_sessions()


@pytest.mark.parametrize("kind", ["garbage", "wrong_types"])
def test_garbage_bodies_are_typed_decode_errors_with_an_excerpt(
    lenient_client: SessionHostClient, fake_service: FakeService, kind: str
) -> None:
    client = lenient_client  # injected faults answer outside the OpenAPI on purpose
    fake_service.add_session(TEST_TOKEN)
    fake_service.set_fault("GET /session", kind=kind, count=1)
    with pytest.raises(ApiDecodeError) as info:
        client.list_sessions()
    assert info.value.excerpt
    assert fake_service.request_count("GET /session") == 1  # not retried: the answer is final


def test_non_transient_errors_are_not_retried(client: SessionHostClient, fake_service: FakeService) -> None:
    with pytest.raises(NotFoundError):
        client.describe_session("nope")
    assert fake_service.request_count("GET /session/{id}") == 1
    assert client.retries["GET /session/{id}"] == 0


def test_hostile_session_ids_stay_in_their_path_segment(client: SessionHostClient, fake_service: FakeService) -> None:
    for sid in ["../../etc/passwd", "a/b", "sp ace?x=1#frag", "ünï", "%2F", ".", ".."]:
        fake_service.add_session(TEST_TOKEN, id=sid)
        assert client.describe_session(sid).id == sid


def test_token_is_never_in_reprs() -> None:
    token = Token("super-secret-value")
    assert "super-secret" not in repr(token) and "super-secret" not in str(token)
    with pytest.raises(ValueError):
        Token("  ")


def test_every_operation_a_retry_policy_names_has_its_retries_series_from_the_start() -> None:
    """archiver_retries_total's label values come from retry.py's policies, each pre-created at 0."""
    policies = [value for value in vars(retry).values() if isinstance(value, RetryPolicy)]
    named = {policy.operation for policy in policies} | {retry.upstream_poll(10.0).operation}
    assert {"upstream_request", "upstream_poll", "fetch_item", "follow_logs", "store"} <= named
    registry = CollectorRegistry()
    SelfMetrics(registry)
    for operation in named:
        assert registry.get_sample_value("archiver_retries_total", {"operation": operation}) == 0, operation


def test_retries_are_counted_by_operation_and_logged_without_the_token(
    fake_service: FakeService, caplog: pytest.LogCaptureFixture
) -> None:
    """Two injected 503s: archiver_retries_total{operation="upstream_request"} says 2, and each retry
    has its log line naming the operation and the attempt, with neither the token nor the env."""
    registry = CollectorRegistry()
    metrics = SelfMetrics(registry)
    http = httpx.Client(base_url=fake_service.base_url, timeout=10.0)
    secret = "env-secret-value-42"
    fake_service.add_session(TEST_TOKEN, id="s", env={"MATCH_SECRET": secret})
    fake_service.set_fault("GET /session/{id}", status=503, count=2)
    client = SessionHostClient(
        http, Token(TEST_TOKEN), policy=FAST, sleep=lambda _: None, retry_observer=metrics.retried
    )
    with client, caplog.at_level(logging.WARNING, logger="archiver.retry"):
        assert client.describe_session("s").id == "s"
    value = registry.get_sample_value("archiver_retries_total", {"operation": "upstream_request"})
    assert value == 2
    assert registry.get_sample_value("archiver_retries_total", {"operation": "upstream_poll"}) == 0
    lines = [r.getMessage() for r in caplog.records if r.name == "archiver.retry"]
    assert len(lines) == 2
    assert all(line.startswith("retrying upstream_request (attempt ") and "HTTP 503" in line for line in lines)
    assert not any(TEST_TOKEN in line or secret in line for line in lines)
