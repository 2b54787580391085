"""Tests of the daemon's HTTP server on real 127.0.0.1 sockets: negotiation, gzip, probes, TLS, auth."""

from __future__ import annotations

import base64
import gzip
import json
import ssl
from collections.abc import Callable, Iterator
from pathlib import Path

import bcrypt
import httpx
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.openmetrics.parser import text_string_to_metric_families as om_parse
from prometheus_client.parser import text_string_to_metric_families as text_parse

from archiver.errors import ConfigError
from archiver.exporter.exposition import SnapshotRenderer
from archiver.exporter.metricsserver import MetricsServer, accepts_gzip, wants_openmetrics
from archiver.exporter.snapshot import Snapshot
from archiver.metrics.selfmetrics import SelfMetrics
from archiver.upstream.metrics import parse_upstream_metrics
from archiver.upstream.models import parse_session
from archiver.web.webconfig import load_web_config
from tests.fixtures_http import TLSFiles

PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)


def make_snapshot(count: int = 50) -> Snapshot:
    sessions = [
        parse_session(
            {
                "id": f"session-{i}",
                "image": "demo-game",
                "tag": "1.1.0",
                "location": "eu-west-1",
                "host": "203.0.113.1",
                "created": 1_700_000_000_000 + i,
                "status": "running",
                "playerCount": i % 4,
                "labels": {"env": json.dumps({"SECRET": "hunter2"})},
            }
        )
        for i in range(count)
    ]
    renderer = SnapshotRenderer(max_sessions=1000, label_allowlist=())
    return renderer.render(sessions, parse_upstream_metrics(b"session_count 50\n"), now=1.0)


class Probe:
    """A health/readiness callable whose answer a test can flip."""

    def __init__(self, ok: bool, reason: str) -> None:
        self.answer = (ok, reason)

    def __call__(self) -> tuple[bool, str]:
        return self.answer


@pytest.fixture
def serve() -> Iterator[Callable[..., MetricsServer]]:
    """Start MetricsServers on 127.0.0.1:0 and stop them after the test."""
    servers: list[MetricsServer] = []

    def start(**kwargs: object) -> MetricsServer:
        options: dict[str, object] = {
            "snapshot_source": lambda: None,
            "self_metrics": SelfMetrics(CollectorRegistry()),
            "health": Probe(True, "loops alive"),
            "ready": Probe(False, "first poll not done"),
            "web_config": None,
        }
        options.update(kwargs)
        server = MetricsServer(("127.0.0.1", 0), **options)  # type: ignore[arg-type]
        server.start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


def get_raw(client: httpx.Client, url: str, headers: dict[str, str]) -> tuple[httpx.Response, bytes]:
    """GET without letting httpx decode the body (to see exactly what went over the wire)."""
    with client.stream("GET", url, headers=headers) as response:
        return response, b"".join(response.iter_raw())


def test_gzip_and_identity_bodies_carry_the_same_text(serve: Callable[..., MetricsServer]) -> None:
    snapshot = make_snapshot()
    server = serve(snapshot_source=lambda: snapshot)
    with httpx.Client() as client:
        plain, plain_body = get_raw(client, server.url + "/metrics", {"Accept-Encoding": "identity"})
        packed, packed_body = get_raw(client, server.url + "/metrics", {"Accept-Encoding": "gzip"})
        decoded_by_httpx = client.get(server.url + "/metrics", headers={"Accept-Encoding": "gzip"}).content
    assert plain.status_code == packed.status_code == 200
    assert plain.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert "content-encoding" not in plain.headers
    assert packed.headers["content-encoding"] == "gzip"
    assert int(packed.headers["content-length"]) == len(packed_body) < len(plain_body)
    assert gzip.decompress(packed_body) == plain_body == decoded_by_httpx
    names = {family.name for family in text_parse(plain_body.decode())}
    assert {"sessionhost_session_info", "sessionhost_upstream_session_count", "archiver_build_info"} <= names
    assert b"hunter2" not in plain_body


def test_openmetrics_is_served_when_prometheus_asks_for_it(serve: Callable[..., MetricsServer]) -> None:
    snapshot = make_snapshot()
    server = serve(snapshot_source=lambda: snapshot)
    with httpx.Client() as client:
        for encoding in ("identity", "gzip"):
            response = client.get(
                server.url + "/metrics", headers={"Accept": PROMETHEUS_ACCEPT, "Accept-Encoding": encoding}
            )
            assert response.headers["content-type"] == "application/openmetrics-text; version=1.0.0; charset=utf-8"
            assert response.content.endswith(b"# EOF\n")
            assert response.content.count(b"# EOF") == 1
            families = {family.name: family for family in om_parse(response.text)}
            assert families["sessionhost_upstream_session_count"].type == "unknown"
            assert families["archiver_sessions_exported"].samples[0].value == 50


def test_before_the_first_poll_metrics_serves_the_self_metrics_alone(
    serve: Callable[..., MetricsServer],
) -> None:
    server = serve()
    with httpx.Client() as client:
        text = client.get(server.url + "/metrics")
        om = client.get(server.url + "/metrics", headers={"Accept": PROMETHEUS_ACCEPT})
    assert text.status_code == om.status_code == 200
    assert {f.name for f in text_parse(text.text)} >= {"archiver_build_info"}
    assert "sessionhost_" not in text.text
    assert om.text.endswith("# EOF\n")
    list(om_parse(om.text))  # valid OpenMetrics


def test_head_answers_the_headers_of_get_without_a_body(serve: Callable[..., MetricsServer]) -> None:
    snapshot = make_snapshot()
    server = serve(snapshot_source=lambda: snapshot)
    with httpx.Client() as client:
        got = client.get(server.url + "/metrics", headers={"Accept-Encoding": "identity"})
        head = client.head(server.url + "/metrics", headers={"Accept-Encoding": "identity"})
        # The connection is still usable after a HEAD (no stray body bytes on a keep-alive stream).
        again = client.get(server.url + "/healthz")
    assert head.status_code == 200
    assert head.content == b""
    assert head.headers["content-length"] == got.headers["content-length"]
    assert again.status_code == 200


def test_probes_landing_page_and_unknown_paths(serve: Callable[..., MetricsServer]) -> None:
    health, ready = Probe(True, "loops alive"), Probe(False, "first poll not done")
    server = serve(health=health, ready=ready)
    with httpx.Client() as client:
        assert (
            client.get(server.url + "/healthz").status_code,
            client.get(server.url + "/healthz").text,
        ) == (
            200,
            "loops alive\n",
        )
        not_ready = client.get(server.url + "/readyz")
        assert (not_ready.status_code, not_ready.text) == (503, "first poll not done\n")
        ready.answer = (True, "ready")
        health.answer = (False, "poll loop stalled for 95 s")
        assert client.get(server.url + "/readyz").status_code == 200
        stalled = client.get(server.url + "/healthz")
        assert (stalled.status_code, stalled.text) == (503, "poll loop stalled for 95 s\n")
        landing = client.get(server.url + "/")
        assert landing.status_code == 200 and landing.headers["content-type"].startswith("text/html")
        assert 'href="/metrics"' in landing.text
        assert client.get(server.url + "/nope").status_code == 404
        assert client.get(server.url + "/metrics/extra").status_code == 404
        assert client.get(server.url + "/metrics?debug=1").status_code == 200
        refused = client.post(server.url + "/metrics", content=b"x")
        assert (refused.status_code, refused.headers["allow"]) == (405, "GET, HEAD")


def test_a_failing_snapshot_source_answers_500_and_is_counted(serve: Callable[..., MetricsServer]) -> None:
    def broken() -> Snapshot | None:
        raise RuntimeError("bug")

    metrics = SelfMetrics(CollectorRegistry())
    server = serve(snapshot_source=broken, self_metrics=metrics)
    with httpx.Client() as client:
        failed = client.get(server.url + "/metrics")
        assert failed.status_code == 500
        assert failed.headers["connection"] == "close"  # so the client does not reuse a closing connection
        assert client.get(server.url + "/healthz").status_code == 200  # the server lives on
    assert b'archiver_errors_total{where="http"} 1.0' in metrics.render(False)


def test_tls_from_a_web_config_file(
    serve: Callable[..., MetricsServer], self_signed_cert: TLSFiles, tmp_path: Path
) -> None:
    config_path = tmp_path / "web.yml"
    config_path.write_text(
        f"tls_server_config:\n  cert_file: {self_signed_cert.cert}\n  key_file: {self_signed_cert.key}\n"
    )
    snapshot = make_snapshot()
    server = serve(snapshot_source=lambda: snapshot, web_config=load_web_config(config_path))
    assert server.url.startswith("https://127.0.0.1:")
    trust = ssl.create_default_context(cafile=str(self_signed_cert.cert))
    with httpx.Client(verify=trust) as client:
        response = client.get(server.url + "/metrics", headers={"Accept-Encoding": "gzip"})
    assert response.status_code == 200 and b"sessionhost_session_info" in response.content
    # A plain-HTTP client gets no answer, and the server keeps serving TLS clients afterwards.
    with httpx.Client() as plain, pytest.raises(httpx.HTTPError):
        plain.get(server.url.replace("https://", "http://") + "/healthz")
    with httpx.Client(verify=trust) as client:
        assert client.get(server.url + "/healthz").status_code == 200


def test_basic_auth_from_a_web_config_file(serve: Callable[..., MetricsServer], tmp_path: Path) -> None:
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(4)).decode()
    config_path = tmp_path / "web.yml"
    config_path.write_text(f"basic_auth_users:\n  prometheus: '{hashed}'\n")
    server = serve(web_config=load_web_config(config_path))
    with httpx.Client() as client:
        anonymous = client.get(server.url + "/metrics")
        assert anonymous.status_code == 401
        assert anonymous.headers["www-authenticate"].startswith("Basic ")
        assert client.get(server.url + "/metrics", auth=("prometheus", "wrong")).status_code == 401
        assert client.get(server.url + "/metrics", auth=("prometheus", "s3cret")).status_code == 200
        raw = "Basic " + base64.b64encode(b"prometheus:s3cret").decode()
        assert client.get(server.url + "/healthz", headers={"Authorization": raw}).status_code == 200


def test_a_port_in_use_is_a_config_error(serve: Callable[..., MetricsServer]) -> None:
    server = serve()
    with pytest.raises(ConfigError, match=r"cannot listen on 127\.0\.0\.1"):
        MetricsServer(
            server.address,
            snapshot_source=lambda: None,
            self_metrics=SelfMetrics(CollectorRegistry()),
            health=Probe(True, ""),
            ready=Probe(True, ""),
        )


def test_stop_closes_the_listening_socket(serve: Callable[..., MetricsServer]) -> None:
    server = serve()
    url = server.url
    server.stop()
    with httpx.Client() as client, pytest.raises(httpx.ConnectError):
        client.get(url + "/healthz")


@pytest.mark.parametrize(
    ("accept", "expected"),
    [
        (None, False),
        ("*/*", False),
        ("text/plain", False),
        (PROMETHEUS_ACCEPT, True),
        (
            "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.6,"
            "application/openmetrics-text;version=0.0.1;q=0.5,text/plain;version=1.0.0;escaping=allow-utf-8;q=0.4,"
            "text/plain;version=0.0.4;q=0.3,*/*;q=0.2",
            True,
        ),
        ("application/openmetrics-text;q=0.2,text/plain", False),
        ("application/openmetrics-text;q=0", False),
        ("Application/OpenMetrics-Text", True),
    ],
)
def test_accept_negotiation(accept: str | None, expected: bool) -> None:
    assert wants_openmetrics(accept) is expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, False),
        ("gzip", True),
        ("gzip, deflate, br", True),
        ("identity", False),
        ("gzip;q=0", False),
        ("*", True),
        ("*;q=0", False),
        ("gzip;q=0, *", False),
        ("br;q=1.0, gzip;q=0.8", True),
    ],
)
def test_accept_encoding_negotiation(value: str | None, expected: bool) -> None:
    assert accepts_gzip(value) is expected


def test_a_failure_on_a_reused_connection_still_answers_500(serve: Callable[..., MetricsServer]) -> None:
    """The handler serves every request of a keep-alive connection: an earlier good response must
    not make a later failing request lose its 500."""
    snapshot = make_snapshot()
    calls = iter([snapshot])

    def works_once() -> Snapshot | None:
        return next(calls)  # StopIteration (a bug stand-in) from the second call on

    server = serve(snapshot_source=works_once, self_metrics=SelfMetrics(CollectorRegistry()))
    with httpx.Client() as client:
        assert client.get(server.url + "/metrics").status_code == 200
        assert client.get(server.url + "/metrics").status_code == 500
