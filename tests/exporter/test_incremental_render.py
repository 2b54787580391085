"""Incremental render (issue 14): after any sequence of polls the snapshot says exactly what a fresh
render of the same sessions says, and only the blocks holding changed sessions are compressed again."""

from __future__ import annotations

import gzip
import json
import random
import threading
import zlib
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from archiver.exporter import blocks
from archiver.exporter.blocks import coalesce, combine_crc
from archiver.exporter.exposition import SnapshotRenderer
from archiver.upstream.listparser import SessionListParser
from archiver.upstream.models import ListDelta, Session, parse_session
from tests.support import raw_session

ALLOWLIST = ("mode",)
#: Parts per block with an allowlist: info, created, players, status, labels.
FAMILIES = 5


def families_of(text: bytes) -> dict[bytes, list[bytes]]:
    """Family name → its sample lines, sorted (series order within a family is free), in body order."""
    families: dict[bytes, list[bytes]] = defaultdict(list)
    current = b""
    for line in text.split(b"\n"):
        if line.startswith(b"# HELP "):
            current = line.split()[2]
            families[current] = []
        elif line and not line.startswith(b"#"):
            families[current].append(line)
    return {name: sorted(lines) for name, lines in families.items()}


def check_snapshot(renderer: SnapshotRenderer, sessions: Sequence[Session], *, max_sessions: int) -> None:
    snapshot = renderer.render(sessions, [], now=0.0)
    fresh = SnapshotRenderer(max_sessions=max_sessions, label_allowlist=ALLOWLIST).render(sessions, [], now=0.0)
    # Same families in the same order, same series in each.
    assert list(families_of(snapshot.text)) == list(families_of(fresh.text))
    assert families_of(snapshot.text) == families_of(fresh.text)
    assert (snapshot.sessions_exported, snapshot.sessions_dropped) == (fresh.sessions_exported, fresh.sessions_dropped)
    # The stitched gzip decodes to the identity body; gzip checks the CRC-32 and length trailer.
    for openmetrics in (False, True):
        identity = snapshot.openmetrics if openmetrics else snapshot.text
        compressed = snapshot.openmetrics_gzip if openmetrics else snapshot.text_gzip
        assert gzip.decompress(compressed) == identity


def make_session(sid: str, players: int | None, status: str, mode: str, created: int) -> Session:
    overrides: dict[str, Any] = {"playerCount": players, "status": status, "created": 1_700_000_000_000 + created}
    entry = raw_session(sid, **overrides)
    entry["labels"]["tags"] = json.dumps({"mode": mode})
    return parse_session(entry)


poll = st.lists(
    st.tuples(
        st.integers(0, 29),  # id out of a small pool: ids come back after they ended
        st.one_of(st.none(), st.integers(0, 3)),
        st.sampled_from(["running", "draining", "exited"]),
        st.sampled_from(["duel", "ffa"]),
        st.integers(0, 5),
    ),
    max_size=25,
)


@settings(max_examples=60, deadline=None)
@given(
    polls=st.lists(poll, min_size=1, max_size=8),
    block_sessions=st.sampled_from([1, 2, 3, 7, 512]),
    max_sessions=st.sampled_from([0, 4, 1000]),
    reuse=st.booleans(),
)
def test_any_sequence_of_polls_renders_what_a_fresh_render_would(
    polls: list[list[tuple[int, int | None, str, str, int]]], block_sessions: int, max_sessions: int, reuse: bool
) -> None:
    """Sessions appear, change, end, come back and repeat within a poll (a duplicated id), with and
    without the cap, with blocks of every size, beside a steady majority; unchanged sessions are the
    same objects from poll to poll when `reuse` (as SessionListParser hands them over) and equal
    copies otherwise."""
    renderer = SnapshotRenderer(max_sessions=max_sessions, label_allowlist=ALLOWLIST, block_sessions=block_sessions)
    seen: dict[tuple[Any, ...], Session] = {}
    # A steady majority, so that the changes of a poll are few and the aggregates move incrementally.
    steady = [make_session(f"steady{i}", i % 3, "running", "ffa", 100 + i) for i in range(80)]
    for entries in polls:
        sessions = list(steady)
        for number, players, status, mode, created in entries:
            key = (number, players, status, mode, created)
            if not reuse or key not in seen:
                seen[key] = make_session(f"s{number}", players, status, mode, created)
            sessions.append(seen[key])
        check_snapshot(renderer, sessions, max_sessions=max_sessions)


def test_a_player_count_change_compresses_only_that_blocks_players_part_again() -> None:
    sessions = [make_session(f"s{i}", 1, "running", "duel", i) for i in range(20)]
    renderer = SnapshotRenderer(max_sessions=100, label_allowlist=ALLOWLIST, block_sessions=4)
    renderer.render(sessions, [], now=0.0)
    assert renderer.parts_built == 5 * FAMILIES  # 5 blocks of 4 sessions, every family

    sessions[9] = make_session("s9", 7, "running", "duel", 9)
    before = renderer.parts_built
    snapshot = renderer.render(sessions, [], now=1.0)
    assert renderer.parts_built - before == 1
    assert b'sessionhost_session_players{session_id="s9"} 7\n' in snapshot.text
    assert b'sessionhost_players{image="demo-game",location="eu-west-1",tag="1.1.0"} 26\n' in snapshot.text


def test_the_oldest_ending_and_a_new_one_arriving_touch_only_the_head_and_tail_blocks() -> None:
    sessions = [make_session(f"s{i}", 1, "running", "duel", i) for i in range(18)]
    renderer = SnapshotRenderer(max_sessions=100, label_allowlist=ALLOWLIST, block_sessions=4)
    renderer.render(sessions, [], now=0.0)
    before = renderer.parts_built
    snapshot = renderer.render([*sessions[1:], make_session("s18", 1, "running", "duel", 18)], [], now=1.0)
    assert renderer.parts_built - before == 2 * FAMILIES  # the head block (s0 gone) and the tail block (s18)
    assert b'session_id="s0"' not in snapshot.text and b'session_id="s18"' in snapshot.text


def test_a_poll_that_changes_nothing_visible_builds_nothing() -> None:
    sessions = [make_session(f"s{i}", 1, "running", "duel", i) for i in range(10)]
    renderer = SnapshotRenderer(max_sessions=100, label_allowlist=ALLOWLIST, block_sessions=4)
    first = renderer.render(sessions, [], now=0.0)
    before = renderer.parts_built
    # Equal copies (a parser that does not reuse objects): compared by their rendered fields.
    again = renderer.render([make_session(f"s{i}", 1, "running", "duel", i) for i in range(10)], [], now=1.0)
    assert renderer.parts_built == before
    assert again.sessions_deflate is first.sessions_deflate


def test_blocks_thinned_out_by_random_ends_are_packed_again() -> None:
    rnd = random.Random(3)
    sessions = [make_session(f"s{i}", i % 4, "running", "duel", i) for i in range(400)]
    renderer = SnapshotRenderer(max_sessions=1000, label_allowlist=ALLOWLIST, block_sessions=8)
    renderer.render(sessions, [], now=0.0)
    while len(sessions) > 40:
        del sessions[rnd.randrange(len(sessions))]
        check_snapshot(renderer, sessions, max_sessions=1000)
    # 40 sessions need 5 full blocks; packing keeps them at most 2x that (+1) however they thinned.
    assert renderer.block_count <= 2 * 5 + 1


def test_coalesced_chunks_keep_the_bytes_and_stay_near_the_limit() -> None:
    parts = [bytes([65 + i % 26]) * size for i, size in enumerate([10, 0, 300, 50, 50, 1000, 5, 0, 70])]
    chunks = coalesce(parts, limit=128)
    assert b"".join(chunks) == b"".join(parts)
    assert all(len(chunk) <= 128 or chunk in parts for chunk in chunks)
    assert coalesce([]) == () and coalesce([b"", b""]) == ()


def test_crcs_of_parts_combine_to_the_crc_of_their_concatenation() -> None:
    parts = [b"abc", b"", b"x" * 70_000, b"\n# EOF\n"]
    crc = combine_crc(zlib.crc32(b"head"), parts, [zlib.crc32(p) for p in parts])
    assert crc == zlib.crc32(b"head" + b"".join(parts))


def test_a_big_build_compressed_on_two_threads_still_says_what_a_fresh_render_says() -> None:
    """Past PARALLEL_BYTES of dirty parts the helper thread compresses half of them; the stitched
    body must still decode (CRC and length included) to the same series."""
    sessions = [make_session(f"big-{i:05d}", i % 9, "running", "duel", i) for i in range(4000)]
    renderer = SnapshotRenderer(max_sessions=10_000, label_allowlist=ALLOWLIST, block_sessions=64)
    check_snapshot(renderer, sessions, max_sessions=10_000)
    assert any(thread.name.startswith("exposition-deflate") for thread in threading.enumerate())
    rnd = random.Random(5)
    for index in rnd.sample(range(len(sessions)), 400):  # 10 % change: most blocks dirty again
        sessions[index] = make_session(f"big-{index:05d}", 20, "draining", "ffa", index)
    check_snapshot(renderer, sessions, max_sessions=10_000)


def test_a_render_that_fails_half_way_keeps_the_last_snapshot_and_the_next_poll_starts_afresh(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sessions = [make_session(f"s{i}", 1, "running", "duel", i) for i in range(12)]
    renderer = SnapshotRenderer(max_sessions=100, label_allowlist=ALLOWLIST, block_sessions=4)
    first = renderer.render(sessions, [], now=0.0)
    changed = [*sessions[2:], make_session("s12", 3, "running", "ffa", 12)]
    changed[0] = make_session("s2", 9, "draining", "ffa", 2)

    def broken(parts: object) -> None:
        raise MemoryError("compressor ran out of memory")

    with monkeypatch.context() as patch:
        patch.setattr(blocks, "_compress", broken)
        with pytest.raises(MemoryError):
            renderer.render(changed, [], now=1.0)
    assert renderer.last is first  # what scrapes keep being served
    check_snapshot(renderer, changed, max_sessions=100)


# --- the parser's delta -----------------------------------------------------------------------------


def _list_body(entries: list[tuple[int, int | None, str, str, int]]) -> bytes:
    raws = []
    for number, players, status, mode, created in entries:
        raw = raw_session(f"s{number}", playerCount=players, status=status, created=1_700_000_000_000 + created)
        raw["labels"]["tags"] = json.dumps({"mode": mode})
        raws.append(raw)
    steady = [raw_session(f"steady{i}", playerCount=i % 3, created=1_700_000_000_100 + i) for i in range(80)]
    return json.dumps({"sessions": steady + raws}).encode()


class _CountingRenderer(SnapshotRenderer):
    """Counts the polls whose delta was applied (the rest took the full path)."""

    applied = 0

    def _apply_delta(self, sessions: Sequence[Session], delta: ListDelta | None) -> Any:
        changes = super()._apply_delta(sessions, delta)
        self.applied += changes is not None
        return changes


@settings(max_examples=40, deadline=None)
@given(
    polls=st.lists(st.tuples(poll, st.booleans()), min_size=1, max_size=8),
    block_sessions=st.sampled_from([1, 3, 512]),
    max_sessions=st.sampled_from([4, 1000]),
)
def test_polls_rendered_with_the_parsers_delta_say_what_a_fresh_render_would(
    polls: list[tuple[list[tuple[int, int | None, str, str, int]], bool]], block_sessions: int, max_sessions: int
) -> None:
    """Lists parsed by one SessionListParser and rendered with its delta (sessions that appear,
    change, end, come back, repeat within a list; a poll whose list failed in between) render what a
    fresh render of the same sessions renders; the delta is taken whenever it applies."""
    parser = SessionListParser()
    renderer = _CountingRenderer(max_sessions=max_sessions, label_allowlist=ALLOWLIST, block_sessions=block_sessions)
    for entries, failed in polls:
        if failed:  # the list request failed: neither the parser nor the renderer moves
            renderer.render(None, [], now=0.0)
            continue
        listed = parser.parse(_list_body(entries))
        snapshot = renderer.render(listed.sessions, [], now=0.0, delta=listed.delta)
        fresh = SnapshotRenderer(max_sessions=max_sessions, label_allowlist=ALLOWLIST).render(
            listed.sessions, [], now=0
        )
        assert families_of(snapshot.text) == families_of(fresh.text)
        assert gzip.decompress(snapshot.openmetrics_gzip) == snapshot.openmetrics
    listed_polls = [entries for entries, failed in polls if not failed]
    unique = [len({number for number, *_ in entries}) == len(entries) for entries in listed_polls]
    if max_sessions == 1000 and len(listed_polls) > 1 and all(unique):
        assert renderer.applied == len(listed_polls) - 1  # every poll after the first


def test_a_delta_that_does_not_fit_what_was_rendered_is_not_applied() -> None:
    """A delta from another base, for another list, removing a session that is not the one rendered,
    adding an id that is still held, or leaving the count wrong takes the full path: the snapshot
    still says what a fresh render says."""
    sessions = [make_session(f"s{i}", 1, "running", "duel", i) for i in range(6)]
    changed = [*sessions[1:], make_session("s0", 5, "running", "ffa", 0), make_session("s6", 2, "running", "duel", 6)]
    new_s0, new_s6 = changed[-2], changed[-1]
    lies = {
        "another base": ListDelta(list(sessions), changed, [new_s0, new_s6], [sessions[0]]),
        "another list": ListDelta(sessions, list(changed), [new_s0, new_s6], [sessions[0]]),
        "removes a copy": ListDelta(sessions, changed, [new_s0, new_s6], [make_session("s0", 1, "running", "duel", 0)]),
        "adds a held id": ListDelta(sessions, changed, [new_s0, new_s6], []),
        "count off": ListDelta(sessions, changed, [new_s0], [sessions[0]]),
    }
    for name, delta in lies.items():
        renderer = _CountingRenderer(max_sessions=100, label_allowlist=ALLOWLIST, block_sessions=4)
        renderer.render(sessions, [], now=0.0)
        snapshot = renderer.render(changed, [], now=1.0, delta=delta)
        fresh = SnapshotRenderer(max_sessions=100, label_allowlist=ALLOWLIST).render(changed, [], now=1.0)
        assert renderer.applied == 0, name
        assert families_of(snapshot.text) == families_of(fresh.text), name
    honest = _CountingRenderer(max_sessions=100, label_allowlist=ALLOWLIST, block_sessions=4)
    honest.render(sessions, [], now=0.0)
    snapshot = honest.render(changed, [], now=1.0, delta=ListDelta(sessions, changed, [new_s0, new_s6], [sessions[0]]))
    assert honest.applied == 1
    assert families_of(snapshot.text) == families_of(
        SnapshotRenderer(max_sessions=100, label_allowlist=ALLOWLIST).render(changed, [], now=1.0).text
    )
