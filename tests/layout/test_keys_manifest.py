"""Key layout (hostile session ids never escape a prefix) and manifest/index documents (canonical, strict)."""

from __future__ import annotations

import hashlib
import json
import random
import re
import runpy
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest

from archiver.errors import ManifestError
from archiver.layout import keys
from archiver.layout.manifest import (
    IndexEntry,
    Manifest,
    ManifestItem,
    build_manifest,
    index_entry_for,
    index_entry_to_bytes,
    manifest_to_bytes,
    parse_index_entry,
    parse_manifest,
)

SAFE_RE = re.compile(r"^[A-Za-z0-9_%~-]+$")

HOSTILE_IDS = [
    "../../etc/passwd",
    "a/b",
    ".",
    "..",
    ".hidden",
    "/leading-slash",
    "trailing/",
    "spiele-über-alles",
    "試合-😀-ид",
    "x" * 300,
    "é" * 500,
    "\x00\x01\n\r\t\x7f",
    "%2F",
    "100%",
    "a~b",
    "~" * 150,
    "space in id",
    "back\\slash",
    "\ud800lone-surrogate",
    "c595bc6f-8522-4a62-95cd-8742136643ea",
    "A" * 150,
    "A" * 151,
    "." * 50,
]


def _random_ids(n: int) -> list[str]:
    rng = random.Random(1234)  # deterministic: a failure is reproducible
    alphabet = "aZ09_-./%~\\ \x00\n" + "äß€😀試"
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 80))) for _ in range(n)]


@pytest.mark.parametrize("sid", HOSTILE_IDS + _random_ids(300))
def test_escaped_ids_are_key_safe_and_round_trip(sid: str) -> None:
    """Every id becomes one safe segment (no `/`, no leading dot, ≤ 150 chars), reversible unless hashed."""
    escaped = keys.escape_session_id(sid)
    assert SAFE_RE.match(escaped), escaped
    assert "/" not in escaped and not escaped.startswith(".")
    assert len(escaped) <= keys.MAX_ESCAPED_LEN
    assert keys.is_key_safe(escaped)
    if keys.is_hashed_session_id(escaped):
        with pytest.raises(ValueError, match="manifest"):
            keys.unescape_session_id(escaped)
    else:
        assert keys.unescape_session_id(escaped) == sid
    for key in (
        keys.manifest_key("pre/", sid),
        keys.logs_key("pre/", sid, "jsonl"),
        keys.artifact_key("pre/", sid, "/srv/replays/match.replay"),
        keys.index_key("pre/", 1_700_000_000, sid),
    ):
        assert key.startswith("pre/")
        assert ".." not in key.split("/") and "." not in key.split("/")
        assert len(key.encode()) <= 1024
        assert all(0 < len(seg.encode()) <= 255 for seg in key.split("/"))


def test_escape_examples() -> None:
    """Exact escapes: dots always, uppercase UTF-8 hex, plain characters untouched."""
    assert keys.escape_session_id("../x") == "%2E%2E%2Fx"
    assert keys.escape_session_id("a.b") == "a%2Eb"
    assert keys.escape_session_id("ü") == "%C3%BC"
    assert keys.escape_session_id("a~%") == "a%7E%25"
    assert keys.escape_session_id("Abc_-09") == "Abc_-09"


def test_long_ids_are_hashed_without_collisions() -> None:
    """Escaped forms over 150 chars: 128-char head + `~` + 20 hex of sha256(id); distinct ids differ."""
    a, b = "x" * 200 + "a", "x" * 200 + "b"
    ea, eb = keys.escape_session_id(a), keys.escape_session_id(b)
    assert ea != eb
    assert ea == "x" * 128 + "~" + hashlib.sha256(a.encode()).hexdigest()[:20]
    # A plain escaped id can never contain "~" (it is escaped), so it never equals a hashed one.
    assert "~" not in keys.escape_session_id("~" * 10)
    assert keys.escape_session_id("A" * 150) == "A" * 150


def test_empty_id_and_bad_escapes_are_refused() -> None:
    """Empty ids and non-canonical escaped forms raise ValueError."""
    with pytest.raises(ValueError):
        keys.escape_session_id("")
    for bad in ("", "a%2e", "a%2", "a.b", "a/b", "%41", "%FF"):
        with pytest.raises(ValueError):
            keys.unescape_session_id(bad)


def test_artifact_names() -> None:
    """Slugs keep only [A-Za-z0-9._-], ≤ 60 chars, no leading dot; names add 8 hex of sha256(path)."""
    assert keys.artifact_slug("/srv/replays/match.replay") == "srv-replays-match.replay"
    assert keys.artifact_slug("/.hidden/../.x") == "hidden-..-.x"  # one segment: inner dots are harmless
    assert keys.artifact_slug("///") == "artifact"
    long_slug = keys.artifact_slug("/" + "d/" * 100 + "core.txt")
    assert len(long_slug) <= 60 and long_slug.endswith("core.txt")
    path = "/srv/replays/match.replay"
    name = keys.artifact_name(path)
    assert name == f"srv-replays-match.replay-{hashlib.sha256(path.encode()).hexdigest()[:8]}.tar.gz"
    assert keys.artifact_name("/a/b") != keys.artifact_name("/a-b")
    for p in ("/var/log/game/", "/ü/ö", "/" + "x" * 1000, "../../etc"):
        slug = keys.artifact_slug(p)
        assert re.match(r"^[A-Za-z0-9_-][A-Za-z0-9._-]*$", slug) and len(slug) <= 60


def test_key_builders() -> None:
    """The layout of ARCHITECTURE.md §7, with and without a prefix; prefixes must end with `/`."""
    assert keys.manifest_key("", "s1") == "sessions/s1/manifest.json"
    assert keys.logs_key("p/q/", "s1", "txt") == "p/q/sessions/s1/logs.txt.gz"
    assert keys.logs_key("", "s.1", "jsonl") == "sessions/s%2E1/logs.jsonl.gz"
    assert keys.artifact_key("", "s1", "/srv/crash/core.txt").startswith("sessions/s1/artifacts/srv-crash-core.txt-")
    ended = datetime(2024, 5, 1, 23, 59, 59, tzinfo=UTC).timestamp()
    assert keys.index_key("p/", ended, "a/b") == "p/index/dt=2024-05-01/hour=23/a%2Fb.json"
    with pytest.raises(ValueError):
        keys.logs_key("", "s1", "html")
    for bad in ("p", "/p/", "/"):
        with pytest.raises(ValueError):
            keys.manifest_key(bad, "s1")


def test_index_partitions_cover_the_range_hour_by_hour() -> None:
    """Only the hour partitions overlapping [since, until] (UTC), across a day boundary; empty if reversed."""
    since = datetime(2024, 5, 1, 22, 30, tzinfo=UTC).timestamp()
    until = datetime(2024, 5, 2, 1, 0, tzinfo=UTC).timestamp()
    assert keys.index_partitions("p/", since, until) == [
        "p/index/dt=2024-05-01/hour=22/",
        "p/index/dt=2024-05-01/hour=23/",
        "p/index/dt=2024-05-02/hour=00/",
        "p/index/dt=2024-05-02/hour=01/",
    ]
    assert keys.index_partitions("", since, since) == ["index/dt=2024-05-01/hour=22/"]
    assert keys.index_partitions("", until, since) == []
    # Every index key of a time in the range lies under one of the partitions.
    for t in range(int(since), int(until), 977):
        assert any(keys.index_key("p/", t, "s").startswith(p) for p in keys.index_partitions("p/", since, until))


# --- manifest -----------------------------------------------------------------------------------

SHA = "ab" * 32


def _manifest(**overrides: object) -> Manifest:
    items = [
        ManifestItem(
            kind="logs",
            source="GET /query/log?matchKey=s%2F1",
            key="sessions/s%2F1/logs.jsonl.gz",
            size=1234,
            sha256=SHA,
            content_type="application/gzip",
            outcome="archived",
        ),
        ManifestItem(
            kind="artifact",
            source="GET /artifacts?session=s%2F1&path=%2Fsrv%2Freplays%2Fmatch.replay",
            path="/srv/replays/match.replay",
            key="sessions/s%2F1/artifacts/srv-replays-match.replay-00000000.tar.gz",
            size=1_048_576,
            sha256="cd" * 32,
            content_type="application/gzip",
            outcome="archived",
        ),
        ManifestItem(
            kind="artifact",
            source="GET /artifacts?session=s%2F1&path=%2Fsrv%2Fcrash%2Fcore.txt",
            path="/srv/crash/core.txt",
            outcome="source_gone",
            error="404 RESOURCE_NOT_FOUND",
        ),
    ]
    fields: dict[str, object] = dict(
        session_id="s/1",
        image="demo-game",
        tag="1.1.0",
        location="eu-west-1",
        host="203.0.113.42",
        created=1_714_560_000.25,
        labels={"tournament": "spring", "mode": "duel"},
        players=["p1", "p2"],
        player_count=2,
        last_status="exited",
        last_seen_active=1_714_563_600.0,
        first_seen_ended=1_714_563_610.5,
        fetch_deadline=1_714_578_010.5,
        archived_at=1_714_563_700.0,
        items=items,
        archiver_version="0.1.0",
    )
    fields.update(overrides)
    return build_manifest(**fields)  # type: ignore[arg-type]


def test_manifest_round_trips_canonically() -> None:
    """to bytes and back gives the same manifest; bytes are sorted, indented and newline-ended."""
    m = _manifest()
    data = manifest_to_bytes(m)
    assert parse_manifest(data) == m
    assert data.endswith(b"}\n")
    assert manifest_to_bytes(parse_manifest(data)) == data
    doc = json.loads(data)
    assert list(doc) == sorted(doc)
    assert doc["session_id"] == "s/1" and doc["schema_version"] == 1
    assert doc["created"] == 1_714_560_000.25
    assert doc["created_iso"] == "2024-05-01T10:40:00.250Z"
    assert doc["first_seen_ended_iso"] == "2024-05-01T11:40:10.500Z"
    assert doc["items"][2]["outcome"] == "source_gone" and doc["items"][2]["key"] is None
    assert "token" not in data.decode().lower()


def test_manifest_keeps_unicode_and_hostile_ids_exactly() -> None:
    """The real id of a hashed or surrogate-carrying session survives the manifest round trip."""
    for sid in ("é" * 500, "\ud800x", "../../etc/passwd"):
        m = _manifest(session_id=sid)
        assert parse_manifest(manifest_to_bytes(m)).session_id == sid


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (b"", "not UTF-8 JSON"),
        (b"<html>502 Bad Gateway</html>", "not UTF-8 JSON"),
        (b"\xff\xfe", "not UTF-8 JSON"),
        (b"[1, 2]", "not a JSON object"),
        (b'{"schema_version": 2}', "unsupported schema_version 2"),
        (b'{"schema_version": true}', "wrong type"),
        (b'{"schema_version": 1}', "missing field"),
    ],
)
def test_parse_manifest_refuses_garbage_with_typed_error(data: bytes, match: str) -> None:
    """Garbage raises ManifestError with a short excerpt, never a raw json/KeyError traceback."""
    with pytest.raises(ManifestError, match=match) as info:
        parse_manifest(data)
    if data:
        assert info.value.excerpt


def test_parse_manifest_refuses_wrong_field_types() -> None:
    """Each malformed field names itself in the error."""
    doc = json.loads(manifest_to_bytes(_manifest()))
    cases = [
        ("archived_at", "yesterday", "archived_at"),
        ("labels", {"a": 1}, "labels"),
        ("players", [1], "players"),
        ("player_count", 1.5, "player_count"),
        ("items", [{"kind": "video", "source": "x", "outcome": "archived"}], "kind"),
        ("items", [{"kind": "logs", "source": "x", "outcome": "archived"}], "archived item needs"),
        ("items", ["x"], r"items\[0\]"),
    ]
    for field, value, match in cases:
        bad = dict(doc, **{field: value})
        with pytest.raises(ManifestError, match=match):
            parse_manifest(json.dumps(bad).encode())
    long_body = json.dumps(dict(doc, archived_at="x" * 5000)).encode()
    with pytest.raises(ManifestError) as info:
        parse_manifest(long_body)
    assert len(str(info.value)) < 600


def test_manifest_items_are_validated() -> None:
    """Unknown kinds/outcomes, artifact without path, bad sha256 and duplicate keys are refused."""
    with pytest.raises(ValueError):
        ManifestItem(kind="logs", source="GET /logs", outcome="lost")
    with pytest.raises(ValueError):
        ManifestItem(kind="artifact", source="GET /artifacts", outcome="too_large")
    with pytest.raises(ValueError):
        ManifestItem(kind="logs", source="GET /x", outcome="archived", key="k", size=1, sha256="XY", content_type="t")
    item = ManifestItem(kind="logs", source="GET /x", outcome="archived", key="k", size=1, sha256=SHA, content_type="t")
    with pytest.raises(ValueError, match="share one key"):
        _manifest(items=[item, item])
    with pytest.raises(ValueError):
        _manifest(archived_at=float("nan"))


def test_index_entry_summarises_the_manifest_and_round_trips() -> None:
    """Index entry: id, end time, where, labels, counts by outcome, bytes, manifest key; strict parse."""
    m = _manifest()
    entry = index_entry_for(m, keys.manifest_key("", m.session_id))
    assert entry.counts == {"archived": 2, "source_gone": 1}
    assert entry.total_bytes == 1234 + 1_048_576
    assert entry.ended_at == m.first_seen_ended
    data = index_entry_to_bytes(entry)
    assert parse_index_entry(data) == entry
    assert json.loads(data)["ended_at_iso"] == "2024-05-01T11:40:10.500Z"
    with pytest.raises(ManifestError):
        parse_index_entry(b"{}")
    with pytest.raises(ManifestError, match="counts"):
        parse_index_entry(data.replace(b'"archived": 2', b'"archived": "2"'))
    with pytest.raises(ValueError):
        IndexEntry(
            session_id="s",
            ended_at=1.0,
            archived_at=1.0,
            image="i",
            tag="t",
            location="l",
            labels={},
            counts={"weird": 1},
            total_bytes=0,
            manifest_key="k",
        )


@pytest.mark.parametrize(
    "mutate",
    [
        lambda text: text.replace('"schema_version": 1', '"schema_version": ' + "9" * 5000),
        lambda text: "[" * 100_000 + "]" * 100_000,
    ],
    ids=["5000-digit number", "deeply nested"],
)
def test_hostile_json_documents_are_manifest_errors(mutate: Callable[[str], str]) -> None:
    from archiver.layout.manifest import parse_index_entry, parse_manifest

    for parse in (parse_manifest, parse_index_entry):
        with pytest.raises(ManifestError):
            parse(mutate('{"schema_version": 1}').encode())


def test_times_outside_what_can_be_printed_are_refused_when_parsing() -> None:
    """`ls` prints every end time: an index entry claiming the year 1e292 must not crash it."""
    data = index_entry_to_bytes(index_entry_for(_manifest(), "k"))
    doc = json.loads(data)
    doc["ended_at"] = 1e300
    with pytest.raises(ManifestError, match="ended_at"):
        parse_index_entry(json.dumps(doc).encode())
    doc["ended_at"] = -5.0
    with pytest.raises(ManifestError, match="ended_at"):
        parse_index_entry(json.dumps(doc).encode())


# --- instances (one archive per session instance) ------------------------------------------------

INSTANCE = "20261122T060305.123Z"
CREATED_MS = datetime(2026, 11, 22, 6, 3, 5, 123_000, tzinfo=UTC).timestamp() * 1000


@pytest.mark.parametrize(
    ("created_ms", "name"),
    [
        (CREATED_MS, INSTANCE),
        (CREATED_MS + 0.999, INSTANCE),  # floored to the whole millisecond, never rounded up
        (0, "19700101T000000.000Z"),
        (0.5, "19700101T000000.000Z"),
        (253402300799999, "99991231T235959.999Z"),
        (951782400000 + 7, "20000229T000000.007Z"),  # a leap day
    ],
)
def test_instance_name_is_the_utc_creation_time_to_the_millisecond(created_ms: float, name: str) -> None:
    """`YYYYMMDDTHHMMSS.mmmZ` in UTC, floored to ms, recognised by is_instance_name and mapped back."""
    assert keys.instance_name(created_ms) == name
    assert keys.is_instance_name(name)
    assert keys.instance_ms(name) == int(created_ms)


@pytest.mark.parametrize("created_ms", [-1, -0.001, 253402300800000, float("nan"), float("inf"), float("-inf"), True])
def test_instance_name_refuses_times_outside_1970_to_9999(created_ms: float) -> None:
    with pytest.raises(ValueError, match=r"1970|finite"):
        keys.instance_name(created_ms)


@pytest.mark.parametrize(
    "text",
    [
        "", "legacy", "manifest.json", "artifacts", "..", "20261122T060305.123", "20261122T060305.123z",
        "20261122T060305Z", "20261122t060305.123Z", "20261322T060305.123Z", "20261131T060305.123Z",
        "20261122T246305.123Z", "19691231T235959.999Z", "20261122T060305.123Z/..", " 20261122T060305.123Z",
        "\uff120261122T060305.123Z", "20261122T060305.123Z\n", None, 20261122,
    ],
)  # fmt: skip
def test_is_instance_name_accepts_only_what_instance_name_writes(text: object) -> None:
    """No other spelling, no impossible date, nothing before 1970, no path trick, no unicode digit."""
    assert not keys.is_instance_name(text)
    if text is not None:  # None is the legacy layout
        with pytest.raises(ValueError):
            keys.manifest_key("p/", "s1", text)  # type: ignore[arg-type]


def test_instance_key_builders() -> None:
    """With an instance everything lives under sessions/{sid}/{instance}/, the index entry is {sid}.{instance}.json."""
    ended = datetime(2026, 11, 22, 6, 40, tzinfo=UTC).timestamp()
    assert keys.session_prefix("p/", "s1", INSTANCE) == f"p/sessions/s1/{INSTANCE}/"
    assert keys.manifest_key("p/", "s1", INSTANCE) == f"p/sessions/s1/{INSTANCE}/manifest.json"
    assert keys.logs_key("", "s.1", "jsonl", INSTANCE) == f"sessions/s%2E1/{INSTANCE}/logs.jsonl.gz"
    assert keys.artifact_key("", "s1", "/srv/crash/core.txt", INSTANCE).startswith(
        f"sessions/s1/{INSTANCE}/artifacts/srv-crash-core.txt-"
    )
    assert keys.index_key("p/", ended, "a/b", INSTANCE) == f"p/index/dt=2026-11-22/hour=06/a%2Fb.{INSTANCE}.json"


@pytest.mark.parametrize("sid", HOSTILE_IDS)
def test_legacy_keys_are_unchanged_byte_for_byte(sid: str) -> None:
    """instance=None (and leaving it out) gives exactly the keys archives were written under before instances."""
    esc = keys.escape_session_id(sid)
    ended = 1_700_000_000.0
    expected = {
        "manifest": f"pre/sessions/{esc}/manifest.json",
        "logs": f"pre/sessions/{esc}/logs.txt.gz",
        "artifact": f"pre/sessions/{esc}/artifacts/{keys.artifact_name('/srv/x')}",
        "index": f"pre/index/dt=2023-11-14/hour=22/{esc}.json",
    }
    for instance in ({}, {"instance": None}):
        assert keys.manifest_key("pre/", sid, **instance) == expected["manifest"]
        assert keys.logs_key("pre/", sid, "txt", **instance) == expected["logs"]
        assert keys.artifact_key("pre/", sid, "/srv/x", **instance) == expected["artifact"]
        assert keys.index_key("pre/", ended, sid, **instance) == expected["index"]


@pytest.mark.parametrize("sid", [*HOSTILE_IDS, "é" * 500, "x" * 500])
def test_hostile_ids_with_an_instance_stay_inside_their_own_archive(sid: str) -> None:
    """Every key of an instance archive is below `pre/sessions/{esc}/{instance}/`, with sane segments;
    the index file name splits back into escaped id and instance at its first dot."""
    esc = keys.escape_session_id(sid)
    base = f"pre/sessions/{esc}/{INSTANCE}/"
    built = [
        keys.manifest_key("pre/", sid, INSTANCE),
        keys.logs_key("pre/", sid, "jsonl", INSTANCE),
        keys.artifact_key("pre/", sid, "/../../etc/passwd", INSTANCE),
    ]
    for key in built:
        assert key.startswith(base)
        assert key.count("/") == base.count("/") + (1 if "/artifacts/" in key else 0)
    index = keys.index_key("pre/", 1_700_000_000.0, sid, INSTANCE)
    for key in [*built, index]:
        segments = key.split("/")
        assert all(seg and not seg.startswith(".") and len(seg.encode()) <= 255 for seg in segments), key
        assert len(key.encode()) <= 1024
    file_name = index.rsplit("/", 1)[1]
    assert file_name.split(".", 1) == [esc, f"{INSTANCE}.json"]
    # Two instances of one id and the legacy archive never share a key.
    other = "20261122T060305.124Z"
    assert len({keys.manifest_key("pre/", sid), keys.manifest_key("pre/", sid, INSTANCE),
                keys.manifest_key("pre/", sid, other)}) == 3  # fmt: skip
    assert len({keys.index_key("pre/", 0, sid), keys.index_key("pre/", 0, sid, INSTANCE),
                keys.index_key("pre/", 0, sid, other)}) == 3  # fmt: skip


def test_manifest_and_index_entry_round_trip_with_an_instance() -> None:
    """`instance` is written when set and read back; schema_version stays 1; the index entry carries it."""
    m = _manifest(instance=INSTANCE)
    data = manifest_to_bytes(m)
    doc = json.loads(data)
    assert doc["instance"] == INSTANCE and doc["schema_version"] == 1
    assert parse_manifest(data) == m and parse_manifest(data).instance == INSTANCE
    mkey = keys.manifest_key("", m.session_id, INSTANCE)
    entry = index_entry_for(m, mkey)
    assert entry.instance == INSTANCE and entry.manifest_key == mkey
    entry_data = index_entry_to_bytes(entry)
    assert json.loads(entry_data)["instance"] == INSTANCE
    assert parse_index_entry(entry_data) == entry


def test_legacy_documents_without_instance_still_parse_and_keep_their_bytes() -> None:
    """A manifest/entry written before instances (no `instance` field) parses with instance None and
    re-encodes to the same bytes (a re-written legacy manifest stays byte-identical)."""
    m = _manifest()
    data = manifest_to_bytes(m)
    assert b'"instance"' not in data
    parsed = parse_manifest(data)
    assert parsed.instance is None and manifest_to_bytes(parsed) == data
    entry_data = index_entry_to_bytes(index_entry_for(m, keys.manifest_key("", m.session_id)))
    assert b'"instance"' not in entry_data
    assert parse_index_entry(entry_data).instance is None
    # An explicit null is the same as absent.
    doc = json.loads(data)
    doc["instance"] = None
    assert parse_manifest(json.dumps(doc).encode()).instance is None


@pytest.mark.parametrize("bad", ["../x", "legacy", "20261122T060305.123", 5, ""])
def test_documents_with_a_bad_instance_are_refused(bad: object) -> None:
    """A manifest or index entry whose instance is not an instance name is a ManifestError, not a key."""
    doc = json.loads(manifest_to_bytes(_manifest()))
    doc["instance"] = bad
    with pytest.raises(ManifestError, match="instance"):
        parse_manifest(json.dumps(doc).encode())
    entry = json.loads(index_entry_to_bytes(index_entry_for(_manifest(), "k")))
    entry["instance"] = bad
    with pytest.raises(ManifestError, match="instance"):
        parse_index_entry(json.dumps(entry).encode())
    if isinstance(bad, str):
        with pytest.raises(ValueError, match="instance"):
            _manifest(instance=bad)


# --- stored fixtures: the bytes of archives already written ----------------------------------------

FIXTURES = Path(__file__).resolve().parents[1] / "data" / "manifests"


def _fixture_path_id(path: Path) -> str:
    return path.stem


@pytest.mark.parametrize("path", sorted(FIXTURES.glob("manifest-*.json")), ids=_fixture_path_id)
def test_stored_manifests_read_and_write_back_the_same_bytes(path: Path) -> None:
    data = path.read_bytes()
    assert manifest_to_bytes(parse_manifest(data)) == data


@pytest.mark.parametrize("path", sorted(FIXTURES.glob("index-*.json")), ids=_fixture_path_id)
def test_stored_index_entries_read_and_write_back_the_same_bytes(path: Path) -> None:
    data = path.read_bytes()
    assert index_entry_to_bytes(parse_index_entry(data)) == data


def test_building_each_stored_document_today_gives_its_stored_bytes() -> None:
    """The script that wrote the fixtures, run against today's codec, writes every file unchanged
    (and every file on disk is one it writes)."""
    documents = dict(runpy.run_path(str(FIXTURES / "make_fixtures.py"))["documents"]())
    on_disk = {path.name for path in FIXTURES.glob("*.json")}
    assert len(on_disk) >= 20 and set(documents) == on_disk
    for name, data in documents.items():
        assert data == (FIXTURES / name).read_bytes(), name


def test_a_live_capture_item_says_how_complete_it_is_and_other_items_write_no_such_field() -> None:
    """`capture` is written only on a logs item filled from a live capture (complete, gap or
    diverged), so every archive without one keeps its bytes; anything else is refused."""
    live = ManifestItem(
        kind="logs", source="GET /logs?id=s%2F1&follow=true", outcome="archived", capture="gap",
        key=keys.live_logs_key("", "s/1", "jsonl", 0, "20261122T060305.123Z"), size=10, sha256=SHA,
        content_type="application/gzip",
    )  # fmt: skip
    m = _manifest(items=[*_manifest().items, live])
    data = manifest_to_bytes(m)
    assert parse_manifest(data) == m and b'"capture": "gap"' in data
    assert data.count(b'"capture"') == 1
    assert live.key == "sessions/s%2F1/20261122T060305.123Z/logs.live-0.jsonl.gz"
    for bad in ({"capture": "partial"}, {"capture": "complete", "kind": "artifact", "path": "/srv/x"}):
        with pytest.raises(ValueError, match="capture"):
            ManifestItem(**{"kind": "logs", "source": "GET /logs", "outcome": "source_gone", **bad})  # type: ignore[arg-type]
    doc = json.loads(data)
    doc["items"][-1]["capture"] = "partial"
    with pytest.raises(ManifestError, match="capture"):
        parse_manifest(json.dumps(doc).encode())
    with pytest.raises(ValueError, match="segment"):
        keys.live_logs_key("", "s", "txt", 1000)
