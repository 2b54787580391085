"""Tests of the pre-rendered exposition: format round-trips, escaping, caps, caching, gzip, secrets."""

from __future__ import annotations

import dataclasses
import gzip
import json
import subprocess
import zlib
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.openmetrics.exposition import generate_latest as om_generate_latest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as om_parse
from prometheus_client.parser import text_string_to_metric_families as text_parse
from prometheus_client.registry import Collector

from archiver.errors import ConfigError, PayloadError
from archiver.exporter.exposition import SnapshotRenderer
from archiver.exporter.families import escape_label_value, label_names_for
from archiver.exporter.snapshot import Snapshot, gzip_compress, scrape_parts
from archiver.metrics.selfmetrics import SelfMetrics
from archiver.upstream.metrics import MetricFamily, parse_upstream_metrics
from archiver.upstream.models import Session, parse_session
from tests.support import raw_session

UPSTREAM_BODY = """\
# HELP session_count Active sessions.
session_count 3
# HELP starts_total Sessions started.
# TYPE starts_total counter
starts_total{location="eu-west-1"} 7
# TYPE wait_seconds histogram
wait_seconds_bucket{le="1"} 1
wait_seconds_bucket{le="+Inf"} 2
wait_seconds_sum 3.5
wait_seconds_count 2
"""

HOSTILE = [
    'quote " inside',
    "back\\slash \\n not a newline",
    "new\nline",
    "unicode ✓ ünï 日本 🎮",
    "x" * 1024,
    '\\"\n\\',
    "",
]


def session(sid: str, **overrides: Any) -> Session:
    return parse_session(raw_session(sid, **overrides))


def hostile_sessions() -> list[Session]:
    sessions = []
    for i, value in enumerate(HOSTILE):
        sessions.append(
            session(
                f"id-{i}-{value}",
                image=f"img {value}",
                tag=value,
                location=f"loc-{i % 2}",
                host=value,
                created=1648472895000 + i * 1500.5,
                playerCount=None if i == 3 else i,
                status="weird-new-status" if i == 2 else "running",
                labels={"tags": json.dumps({"mode": value, "team.name": value, "team-name": "b", "other": "x"})},
            )
        )
    return sessions


ALLOWLIST = ("mode", "team.name", "team-name", "not-present")


class _Reference(Collector):
    """The same data as the renderer's output, built with prometheus_client's own metric families."""

    def __init__(self, sessions: Sequence[Session], families: Sequence[MetricFamily], names: dict[str, str]):
        self.sessions, self.families, self.names = sessions, families, names

    def collect(self) -> Iterator[Metric]:
        for family in self.families:
            metric = Metric("sessionhost_upstream_" + family.name, family.help or "x", family.type)
            for s in family.samples:
                metric.add_sample("sessionhost_upstream_" + s.name, dict(s.labels), s.value)
            yield metric
        counts: dict[tuple[str, ...], int] = {}
        players: dict[tuple[str, ...], int] = {}
        for s in self.sessions:
            key = (s.location, s.image, s.tag, s.status)
            counts[key] = counts.get(key, 0) + 1
            players[key[:3]] = players.get(key[:3], 0) + (s.player_count or 0)
        agg = GaugeMetricFamily("sessionhost_sessions", "x", labels=["location", "image", "tag", "status"])
        for k, n in counts.items():
            agg.add_metric(list(k), n)
        yield agg
        aggp = GaugeMetricFamily("sessionhost_players", "x", labels=["location", "image", "tag"])
        for k, n in players.items():
            aggp.add_metric(list(k), n)
        yield aggp
        info = GaugeMetricFamily(
            "sessionhost_session_info", "x", labels=["session_id", "image", "tag", "location", "host"]
        )
        created = GaugeMetricFamily("sessionhost_session_created_timestamp_seconds", "x", labels=["session_id"])
        playing = GaugeMetricFamily("sessionhost_session_players", "x", labels=["session_id"])
        status = GaugeMetricFamily("sessionhost_session_status", "x", labels=["session_id", "status"])
        labels = GaugeMetricFamily("sessionhost_session_labels", "x")
        for s in self.sessions:
            info.add_metric([s.id, s.image, s.tag, s.location, s.host], 1)
            created.add_metric([s.id], s.created_ms / 1000)
            if s.player_count is not None:
                playing.add_metric([s.id], s.player_count)
            status.add_metric([s.id, s.status], 1)
            present = {name: s.labels[key] for key, name in self.names.items() if key in s.labels}
            labels.add_sample("sessionhost_session_labels", {"session_id": s.id, **present}, 1)
        yield from (info, created, playing, status, labels)
        yield GaugeMetricFamily("archiver_sessions_exported", "x", value=len(self.sessions))
        yield GaugeMetricFamily("archiver_sessions_dropped", "x", value=0)


def normalise(
    families: Iterator[Metric],
) -> dict[str, tuple[str, frozenset[tuple[str, frozenset[Any], float]]]]:
    """Family name → (type, samples) with order-insensitive samples; HELP text is not compared."""
    result = {}
    for family in families:
        samples = frozenset((s.name, frozenset(s.labels.items()), s.value) for s in family.samples)
        assert family.name not in result, f"family {family.name} appears twice"
        result[family.name] = (family.type, samples)
    return result


def reference_bodies(sessions: Sequence[Session], families: Sequence[MetricFamily], names: dict[str, str]):
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Reference(sessions, families, names))
    return generate_latest(registry).decode(), om_generate_latest(registry).decode()


@pytest.fixture
def upstream() -> list[MetricFamily]:
    return parse_upstream_metrics(UPSTREAM_BODY.encode())


def test_text_and_openmetrics_round_trip_to_the_reference_families_with_hostile_values(
    upstream: list[MetricFamily],
) -> None:
    """Both formats parse back to exactly the families a prometheus_client registry renders for the
    same data, with quotes, backslashes, newlines, unicode and 1 KB strings in label values and keys."""
    sessions = hostile_sessions()
    renderer = SnapshotRenderer(max_sessions=100, label_allowlist=ALLOWLIST)
    snap = renderer.render(sessions, upstream, now=1000.0)
    ref_text, ref_om = reference_bodies(sessions, upstream, renderer.label_names)

    ours_text = normalise(text_parse(snap.text.decode()))
    assert ours_text == normalise(text_parse(ref_text))
    ours_om = normalise(om_parse(snap.openmetrics.decode() + "# EOF\n"))
    assert ours_om == normalise(om_parse(ref_om))
    # The data really is in there (the comparison is not between two empty sets).
    assert ours_text["sessionhost_session_info"][1]
    assert ("sessionhost_upstream_starts_total", frozenset({("location", "eu-west-1")}), 7.0) in ours_om[
        "sessionhost_upstream_starts"
    ][1]


def test_upstream_families_keep_their_type_in_each_format(upstream: list[MetricFamily]) -> None:
    """An untyped upstream line stays untyped (`unknown` in OpenMetrics); counters keep `_total`."""
    snap = SnapshotRenderer(max_sessions=10, label_allowlist=()).render([], upstream, now=0.0)
    assert b"# TYPE sessionhost_upstream_session_count untyped\n" in snap.text
    assert b"sessionhost_upstream_session_count 3.0\n" in snap.text
    assert b"# TYPE sessionhost_upstream_session_count unknown\n" in snap.openmetrics
    assert b"# TYPE sessionhost_upstream_starts_total counter\n" in snap.text
    assert b"# TYPE sessionhost_upstream_starts counter\n" in snap.openmetrics
    assert b"# HELP sessionhost_upstream_session_count Active sessions.\n" in snap.text


def test_label_values_are_escaped_exactly_as_the_format_says() -> None:
    assert escape_label_value('a"b\\c\nd') == 'a\\"b\\\\c\\nd'
    snap = SnapshotRenderer(max_sessions=10, label_allowlist=()).render([session('a"b\\c\nd')], [], now=0.0)
    assert b'sessionhost_session_status{session_id="a\\"b\\\\c\\nd",status="running"} 1\n' in snap.text


def test_every_family_has_the_designed_labels_in_sorted_order() -> None:
    snap = SnapshotRenderer(max_sessions=10, label_allowlist=("mode",)).render([session("s1")], [], now=0.0)
    lines = snap.text.decode().splitlines()
    expected = [
        'sessionhost_session_info{host="203.0.113.42",image="demo-game",location="eu-west-1",'
        'session_id="s1",tag="1.1.0"} 1',
        'sessionhost_session_created_timestamp_seconds{session_id="s1"} 1648472895.0',
        'sessionhost_session_players{session_id="s1"} 2',
        'sessionhost_session_status{session_id="s1",status="running"} 1',
        'sessionhost_session_labels{label_mode="duel",session_id="s1"} 1',
        'sessionhost_sessions{image="demo-game",location="eu-west-1",status="running",tag="1.1.0"} 1',
        'sessionhost_players{image="demo-game",location="eu-west-1",tag="1.1.0"} 2',
        "archiver_sessions_exported 1",
        "archiver_sessions_dropped 0",
    ]
    for line in expected:
        assert line in lines


def test_labels_family_is_absent_without_an_allowlist_and_unknown_status_is_unknown() -> None:
    snap = SnapshotRenderer(max_sessions=10, label_allowlist=()).render(
        [session("s1", status="brand-new")], [], now=0.0
    )
    assert b"sessionhost_session_labels" not in snap.text
    assert b'sessionhost_session_status{session_id="s1",status="unknown"} 1\n' in snap.text


def test_allowlisted_label_keys_become_unique_valid_label_names_deterministically() -> None:
    names = label_names_for(["a_b", "a-b", "a.b", "1x", "ü", "a-b", 'q"\n'])
    assert names == {
        "1x": "label_1x",
        "a-b": "label_a_b",
        "a.b": "label_a_b_2",
        "a_b": "label_a_b_3",
        'q"\n': "label_q__",
        "ü": "label__",
    }
    assert label_names_for(reversed(list(names))) == names


def test_container_env_never_reaches_the_output() -> None:
    """Sessions whose env holds SECRET=hunter2 (parsed like the upstream sends them): neither the value
    nor the key appears in any format, even with an allowlist naming env-ish keys."""
    sessions = [session(f"s{i}") for i in range(3)]
    renderer = SnapshotRenderer(max_sessions=10, label_allowlist=("env", "SECRET", "mode"))
    snap = renderer.render(sessions, [], now=0.0)
    bodies = [
        snap.text,
        snap.openmetrics,
        gzip.decompress(snap.text_gzip),
        gzip.decompress(snap.openmetrics_gzip),
    ]
    for body in bodies:
        assert b"hunter2" not in body
        assert b"SECRET" not in body
        assert b'label_mode="duel"' in body


def test_per_session_series_are_capped_and_aggregates_stay_exact() -> None:
    """10 sessions, max 3: the 3 oldest get per-session series, 7 are counted as dropped, and the
    aggregates still count all 10 sessions and all their players."""
    sessions = [
        session(f"s{i:02d}", created=1_700_000_000_000 - i * 1000, playerCount=i, location=f"l{i % 2}")
        for i in range(10)
    ]
    snap = SnapshotRenderer(max_sessions=3, label_allowlist=("mode",)).render(sessions, [], now=0.0)
    families = normalise(text_parse(snap.text.decode()))
    for name in (
        "sessionhost_session_info",
        "sessionhost_session_created_timestamp_seconds",
        "sessionhost_session_players",
        "sessionhost_session_status",
        "sessionhost_session_labels",
    ):
        ids = {dict(labels)["session_id"] for _, labels, _ in families[name][1]}
        assert ids == {"s09", "s08", "s07"}, name  # the oldest by `created`
    assert families["archiver_sessions_exported"][1] == {("archiver_sessions_exported", frozenset(), 3.0)}
    assert families["archiver_sessions_dropped"][1] == {("archiver_sessions_dropped", frozenset(), 7.0)}
    assert sum(v for _, _, v in families["sessionhost_sessions"][1]) == 10
    assert sum(v for _, _, v in families["sessionhost_players"][1]) == sum(range(10))
    assert (snap.sessions_exported, snap.sessions_dropped) == (3, 7)


def test_a_session_without_player_count_has_no_players_sample() -> None:
    snap = SnapshotRenderer(max_sessions=10, label_allowlist=()).render(
        [session("a", playerCount=None), session("b", playerCount=4)], [], now=0.0
    )
    players = normalise(text_parse(snap.text.decode()))["sessionhost_session_players"][1]
    assert players == {("sessionhost_session_players", frozenset({("session_id", "b")}), 4.0)}


def test_a_duplicated_session_id_yields_one_series() -> None:
    snap = SnapshotRenderer(max_sessions=10, label_allowlist=()).render([session("a"), session("a")], [], now=0.0)
    assert snap.text.count(b'sessionhost_session_status{session_id="a"') == 1
    assert b"archiver_sessions_exported 1\n" in snap.text


def test_a_failed_poll_keeps_serving_the_last_snapshot(upstream: list[MetricFamily]) -> None:
    renderer = SnapshotRenderer(max_sessions=10, label_allowlist=())
    first = renderer.render([session("a")], upstream, now=10.0)
    assert renderer.render(None, None, now=20.0) is first
    # Only the session half failed: the last session block stays, the upstream block is new.
    second = renderer.render(None, parse_upstream_metrics(b"session_count 9\n"), now=30.0)
    assert second.sessions_body is first.sessions_body
    assert b"sessionhost_upstream_session_count 9.0" in second.text
    # Only the upstream half failed: the last upstream block stays.
    third = renderer.render([session("b")], None, now=40.0)
    assert b"sessionhost_upstream_session_count 9.0" in third.text
    assert b'session_id="b"' in third.text and b'session_id="a"' not in third.text


def test_a_first_poll_that_failed_renders_an_empty_snapshot() -> None:
    snap = SnapshotRenderer(max_sessions=10, label_allowlist=()).render(None, None, now=5.0)
    assert snap.text == b"" and snap.rendered_at == 5.0


def test_only_new_and_changed_sessions_are_rendered_again() -> None:
    renderer = SnapshotRenderer(max_sessions=100, label_allowlist=("mode",))
    sessions = [session(f"s{i}") for i in range(10)]
    renderer.render(sessions, [], now=0.0)
    assert renderer.render_count == 10

    sessions[4] = session("s4", playerCount=9)  # changed
    sessions.append(session("s10"))  # new
    del sessions[0]  # ended
    snap = renderer.render(sessions, [], now=1.0)
    assert renderer.render_count == 12
    assert b'sessionhost_session_players{session_id="s4"} 9\n' in snap.text
    assert b'session_id="s0"' not in snap.text

    # A caller label outside the allowlist changing does not count as a change.
    sessions[0] = session("s1", labels={"tags": json.dumps({"mode": "duel", "other": "x"})})
    unchanged = renderer.render(sessions, [], now=2.0)
    assert renderer.render_count == 12
    # Nothing visible changed: the block (and its compressed form) is reused as is.
    assert unchanged.sessions_body is snap.sessions_body
    assert unchanged.sessions_deflate is snap.sessions_deflate


def test_gzip_bodies_are_one_member_that_every_decoder_reads_whole(upstream: list[MetricFamily]) -> None:
    """The stitched gzip (snapshot deflate + fresh tail + continued CRC) decodes to the identity body
    with Python's gzip and with a single zlib stream decoder, as httpx uses."""
    snap = SnapshotRenderer(max_sessions=100, label_allowlist=()).render(hostile_sessions(), upstream, now=0.0)
    self_metrics = SelfMetrics(CollectorRegistry())
    for openmetrics in (False, True):
        tail = self_metrics.render(openmetrics)
        for source in (snap, None):
            identity = b"".join(scrape_parts(source, tail, openmetrics=openmetrics, gzip=False))
            compressed = b"".join(scrape_parts(source, tail, openmetrics=openmetrics, gzip=True))
            assert gzip.decompress(compressed) == identity
            decoder = zlib.decompressobj(zlib.MAX_WBITS | 16)
            assert decoder.decompress(compressed) + decoder.flush() == identity
            assert decoder.eof and decoder.unused_data == b""
        if openmetrics:
            assert identity.endswith(b"# EOF\n")
    assert gzip.decompress(gzip_compress(b"abc")) == b"abc"


def test_our_text_output_passes_promtool_check_metrics(upstream: list[MetricFamily], promtool: str) -> None:
    self_metrics = SelfMetrics(CollectorRegistry())
    self_metrics.poll_result("sessions", ok=True, duration=0.2, now=1.0)
    self_metrics.set_next_fetch_deadline(2.0)
    snap = SnapshotRenderer(max_sessions=5, label_allowlist=ALLOWLIST).render(hostile_sessions(), upstream, now=0.0)
    body = b"".join(scrape_parts(snap, self_metrics.render(False), openmetrics=False, gzip=False))
    result = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True, timeout=60)
    assert (result.returncode, result.stdout + result.stderr) == (0, b"")


def test_no_metric_name_appears_twice_in_a_full_body(upstream: list[MetricFamily]) -> None:
    self_metrics = SelfMetrics(CollectorRegistry())
    snap = SnapshotRenderer(max_sessions=5, label_allowlist=()).render([session("a")], upstream, now=0.0)
    body = b"".join(scrape_parts(snap, self_metrics.render(True), openmetrics=True, gzip=False))
    names = [m.name for m in om_parse(body.decode())]
    assert len(names) == len(set(names))
    assert "archiver_sessions_exported" in names and "archiver_build_info" in names


def test_lone_surrogates_in_fields_do_not_fail_the_render() -> None:
    """parse_session refuses them now; the renderer still must not fail on a Session built otherwise."""
    bad = dataclasses.replace(session("ok"), id="bad\ud800id")
    snap = SnapshotRenderer(max_sessions=10, label_allowlist=()).render([bad], [], now=0.0)
    assert b'session_id="bad?id"' in snap.text


def test_negative_max_sessions_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="max-sessions"):
        SnapshotRenderer(max_sessions=-1, label_allowlist=())


@pytest.mark.parametrize(
    "body",
    [b"<html><body>502 Bad Gateway</body></html>", b"session_count three\n", b"\xff\xfe", b'x{a="b} 1\n'],
)
def test_an_unparsable_upstream_metrics_body_is_a_payload_error(body: bytes) -> None:
    with pytest.raises(PayloadError, match="metrics body"):
        parse_upstream_metrics(body)


def test_the_upstream_parser_reads_the_documented_sample() -> None:
    (family,) = parse_upstream_metrics(b"session_count 3")
    assert (family.name, family.type, [(s.name, s.value) for s in family.samples]) == (
        "session_count",
        "unknown",
        [("session_count", 3.0)],
    )
    assert parse_upstream_metrics(b"") == []


def test_snapshot_is_immutable() -> None:
    snap = SnapshotRenderer(max_sessions=1, label_allowlist=()).render([], [], now=0.0)
    assert isinstance(snap, Snapshot)
    with pytest.raises(AttributeError):
        snap.rendered_at = 1.0  # type: ignore[misc]


def test_an_oversized_upstream_metrics_text_is_refused_like_bytes() -> None:
    """The client hands the parser text, not bytes: the size cap must hold for both."""
    from archiver.errors import PayloadError
    from archiver.upstream.metrics import MAX_BODY_BYTES, parse_upstream_metrics

    big = "session_count 1\n" * (MAX_BODY_BYTES // 16 + 1)
    with pytest.raises(PayloadError, match="more than"):
        parse_upstream_metrics(big)
