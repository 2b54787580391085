"""Ownership of sessions by shards: the stable hash is pinned, the options are validated, the pod
name gives (shard, replica), the list parser leaves other shards' entries out, and two manifests
with the same evidence but other timestamps are the same archive."""

from __future__ import annotations

import dataclasses
import json

import pytest

from archiver.archive.replicas import same_archive
from archiver.config.settings import load_settings
from archiver.config.sharding import Shard, shard_from_ordinal, shard_of, stable_hash
from archiver.errors import ConfigError
from archiver.layout.manifest import ManifestItem, build_manifest
from archiver.upstream.listparser import SessionListParser


def test_the_stable_hash_is_the_first_8_bytes_of_sha256_big_endian() -> None:
    """Pinned values: changing the hash would move every session to another shard on upgrade."""
    assert stable_hash("abc") == 0xBA7816BF8F01CFEA == 13436514500253700074  # sha256("abc") = ba7816bf8f01cfea...
    assert stable_hash("session-1") == 9514267805222021320
    assert stable_hash("ünïcode-Ω") == 9262620734882016573
    assert [shard_of("abc", n) for n in (1, 3, 4)] == [0, 0, 2]
    assert [shard_of("session-1", n) for n in (1, 3, 4)] == [0, 1, 0]


def test_every_id_has_exactly_one_owner_and_shards_are_balanced() -> None:
    ids = [f"match-{n}" for n in range(4000)]
    shards = [Shard(i, 4) for i in range(4)]
    owners = [[s.index for s in shards if s.owns(sid)] for sid in ids]
    assert all(len(o) == 1 for o in owners)
    counts = [sum(o == [i] for o in owners) for i in range(4)]
    assert min(counts) > 900  # 1000 each give or take the hash's noise
    assert Shard(0, 2).owns(None) and not Shard(1, 2).owns(None)  # no id: reported by shard 0 only


def test_pod_ordinal_maps_to_shard_and_replica() -> None:
    assert [shard_from_ordinal(o, 3, 2) for o in range(6)] == [
        Shard(0, 3, 0), Shard(0, 3, 1), Shard(1, 3, 0), Shard(1, 3, 1), Shard(2, 3, 0), Shard(2, 3, 1),
    ]  # fmt: skip
    with pytest.raises(ValueError, match="beyond 3 shards"):
        shard_from_ordinal(6, 3, 2)


def test_shard_options_are_validated_and_auto_reads_the_pod_name() -> None:
    env = {"ARCHIVER_API_TOKEN": "t"}
    assert load_settings({}, env).shard == Shard(0, 1, 0)
    assert load_settings({"shard": "2", "total_shards": 3}, env).shard == Shard(2, 3, 0)
    auto = load_settings({"shard": "auto", "total_shards": 3, "replicas_per_shard": 2}, {**env, "HOSTNAME": "arc-3"})
    assert auto.shard == Shard(1, 3, 1)
    pod = load_settings({"shard": "auto", "total_shards": 2}, {**env, "POD_NAME": "arc-1", "HOSTNAME": "x"})
    assert pod.shard == Shard(1, 2, 0)
    for values, extra, message in (
        ({"shard": "3", "total_shards": 3}, {}, r"--shard must be within 0\.\.2"),
        ({"shard": "-1"}, {}, "expected a shard index"),
        ({"total_shards": 0}, {}, "at least 1"),
        ({"shard": "auto"}, {}, "needs the pod name"),
        ({"shard": "auto"}, {"HOSTNAME": "laptop"}, "expected NAME-ORDINAL"),
        ({"shard": "auto", "total_shards": 2}, {"HOSTNAME": "arc-2"}, "beyond 2 shards"),
    ):
        with pytest.raises(ConfigError, match=message):
            load_settings(values, {**env, **extra})


def _entry(sid: str, **extra: object) -> dict[str, object]:
    return {"id": sid, "image": "demo-game", "location": "eu-west-1", "host": "h", "created": 1_700_000_000_000,
            "status": "running", "labels": {}, "playerCount": 1, **extra}  # fmt: skip


def test_the_list_parser_leaves_out_other_shards_entries_on_every_poll() -> None:
    ids = [f"s-{n}" for n in range(60)]
    shard = Shard(1, 3)
    parser = SessionListParser(owns=shard.owns)
    body = json.dumps({"sessions": [_entry(sid) for sid in ids] + [{"id": 5}, _entry("s-bad", playerCount=-1)]})
    for _ in range(2):  # the second poll takes the unchanged-entry path
        listed = parser.parse(body.encode())
        assert [s.id for s in listed.sessions] == [sid for sid in ids if shard.owns(sid)]
        assert {e.session_id for e in listed.invalid} == ({"s-bad"} if shard.owns("s-bad") else set())
    shard0 = SessionListParser(owns=Shard(0, 3).owns).parse(body.encode())
    assert None in {e.session_id for e in shard0.invalid}  # an entry without an id: shard 0 reports it


def _manifest(**times: float) -> object:
    item = ManifestItem(kind="logs", source="s", outcome="archived", key="p/sessions/a/1/logs.txt.gz", size=3,
                        sha256="a" * 64, content_type="application/gzip")  # fmt: skip
    return build_manifest(
        session_id="a", image="i", tag="t", location="l", host="h", created=1.0, labels={}, players=(),
        player_count=0, last_status="exited", last_seen_active=times.get("seen", 2.0),
        first_seen_ended=times.get("ended", 3.0), fetch_deadline=times.get("deadline", 4.0),
        archived_at=times.get("archived", 5.0), items=[item], instance="19700101T000000.001Z",
    )  # fmt: skip


def test_two_replicas_manifests_with_other_timestamps_are_the_same_archive() -> None:
    ours, theirs = _manifest(), _manifest(seen=2.5, ended=3.5, deadline=9.0, archived=6.0)
    assert same_archive(ours, theirs)  # type: ignore[arg-type]
    other_bytes = dataclasses.replace(
        theirs,  # type: ignore[type-var]
        items=(dataclasses.replace(theirs.items[0], sha256="b" * 64),),  # type: ignore[attr-defined]
    )
    assert not same_archive(ours, other_bytes)  # type: ignore[arg-type]


def test_a_later_replica_waits_its_head_start_once_and_never_near_the_deadline() -> None:
    from archiver.archive.replicas import Stagger, head_start_left
    from archiver.archive.state import ItemRow

    window = 4 * 3600.0 - 600.0
    ended = 1_000_000.0
    item = ItemRow(id=1, session_key="k", session_id="s", instance="i", kind="logs", path="", status="fetching",
                   outcome=None, attempts=1, last_error=None, deadline=ended + window, source="", key=None,
                   spool_path=None, size=None, sha256=None, content_type=None, fetched_at=None)  # fmt: skip
    replica1 = Stagger(delay=60.0, window=window)
    assert head_start_left(item, ended + 10, replica1) == 50.0
    assert head_start_left(item, ended + 61, replica1) == 0.0
    assert head_start_left(item, ended + 10, Stagger(0.0, window)) == 0.0  # replica 0 never waits
    assert head_start_left(dataclasses.replace(item, attempts=2), ended + 10, replica1) == 0.0  # once
    assert head_start_left(item, item.deadline - 200, replica1) == 0.0  # the deadline comes first
