"""Property tests (hypothesis): whatever JSON the upstream sends, parsing yields models, quarantined
entries or a typed error, never another exception; what it yields passes the edge's range checks;
and the scrape rendered from it stays valid for `promtool check metrics`."""

from __future__ import annotations

import contextlib
import json
import math
import subprocess
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from archiver.errors import PayloadError
from archiver.exporter.exposition import SnapshotRenderer
from archiver.upstream.models import (
    CREATED_MAX_MS,
    CREATED_MIN_MS,
    INT64_MAX,
    INT64_MIN,
    Session,
    SessionList,
    SessionListParser,
    parse_ended,
    parse_session_list,
    scan_ended,
)

#: Any JSON value, surrogates and huge numbers included (what a hostile upstream can send).
JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)
STATUS = st.sampled_from(["running", "exited", "dead", "draining", "", "weird", None])


@st.composite
def entries(draw: st.DrawFn) -> Any:
    """A list entry: mostly of the right shape, any field possibly of the wrong type or range."""
    if draw(st.integers(0, 9)) == 0:
        return draw(JSON)
    entry: dict[str, Any] = {
        "id": draw(st.text(min_size=0, max_size=10) | JSON),
        "image": draw(st.sampled_from(["demo-game", "g\ud800", ""]) | JSON),
        "location": draw(st.sampled_from(["eu-west-1", "l"]) | JSON),
        "created": draw(
            st.floats(min_value=-1e16, max_value=1e16, allow_nan=False)
            | st.integers(min_value=0, max_value=10**18)
            | st.sampled_from([1.7e12, "1.7e12", None])
        ),
        "status": draw(STATUS | JSON),
        "playerCount": draw(st.integers(-(10**20), 10**20) | st.sampled_from([None, "3", "1e25", 1e30, 2.5])),
        "labels": draw(
            st.sampled_from([{}, {"tags": '{"mode": "duel"}', "env": '{"SECRET": "hunter2"}'}, '{"tags": "{"}']) | JSON
        ),
        "port": draw(st.sampled_from([{"7777/udp": 20001}, '{"80/tcp": "x"}']) | JSON),
    }
    for key in draw(st.lists(st.sampled_from(list(entry)), max_size=3)):
        entry.pop(key, None)
    return entry


def _check_session(s: Session) -> None:
    assert s.id
    for text in (s.id, s.image, s.tag, s.location, s.host, *s.labels, *s.labels.values()):
        text.encode("utf-8")  # strict: no lone surrogate got through
    assert CREATED_MIN_MS <= s.created_ms <= CREATED_MAX_MS and math.isfinite(s.created_ms)
    assert s.player_count is None or INT64_MIN <= s.player_count <= INT64_MAX


def _check_result(result: SessionList, count: int) -> None:
    for s in result.sessions:
        _check_session(s)
    assert len(result.sessions) + len(result.invalid) == count
    for bad in result.invalid:
        assert "hunter2" not in bad.reason


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(entries(), max_size=6))
def test_any_list_body_parses_into_models_or_quarantined_entries(items: list[Any]) -> None:
    """The incremental parser and the pure one agree, and neither raises anything but PayloadError."""
    body = json.dumps({"sessions": items}).encode()
    pure = parse_session_list({"sessions": items})
    _check_result(pure, len(items))
    parser = SessionListParser()
    for _ in range(2):  # a second parse reuses the models of unchanged entries
        incremental = parser.parse(body)
        _check_result(incremental, len(items))
        assert [s.id for s in incremental.sessions] == [s.id for s in pure.sessions]
        assert [i.index for i in incremental.invalid] == [i.index for i in pure.invalid]
    ended = [parse_ended(e) for e in scan_ended(body)]
    for item in ended:
        if isinstance(item, Session):
            _check_session(item)
            assert item.terminal


@settings(max_examples=200, deadline=None)
@given(JSON)
def test_any_json_envelope_is_a_list_or_a_payload_error(payload: Any) -> None:
    body = json.dumps(payload).encode()
    for parse in (SessionListParser().parse, scan_ended):
        with contextlib.suppress(PayloadError):  # the one exception a body may cause
            parse(body)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(st.lists(entries(), min_size=1, max_size=8))
def test_the_scrape_of_any_parsed_list_passes_promtool(promtool: str, items: list[Any]) -> None:
    sessions = SessionListParser().parse(json.dumps({"sessions": items}).encode()).sessions
    renderer = SnapshotRenderer(max_sessions=5, label_allowlist=("mode",))
    snapshot = renderer.render(sessions, [], now=1_800_000_000.0)
    checked = subprocess.run([promtool, "check", "metrics"], input=snapshot.text, capture_output=True, timeout=30)
    assert checked.returncode == 0, checked.stderr.decode() + checked.stdout.decode()
