"""Search by player: the `players/` index the pipeline writes, `ls --player`, and its backfill (`index-players`).

The request-count tests seed the index directly with the layout functions (plain files in the
directory store's layout, or create-once PUTs to moto), then count the store's own requests
(``ObjectStore.requests_made``) while `ls --player` answers.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from archiver.layout import keys
from archiver.layout.manifest import IndexEntry, Manifest, index_entry_for, index_entry_to_bytes
from archiver.layout.players import player_entries
from archiver.retrieval import retrieve
from archiver.retrieval.reindex import index_players
from archiver.store import ObjectStore
from archiver.store.file import FileStore
from archiver.store.s3 import S3Store
from tests import fixtures_retrieval
from tests.support import HOUR, NOW, put_session, run_cli

DAY = 24 * HOUR

# The stores and the pipeline of the retrieval tests (pytest finds fixtures by module name).
file_store = fixtures_retrieval.file_store
s3_store = fixtures_retrieval.s3_store
store = fixtures_retrieval.store
archive_from_fake = fixtures_retrieval.archive_from_fake
memory_dir = fixtures_retrieval.memory_dir


def _entry(sid: str, ended_at: float) -> IndexEntry:
    return IndexEntry(
        session_id=sid, ended_at=ended_at, archived_at=ended_at + 30, image="demo-game", tag="1.1.0",
        location="eu-west-1", labels={}, counts={"archived": 2}, total_bytes=4096,
        manifest_key=keys.manifest_key("", sid),
    )  # fmt: skip


def _players_of(n: int) -> tuple[str, ...]:
    """Session n's players: one of a crowd of 50, and `suspect` in every 997th session."""
    return (f"crowd-{n % 50}", "suspect") if n % 997 == 0 else (f"crowd-{n % 50}",)


def test_ls_player_over_10000_sessions_costs_one_listing_and_one_read_per_match(memory_dir: Path) -> None:
    """10,000 archived sessions over 100 days: `ls --player` lists one prefix once (from --since on)
    and reads only the entries that match; the sessions not involved cost nothing.

    Only the player index is seeded (what `ls --player` could touch), as plain files in the
    directory store's layout: 10,011 files are what this machine writes in a few seconds.
    """
    root = memory_dir / "archive"
    sessions = 10_000
    span = 100 * DAY
    ended = {f"s{n:05d}": NOW - span + span * (n + 0.5) / sessions for n in range(sessions)}
    for player in ("suspect", *(f"crowd-{c}" for c in range(50))):
        (root / keys.player_prefix("", player)).mkdir(parents=True)
    for n, (sid, when) in enumerate(ended.items()):
        body = index_entry_to_bytes(_entry(sid, when))
        for player in _players_of(n):
            (root / keys.player_key("", player, when, sid)).write_bytes(body)
    store = FileStore(root)

    since = NOW - 30 * DAY
    expected = {sid for n, (sid, when) in enumerate(ended.items()) if "suspect" in _players_of(n) and when >= since}
    assert 2 <= len(expected) < 5  # some of suspect's 11 sessions are older than 30 days
    found = retrieve.list_sessions(store, player="suspect", since=since, now=NOW)
    assert {e.session_id for e in found} == expected
    assert [e.ended_at for e in found] == sorted((ended[s] for s in expected), reverse=True)  # newest first
    assert store.requests_made.snapshot() == {"ListObjectsV2": 1, "GetObject": len(expected)}

    # A busy player (200 sessions): a week costs the week's matches, not the player's history.
    store.requests_made.reset()
    week = retrieve.list_sessions(store, player="crowd-7", since=NOW - 7 * DAY, now=NOW)
    assert len(week) == 14 and all(e.ended_at >= NOW - 7 * DAY for e in week)
    assert store.requests_made.snapshot() == {"ListObjectsV2": 1, "GetObject": len(week)}

    store.requests_made.reset()
    assert retrieve.list_sessions(store, player="nobody", since=since, now=NOW) == []
    assert store.requests_made.snapshot() == {"ListObjectsV2": 1}


def test_ls_player_on_s3_lists_from_since_with_start_after(
    s3_bucket: tuple[str, str], s3_client: Callable[..., Any]
) -> None:
    """On S3 (moto) --since becomes StartAfter: 60 sessions of a player, 10 in range, 4 keys a
    page: at most 4 list pages and 10 reads, not the 15 pages of the player's whole history."""
    _endpoint, bucket = s3_bucket
    store = S3Store(s3_client(), bucket, "archive/", list_page_size=4)
    for n in range(60):
        sid, when = f"m{n:03d}", NOW - (60 - n) * HOUR + 1
        store.put_bytes(
            keys.player_key(store.prefix, "busy", when, sid),
            index_entry_to_bytes(_entry(sid, when)),
            content_type="application/json",
        )
    store.requests_made.reset()
    found = retrieve.list_sessions(store, player="busy", since=NOW - 10 * HOUR, now=NOW)
    assert [e.session_id for e in found] == [f"m{n:03d}" for n in range(59, 49, -1)]
    assert store.requests_made["GetObject"] == 10
    assert store.requests_made["ListObjectsV2"] <= 4
    # --until stops the listing at the first entry past it (in the second page).
    store.requests_made.reset()
    window = retrieve.list_sessions(store, player="busy", since=NOW - 10 * HOUR, until=NOW - 5 * HOUR, now=NOW)
    assert [e.session_id for e in window] == [f"m{n:03d}" for n in range(54, 49, -1)]
    assert store.requests_made.snapshot() == {"ListObjectsV2": 2, "GetObject": 5}
    store.close()


def test_pipeline_indexes_players_and_ls_player_finds_the_session(
    store: ObjectStore, archive_from_fake: Callable[..., Manifest]
) -> None:
    """A session archived by the real pipeline is listed under each of its players, through the CLI too."""
    m = archive_from_fake(labels={"tournament": "spring"})
    assert m.players == ("ann", "bob")
    mkey = keys.manifest_key(store.prefix, m.session_id, m.instance)
    index_bytes = index_entry_to_bytes(index_entry_for(m, mkey))
    for player in ("ann", "bob"):
        key = keys.player_key(store.prefix, player, m.ended_at, m.session_id, m.instance)
        assert b"".join(store.iter_bytes(key)) == index_bytes  # the index entry, byte for byte
        [found] = retrieve.list_sessions(store, player=player, since=m.ended_at - HOUR, now=m.ended_at + 60)
        assert (found.session_id, found.instance) == (m.session_id, m.instance)
    assert retrieve.list_sessions(store, player="carol", since=m.ended_at - HOUR, now=m.ended_at + 60) == []
    assert retrieve.list_sessions(store, player="ann", since=m.ended_at + 1, now=m.ended_at + 60) == []

    result = run_cli(store, ["ls", "--player", "bob", "--label", "tournament=spring", "--format", "json"])
    assert result.exit_code == 0, result.output
    assert [row["session_id"] for row in json.loads(result.output)] == [m.session_id]
    assert json.loads(run_cli(store, ["ls", "--player", "carol", "--format", "json"]).output) == []


def test_a_planted_player_entry_cannot_list_another_session(file_store: ObjectStore) -> None:
    """An entry whose contents name another session than its key is skipped with a warning."""
    entry = _entry("real", NOW - HOUR)
    planted = keys.player_key(file_store.prefix, "victim", NOW - HOUR, "framed")
    file_store.put_bytes(planted, index_entry_to_bytes(entry), content_type="application/json")
    warnings: list[str] = []
    assert retrieve.list_sessions(file_store, player="victim", since=NOW - DAY, now=NOW, warn=warnings.append) == []
    assert len(warnings) == 1 and "describes another session" in warnings[0]


def test_index_players_backfills_old_archives_idempotently_and_resumes(file_store: ObjectStore, tmp_path: Path) -> None:
    """Archives written before the player index (manifest + index entry only) are indexed by one
    command; running it again writes nothing new; a checkpoint resumes after the last batch."""
    made = [
        put_session(file_store, f"old-{n:02d}", ended_at=NOW - n * HOUR, players=(f"p{n % 3}", "everyone"))
        for n in range(12)
    ]
    put_session(file_store, "legacy", ended_at=NOW - 30 * HOUR, players=("p0",), instance=None)
    put_session(file_store, "nobody-played", ended_at=NOW - 31 * HOUR, players=())
    assert retrieve.list_sessions(file_store, player="everyone", since=NOW - DAY, now=NOW) == []

    batches: list[str | None] = []
    report = index_players(file_store, batch=5, on_batch=lambda r: batches.append(r.last_key))
    assert (report.manifests, report.written, report.already_present, report.problems) == (14, 25, 0, [])
    assert len(batches) == 3 and batches[-1] == report.last_key
    since = NOW - 2 * DAY
    assert len(retrieve.list_sessions(file_store, player="everyone", since=since, now=NOW)) == 12
    p0 = retrieve.list_sessions(file_store, player="p0", since=since, now=NOW)
    assert [e.session_id for e in p0] == ["old-00", "old-03", "old-06", "old-09", "legacy"]
    for m in made:  # the same bytes the pipeline writes
        mkey = keys.manifest_key(file_store.prefix, m.session_id, m.instance)
        for key, body in player_entries(file_store.prefix, m, mkey):
            assert b"".join(file_store.iter_bytes(key)) == body

    again = index_players(file_store)
    assert (again.manifests, again.written, again.already_present) == (14, 0, 25)

    # Resumed after the first batch's checkpoint: only the manifests after it are read.
    resumed = index_players(file_store, start_after=batches[0] or "")
    assert resumed.manifests == 9 and resumed.written == 0

    # Through the CLI, with a checkpoint file: counts on stdout, the checkpoint names the last manifest.
    checkpoint = tmp_path / "players.checkpoint"
    result = run_cli(file_store, ["index-players", "--checkpoint", str(checkpoint)])
    assert result.exit_code == 0, result.output
    assert "14 manifests read, 0 player index entries written, 25 already present, 0 problems" in result.output
    assert checkpoint.read_text().strip() == report.last_key


def test_index_players_reports_a_manifest_that_is_not_its_own(file_store: ObjectStore) -> None:
    """A manifest copied under another session's key is not indexed (it would list the wrong archive)."""
    m = put_session(file_store, "genuine", ended_at=NOW - HOUR, players=("ann",))
    root = Path(file_store.url.removeprefix("file://"))
    forged = root / keys.manifest_key(file_store.prefix, "forged", m.instance)
    forged.parent.mkdir(parents=True)
    forged.write_bytes((root / keys.manifest_key(file_store.prefix, "genuine", m.instance)).read_bytes())
    warnings: list[str] = []
    report = index_players(file_store, warn=warnings.append)
    assert (report.manifests, report.written, len(report.problems)) == (2, 1, 1)
    assert "describes session genuine" in warnings[0]


@pytest.mark.parametrize("player", ["../../etc", "a/b", "試合-😀", "x" * 400, "."])
def test_player_keys_are_key_safe_and_sort_by_end_time(player: str) -> None:
    """Hostile player ids stay inside players/; an entry name sorts by end time, after --since's StartAfter."""
    first = keys.player_key("arch/", player, NOW - HOUR, "s1", keys.instance_name((NOW - 2 * HOUR) * 1000))
    later = keys.player_key("arch/", player, NOW, "a0")
    base = keys.player_prefix("arch/", player)
    assert first.startswith(base) and later.startswith(base) and base.count("/") == 3
    assert first < later
    assert keys.player_start_after("arch/", player, NOW - HOUR) < first < keys.player_start_after("arch/", player, NOW)
    assert keys.player_entry_ms(first[len(base) :]) == int((NOW - HOUR) * 1000)


def test_index_players_names_a_checkpoint_it_cannot_read_or_write(file_store: ObjectStore, tmp_path: Path) -> None:
    """An unreadable --checkpoint, or one that cannot be replaced, is one error line (exit 1), not a traceback."""
    put_session(file_store, "s1", ended_at=NOW - HOUR, players=("ann",))
    garbled = tmp_path / "garbled.checkpoint"
    garbled.write_bytes(b"\xff\xfe not UTF-8\n")
    result = run_cli(file_store, ["index-players", "--checkpoint", str(garbled)])
    assert result.exit_code == 1 and f"--checkpoint {garbled}: cannot be read" in result.output
    blocked = tmp_path / "blocked.checkpoint"
    (tmp_path / "blocked.checkpoint.partial").mkdir()  # where the new checkpoint is written first
    result = run_cli(file_store, ["index-players", "--checkpoint", str(blocked)])
    assert result.exit_code == 1 and f"--checkpoint {blocked}: cannot be written" in result.output
