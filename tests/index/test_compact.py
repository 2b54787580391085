"""Compaction of the JSON index into Parquet parts, and `ls` over parts plus uncovered entries."""

from __future__ import annotations

import tempfile
import threading
import time
from pathlib import Path

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from archiver.index import parts
from archiver.index.compact import compact, list_parts
from archiver.index.reader import LATE_WINDOW
from archiver.index.rows import archive_rows
from archiver.index.schema import ITEMS, PLAYERS, SESSIONS
from archiver.layout import keys
from archiver.layout.manifest import index_entry_for
from archiver.retrieval.query import list_sessions
from archiver.store import open_store
from archiver.store.base import ObjectStore
from tests.support import put_session, run_cli

#: A fixed "now": Friday 2026-11-27 12:00 UTC; the day before is closed at 06:00 today.
NOW = 1795780800.0
DAY = 86400.0
INSTANCE = "20261120T000000.000Z"


def _store(root: Path) -> ObjectStore:
    root.mkdir(parents=True, exist_ok=True)
    return open_store(root.as_uri())


def _parquet_keys(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*.parquet"))


def _warnings() -> list[str]:
    return []


def test_rows_follow_the_schema_column_order() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        store = _store(Path(tmp))
        m = put_session(store, "s1", ended_at=NOW - DAY, instance=INSTANCE, artifacts={"/srv/a.replay": b"x"})
        entry = index_entry_for(m, keys.manifest_key("", "s1", INSTANCE))
        rows = archive_rows(entry, "index/x.json", m, b"{}")
        assert list(rows.session) == list(SESSIONS.names)
        assert [list(r) for r in rows.players] == [list(PLAYERS.names)] * 2
        assert [list(r) for r in rows.items] == [list(ITEMS.names)] * 2


def test_closed_days_get_a_day_part_closed_hours_an_hour_part_and_open_hours_none(tmp_path: Path) -> None:
    store = _store(tmp_path)
    put_session(store, "old", ended_at=NOW - 2 * DAY, instance=INSTANCE)  # 2026-11-25: closed
    put_session(store, "early", ended_at=NOW - 11 * 3600, instance=INSTANCE)  # today 01:00: closed hour
    put_session(store, "recent", ended_at=NOW - 3600, instance=INSTANCE)  # today 11:00: open
    report = compact(store, since=NOW - 3 * DAY, until=NOW, now=NOW, warn=print)
    written = _parquet_keys(tmp_path)
    assert (
        "index/dt=2026-11-25/sessions/"
        + parts.part_name("day", ["index/dt=2026-11-25/hour=12/old.20261120T000000.000Z.json"])
        in written
    )
    hourly = [k for k in written if k.startswith("index/hourly/dt=2026-11-27/hour=01/sessions/hour-")]
    assert len(hourly) == 1
    assert not any("hour=11" in k for k in written)
    assert report.entries == 2
    # Every table is written with each part.
    assert {k.split("/")[-2] for k in written if "dt=2026-11-25/" in k} == {"sessions", "players", "items"}


def test_compacting_again_writes_nothing_and_late_entries_get_a_late_part(tmp_path: Path) -> None:
    store = _store(tmp_path)
    put_session(store, "a", ended_at=NOW - 2 * DAY, instance=INSTANCE)
    compact(store, since=NOW - 3 * DAY, until=NOW, now=NOW, warn=print)
    before = _parquet_keys(tmp_path)
    again = compact(store, since=NOW - 3 * DAY, until=NOW, now=NOW, warn=print)
    assert again.parts_written == [] and _parquet_keys(tmp_path) == before
    put_session(store, "late", ended_at=NOW - 2 * DAY + 60, instance=INSTANCE)
    late = compact(store, since=NOW - 3 * DAY, until=NOW, now=NOW, warn=print)
    assert len(late.parts_written) == 1 and "/late-" in late.parts_written[0]
    found = list_sessions(store, since=NOW - 3 * DAY, now=NOW)
    assert sorted(e.session_id for e in found) == ["a", "late"]


def test_ls_reads_parts_not_the_entries_of_covered_hours(tmp_path: Path) -> None:
    store = _store(tmp_path)
    for i in range(30):
        put_session(store, f"s{i}", ended_at=NOW - 3 * DAY + i * 1000, instance=INSTANCE, labels={"cup": str(i % 3)})
    compact(store, since=NOW - 4 * DAY, until=NOW, now=NOW, warn=print)
    store.requests_made.reset()
    found = list_sessions(store, since=NOW - 3 * DAY, until=NOW - 3 * DAY + 30000, now=NOW, labels={"cup": "1"})
    assert [e.session_id for e in found] == [f"s{i}" for i in reversed(range(30)) if i % 3 == 1]
    assert store.requests_made["GetObject"] == 0  # a directory store's parts are read in place
    assert store.requests_made["ListObjectsV2"] == 1  # the day's parts; none of its hours


def test_two_replicas_compacting_at_once_count_each_archive_once(tmp_path: Path) -> None:
    store = _store(tmp_path)
    for i in range(20):
        put_session(store, f"s{i}", ended_at=NOW - 2 * DAY + i * 600, instance=INSTANCE)
    replicas = [_store(tmp_path) for _ in range(2)]
    threads = [
        threading.Thread(
            target=compact, args=(r,), kwargs={"since": NOW - 3 * DAY, "until": NOW, "now": NOW, "warn": print}
        )
        for r in replicas
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    day_parts = list_parts(store, parts.day_dir("", "2026-11-25", "sessions"))
    assert len(day_parts) == 1
    found = list_sessions(store, since=NOW - 3 * DAY, now=NOW)
    assert len(found) == 20
    count = duckdb.sql(f"SELECT count(*) FROM read_parquet('{tmp_path}/index/dt=*/sessions/*.parquet')").fetchall()
    assert count == [(20,)]


def test_compact_and_sql_commands_on_a_store(tmp_path: Path) -> None:
    store = _store(tmp_path)
    for i in range(5):
        put_session(store, f"s{i}", ended_at=1795000000.0 + i * 3600, instance=INSTANCE, labels={"t": "cup-7"})
    result = run_cli(store, ["compact", "--no-progress"])
    assert result.exit_code == 0, result.output
    assert "compacted 5 index entries" in result.output
    result = run_cli(
        store, ["sql", "SELECT count(*) AS n FROM sessions WHERE labels['t'] = 'cup-7'", "--format", "csv"]
    )
    assert result.output == "n\n5\n"
    result = run_cli(store, ["sql", "SELEC nothing"])
    assert result.exit_code == 2
    assert result.output.startswith("error: sql: Parser Error") and result.output.count("\n") == 1


# --- the property: the index path lists exactly what the JSON path lists ------------------------

#: ``(seconds before the query's now, image, location, label)``: six and a half days of sessions.
_SESSION = st.tuples(
    st.integers(1, 6 * 24 * 3600 + 12 * 3600),
    st.sampled_from(["img", "other"]),
    st.sampled_from(["eu", "us"]),
    st.sampled_from(["a", "b", ""]),
)
#: Archives written after the last compaction, of sessions that ended within the late window.
_AFTER = st.tuples(
    st.integers(1, int(LATE_WINDOW)),
    st.sampled_from(["img", "other"]),
    st.sampled_from(["eu", "us"]),
    st.sampled_from(["a", "b", ""]),
)


def _put_all(store: ObjectStore, name: str, sessions: list[tuple[int, str, str, str]], now: float) -> None:
    for n, (ago, img, loc, lab) in enumerate(sessions):
        put_session(
            store, f"{name}{n}", ended_at=now - ago, image=img, location=loc, labels={"t": lab}, instance=INSTANCE
        )


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    first=st.lists(_SESSION, max_size=10),
    late=st.lists(_SESSION, max_size=5),
    after=st.lists(_AFTER, max_size=4),
    compact_at=st.integers(0, 6 * 24 + 12),
    now_hour=st.integers(0, 12),
    duplicate=st.booleans(),
    image=st.sampled_from([None, "img", "other:1.1.0"]),
    location=st.sampled_from([None, "eu"]),
    label=st.sampled_from([None, "a"]),
    limit=st.sampled_from([None, 1, 3]),
    since_hours=st.integers(0, 6 * 24 + 12),
)
def test_index_path_lists_what_the_json_path_lists(
    first: list[tuple[int, str, str, str]],
    late: list[tuple[int, str, str, str]],
    after: list[tuple[int, str, str, str]],
    compact_at: int,
    now_hour: int,
    duplicate: bool,
    image: str | None,
    location: str | None,
    label: str | None,
    limit: int | None,
    since_hours: int,
) -> None:
    origin = parts.day_start("2026-11-20")
    # Midnight to noon: the late window lies in hour parts of an open day or in a closed day's part.
    now = origin + 6 * DAY + now_hour * 3600
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        store = _store(root)
        _put_all(store, "f", first, now)
        compact(store, since=origin, until=now, now=min(now, origin + compact_at * 3600), warn=lambda _m: None)
        _put_all(store, "l", late, now)
        compact(store, since=origin, until=now, now=now, warn=lambda _m: None)
        # Written after the last compaction into hours it may have covered: listed at once.
        _put_all(store, "a", after, now)
        if duplicate:
            # A racing replica's late part repeating entries another part holds.
            for key in _parquet_keys(root):
                for kind in ("/day-", "/hour-"):
                    if kind in key:
                        store.put_bytes(key.replace(kind, "/late-"), (root / key).read_bytes(), content_type="x")
        filters = {
            "since": now - since_hours * 3600,
            "now": now,
            "image": image,
            "location": location,
            "labels": {} if label is None else {"t": label},
            "limit": limit,
        }
        assert list_sessions(store, **filters) == list_sessions(store, **filters, use_index=False)  # type: ignore[arg-type]


def test_an_archive_written_after_its_hour_was_compacted_is_read_at_once_and_once(tmp_path: Path) -> None:
    now = time.time()  # the CLI's own clock: ls, grep, verify and sql run as a user runs them
    store = _store(tmp_path)
    put_session(store, "early", ended_at=now - 3 * 3600, instance=INSTANCE, logs=b"boot early\n")
    put_session(store, "old", ended_at=now - 2 * DAY, instance=INSTANCE, logs=b"boot old\n")
    assert compact(store, since=now - 3 * DAY, until=now, now=now, warn=print).entries == 2
    # Near the deadline, into the hour just compacted; and a backfill of a day long closed.
    put_session(store, "late", ended_at=now - 3 * 3600 + 1, instance=INSTANCE, logs=b"boot late\n")
    put_session(store, "backfill", ended_at=now - 2 * DAY + 1, instance=INSTANCE, logs=b"boot backfill\n")
    ids = [e.session_id for e in list_sessions(store, since=now - 3 * DAY, now=now)]
    assert ids == ["late", "early", "old"]  # the backfill is older than the late window: next compaction
    grep = run_cli(store, ["grep", "boot", "--since", "1d"]).output
    assert grep.count("boot late") == 1 and grep.count("boot early") == 1
    verify = run_cli(store, ["verify", "--since", "1d", "--format", "json"]).output
    assert '"sessions": 2,' in verify and '"ok": true' in verify
    sql = ["sql", "SELECT session_id, count(*) AS n FROM sessions GROUP BY ALL ORDER BY 1", "--format", "csv"]
    assert run_cli(store, [*sql, "--since", "1d"]).output == "session_id,n\nearly,1\nlate,1\n"
    assert compact(store, since=now - 3 * DAY, until=now, now=now, warn=print).entries == 2
    ids = [e.session_id for e in list_sessions(store, since=now - 3 * DAY, now=now)]
    assert ids == ["late", "early", "backfill", "old"]
    assert run_cli(store, [*sql, "--since", "1d"]).output == "session_id,n\nearly,1\nlate,1\n"


def test_the_daemons_compactor_compacts_the_last_days_closed_hours(tmp_path: Path) -> None:
    from archiver.index.schedule import IndexCompactor

    store = _store(tmp_path)
    put_session(store, "yesterday", ended_at=NOW - DAY, instance=INSTANCE)
    put_session(store, "last-week", ended_at=NOW - 7 * DAY, instance=INSTANCE)
    errors: list[int] = []
    compactor = IndexCompactor(
        lambda: _store(tmp_path), interval=60, clock=lambda: NOW, on_error=lambda: errors.append(1)
    )
    compactor.run_once()
    written = [k for k in _parquet_keys(tmp_path) if "/sessions/" in k]
    yesterday = parts.part_name("day", ["index/dt=2026-11-26/hour=12/yesterday.20261120T000000.000Z.json"])
    assert f"index/dt=2026-11-26/sessions/{yesterday}" in written
    assert not any("2026-11-20" in k for k in written)  # last week is past the look-back
    assert errors == [] and compactor.runs == 1


def test_verify_and_grep_select_the_same_sessions_from_parts(tmp_path: Path) -> None:
    store = _store(tmp_path)
    for i in range(6):
        put_session(
            store, f"s{i}", ended_at=NOW - 2 * DAY + i * 3600, instance=INSTANCE, logs=f"boot {i}\nover\n".encode()
        )
    put_session(store, "open", ended_at=NOW - 600, instance=INSTANCE, logs=b"boot open\n")
    commands = [["verify", "--since", "2026-11-24", "--format", "json"], ["grep", "boot", "--since", "2026-11-24"]]
    before = [run_cli(store, c).output for c in commands]
    assert compact(store, since=NOW - 3 * DAY, until=NOW, now=NOW, warn=print).entries == 6
    assert [run_cli(store, c).output for c in commands] == before
    assert "boot 3" in before[1] and "boot open" in before[1]


@pytest.mark.parametrize(("shard", "replica", "compacts"), [(0, 0, True), (0, 1, True), (1, 0, False)])
def test_every_replica_of_shard_0_and_no_other_shard_compacts(
    tmp_path: Path, shard: int, replica: int, compacts: bool
) -> None:
    from archiver.app.daemon import Daemon
    from archiver.config.settings import load_settings

    settings = load_settings(
        {
            "api_url": "http://127.0.0.1:9",  # never called: the daemon is not started
            "store": tmp_path.as_uri(),
            "state_dir": str(tmp_path / "state"),
            "listen": "127.0.0.1:0",
            "shard": "auto",
            "total_shards": 2,
            "replicas_per_shard": 2,
        },
        {"ARCHIVER_API_TOKEN": "t0ken-value", "POD_NAME": f"archiver-{shard * 2 + replica}"},
    )
    assert (settings.shard.index, settings.shard.replica) == (shard, replica)
    daemon = Daemon(settings)
    try:
        assert (daemon.index_compactor is not None) is compacts
    finally:
        daemon.stop()


def test_legacy_and_instance_archives_are_compacted_and_listed_alike(tmp_path: Path) -> None:
    store = _store(tmp_path)
    put_session(store, "legacy", ended_at=NOW - 2 * DAY)  # written before instances existed
    put_session(store, "legacy", ended_at=NOW - 2 * DAY + 60, instance=INSTANCE, labels={"k": "v"})
    before = list_sessions(store, since=NOW - 3 * DAY, now=NOW, use_index=False)
    assert compact(store, since=NOW - 3 * DAY, until=NOW, now=NOW, warn=print).entries == 2
    assert list_sessions(store, since=NOW - 3 * DAY, now=NOW) == before
    assert [e.instance for e in before] == [INSTANCE, None]
    result = run_cli(
        store, ["sql", "SELECT count(*) FILTER (WHERE instance IS NULL) AS legacy FROM sessions", "--format", "csv"]
    )
    assert result.output == "legacy\n1\n"


def test_a_range_from_1970_lists_only_the_days_since_the_first_indexed_one(tmp_path: Path) -> None:
    """`ls --since 1970-01-01` on a store indexed for two days lists those days' entries, not every
    day since 1970 (20,000 listings: 18 s on an empty store); an empty store answers at once."""
    empty = _store(tmp_path / "empty")
    assert list_sessions(empty, since=0.0, until=NOW, now=NOW) == []
    assert empty.requests_made["ListObjectsV2"] == 1
    store = _store(tmp_path / "two-days")
    put_session(store, "old", ended_at=NOW - 2 * DAY, instance=INSTANCE)
    put_session(store, "new", ended_at=NOW - 3600, instance=INSTANCE)
    store.requests_made.reset()
    found = list_sessions(store, since=0.0, until=NOW + 300 * DAY, now=NOW)
    assert sorted(e.session_id for e in found) == ["new", "old"]
    # one to find the first day, then per day at most its parts, its hourly parts and its 24 hours
    assert store.requests_made["ListObjectsV2"] <= 1 + 4 * 26
