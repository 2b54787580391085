"""Live capture's pure decisions: a cut body's lines, a replay's kept-prefix check, what to follow, when to
reopen, how many follows the open-file limit leaves room for."""

from __future__ import annotations

import random
import resource

import pytest
from hypothesis import given
from hypothesis import strategies as st

from archiver.live import resume
from archiver.live.followset import SessionRef, plan, ref_of
from archiver.live.lines import MAX_LINE, LineSplitter
from archiver.live.loop import OTHER_FILES, UNBOUNDED_SEALS, files_for, seals_room, streams_room
from archiver.live.policy import (
    Ending,
    Finish,
    Tuning,
    after,
    drain_expired,
    ending_of_status,
    first_byte_after,
    stall_after,
)
from archiver.live.resume import CHAIN_START, Kept, Verdict, extend

LINES = st.lists(st.binary(min_size=1, max_size=30).filter(lambda b: b"\n" not in b and b.strip()), max_size=25)


def _split(body: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({min(len(body), c) for c in cuts})
    pieces, last = [], 0
    for p in [*points, len(body)]:
        pieces.append(body[last:p])
        last = p
    return pieces


# --- lines ------------------------------------------------------------------------------------


@given(LINES, st.lists(st.integers(min_value=0, max_value=800), max_size=12))
def test_lines_come_out_whole_however_the_network_cuts_the_body(lines: list[bytes], cuts: list[int]) -> None:
    body = b"".join(line + b"\n" for line in lines)
    splitter = LineSplitter()
    got = [line for piece in _split(body, cuts) for line in splitter.feed(piece)]
    assert got + splitter.finish() == lines


def test_a_partial_last_line_is_held_back_and_only_a_proper_end_makes_it_a_line() -> None:
    splitter = LineSplitter()
    assert splitter.feed(b"one\ntw") == [b"one"]
    assert splitter.feed(b"o") == []
    assert splitter.discard() == 3  # a cut: "two" is forgotten, the next replay sends it whole
    assert splitter.feed(b"three") == []
    assert splitter.finish() == [b"three"]  # the body ended properly: the last line counts
    assert splitter.finish() == []


def test_blank_keepalive_lines_are_dropped_in_both_shapes() -> None:
    splitter = LineSplitter()
    assert splitter.feed(b'\n{"streamType":1,"line":""}\n  \n\r\nx\r\n') == [b'{"streamType":1,"line":""}', b"x\r"]


def test_a_line_without_newline_past_the_limit_is_cut_so_memory_stays_bounded() -> None:
    splitter = LineSplitter()
    got = splitter.feed(b"a" * (MAX_LINE + 10))
    got += splitter.feed(b"b" * (2 * MAX_LINE) + b"\n")
    assert [len(line) for line in got] == [MAX_LINE, MAX_LINE, MAX_LINE, 10]
    assert b"".join(got) == b"a" * (MAX_LINE + 10) + b"b" * (2 * MAX_LINE)


# --- the kept prefix --------------------------------------------------------------------------


def _replay(kept: Kept, lines: list[bytes], pieces: int) -> tuple[resume.Progress, list[bytes]]:
    progress, new = resume.start(kept), []
    step = max(1, len(lines) // max(1, pieces))
    for i in range(0, len(lines), step):
        progress, fresh = resume.replay(kept, progress, lines[i : i + step])
        new.extend(fresh)
    return progress, new


@given(LINES, st.integers(min_value=0, max_value=25), st.integers(min_value=1, max_value=6))
def test_a_replay_of_the_same_log_appends_exactly_the_lines_after_the_kept_ones(
    lines: list[bytes], kept_count: int, pieces: int
) -> None:
    kept_count = min(kept_count, len(lines))
    kept = Kept().after(lines[:kept_count])
    progress, new = _replay(kept, lines, pieces)
    assert new == lines[kept_count:]
    assert progress.verdict is (Verdict.APPENDING if len(lines) >= kept_count else Verdict.CHECKING)
    assert kept.after(new) == Kept().after(lines)  # the chain extends the same way line by line


@given(LINES.filter(lambda ls: len(ls) >= 2), st.data())
def test_a_replay_that_differs_anywhere_in_the_kept_prefix_diverges_and_appends_nothing(
    lines: list[bytes], data: st.DataObject
) -> None:
    kept = Kept().after(lines)
    where = data.draw(st.integers(min_value=0, max_value=len(lines) - 1))
    other = [*lines]
    other[where] = other[where] + b"!"
    progress, new = _replay(kept, [*other, b"later line"], data.draw(st.integers(1, 4)))
    assert progress.verdict is Verdict.DIVERGED and new == []


def test_lines_regrouped_across_boundaries_do_not_chain_alike() -> None:
    assert extend(CHAIN_START, [b"ab", b"c"]) != extend(CHAIN_START, [b"a", b"bc"])
    assert Kept().after([b"ab", b"c"]).size == Kept().after([b"a", b"bc"]).size == 5


def test_a_replay_ending_before_the_kept_count_is_a_shorter_different_log() -> None:
    kept = Kept().after([b"1", b"2", b"3"])
    progress, new = resume.replay(kept, resume.start(kept), [b"1", b"2"])
    assert (progress.verdict, new) == (Verdict.CHECKING, ())
    assert resume.ended(kept, progress).verdict is Verdict.DIVERGED
    matched, _ = resume.replay(kept, progress, [b"3"])
    assert resume.ended(kept, matched).verdict is Verdict.APPENDING


# --- what to follow ---------------------------------------------------------------------------


def _ref(n: int, created: int | None = None) -> SessionRef:
    ms = 1_000 + n if created is None else created
    return SessionRef(f"{ms}:s{n}", f"s{n}", ms)


def test_under_the_cap_the_oldest_unfollowed_sessions_get_the_free_slots_and_the_rest_are_counted() -> None:
    active = [_ref(5), _ref(1), _ref(3), _ref(2), _ref(4)]
    change = plan(active, held=set(), draining=set(), cap=3)
    assert [r.session_id for r in change.start] == ["s1", "s2", "s3"]
    assert (change.drain, change.unfollowed) == ((), 2)


def test_followed_sessions_keep_their_streams_and_sessions_that_left_drain_while_holding_their_slot() -> None:
    held = {_ref(9).key, _ref(8).key, _ref(7).key}
    change = plan([_ref(9), _ref(1), _ref(2)], held=held, draining=set(), cap=4)
    # s9 stays; s8 and s7 left the list: they drain and keep their slots, so one slot is free.
    assert sorted(change.drain) == sorted([_ref(8).key, _ref(7).key])
    assert [r.session_id for r in change.start] == ["s1"] and change.unfollowed == 1
    again = plan([_ref(9), _ref(1), _ref(2)], held=held | {_ref(1).key}, draining=set(change.drain), cap=4)
    assert again.drain == () and again.start == () and again.unfollowed == 1


def test_ties_in_creation_time_are_broken_by_id_and_duplicates_count_once() -> None:
    active = [_ref(2, created=5), _ref(1, created=5), _ref(1, created=5)]
    change = plan(active, held=set(), draining=set(), cap=1)
    assert [r.session_id for r in change.start] == ["s1"] and change.unfollowed == 1


# --- when to reopen ---------------------------------------------------------------------------

TUNING = Tuning(ended_wait=5.0, drain_timeout=120.0, drain_max_wait=5.0)


def _after(ending: Ending, **kwargs: object) -> object:
    args: dict[str, object] = {
        "wanted": True, "ended_properly": False, "attempt": 1, "draining_for": 0.0, "tuning": TUNING,
        "rng": random.Random(1),
    }  # fmt: skip
    args.update(kwargs)
    return after(ending, **args)  # type: ignore[arg-type]


def test_while_listed_every_ending_is_reopened_with_a_growing_capped_backoff() -> None:
    for ending in (Ending.CUT, Ending.REFUSED, Ending.SERVER_ERROR, Ending.STALLED, Ending.DENIED):
        waits = [_after(ending, attempt=n).delay for n in (1, 2, 3, 10)]  # type: ignore[attr-defined]
        assert waits[0] < waits[1] < waits[2] <= waits[3] <= TUNING.policy.max_wait * (1 + TUNING.policy.jitter)
    assert _after(Ending.THROTTLED, retry_after=30.0).delay >= 30.0  # type: ignore[attr-defined]
    ended = _after(Ending.ENDED)
    assert ended.finish is None and ended.delay >= 5.0  # type: ignore[attr-defined]


def test_a_divergence_opens_a_new_segment_at_once() -> None:
    step = _after(Ending.DIVERGED, wanted=False)
    assert step.new_segment and step.delay == 0 and step.finish is None  # type: ignore[attr-defined]


def test_after_the_session_left_the_list_an_end_or_a_404_finishes_the_capture() -> None:
    assert _after(Ending.ENDED, wanted=False).finish is Finish.COMPLETE  # type: ignore[attr-defined]
    assert _after(Ending.GONE, wanted=False, ended_properly=True).finish is Finish.COMPLETE  # type: ignore[attr-defined]
    assert _after(Ending.GONE, wanted=False).finish is Finish.GAP  # type: ignore[attr-defined]
    cut = _after(Ending.CUT, wanted=False, draining_for=10.0)
    assert cut.finish is None and cut.delay <= 5.0 * (1 + TUNING.policy.jitter)  # type: ignore[attr-defined]
    late = _after(Ending.CUT, wanted=False, draining_for=120.0)
    assert late.finish is Finish.GAP  # type: ignore[attr-defined]
    assert drain_expired(120.0, TUNING) and not drain_expired(119.0, TUNING)


def test_statuses_map_to_endings_and_idle_stalls_lengthen_the_stall_timeout() -> None:
    assert [ending_of_status(s) for s in (404, 429, 420, 500, 503, 401, 403, 400)] == [
        Ending.GONE, Ending.THROTTLED, Ending.THROTTLED, Ending.SERVER_ERROR, Ending.SERVER_ERROR,
        Ending.DENIED, Ending.DENIED, Ending.REJECTED,
    ]  # fmt: skip
    assert [stall_after(n, TUNING) for n in (0, 1, 2, 3, 9)] == [300.0, 600.0, 1200.0, 2400.0, 2400.0]


def test_a_ref_comes_from_the_instance_key_even_when_the_id_holds_colons() -> None:
    ref = ref_of("1700000000123:match:eu:7")
    assert (ref.key, ref.session_id, ref.created_ms) == ("1700000000123:match:eu:7", "match:eu:7", 1700000000123)


def test_the_first_byte_timeout_doubles_with_each_silent_stream_in_a_row_up_to_eight_times() -> None:
    """A service too swamped to answer within 5 s gets 10, 20, then 40 s: reopening every 5 s
    would only add to its queue."""
    assert [first_byte_after(n, TUNING) for n in (0, 1, 2, 3, 9)] == [5.0, 10.0, 20.0, 40.0, 40.0]


# --- the open-file limit's room -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("streams", "soft_limit", "room"),
    [
        (100, 1024, 100),  # room to spare
        (5000, 1024, 256),  # a common default soft limit: (1024 - 512) / 2
        (5000, 10_512, 5000),  # exactly what the entry point raises it to for 5,000
        (5000, 10_511, 4999),
        (5000, OTHER_FILES, 0),  # the rest of the daemon takes everything
        (5000, 100, 0),  # never negative
        (0, 1024, 0),
        (5000, resource.RLIM_INFINITY, 5000),
    ],
)
def test_the_follows_are_capped_to_what_the_open_file_limit_leaves_room_for(
    streams: int, soft_limit: int, room: int
) -> None:
    assert streams_room(streams, soft_limit) == room


@pytest.mark.parametrize(
    ("streams", "soft_limit", "room"),
    [
        (5000, 15_512, 5000),  # what the entry point raises it to for 5,000: a seal per follow
        (5000, 10_512, 0),  # the follows take it all: each seal is synced at once
        (5000, 1024, 0),
        (0, 1024, 1024 - OTHER_FILES),  # `archiver archive`: no follows
        (5000, resource.RLIM_INFINITY, UNBOUNDED_SEALS),
    ],
)
def test_seals_are_held_for_their_upload_only_in_the_open_files_the_follows_leave(
    streams: int, soft_limit: int, room: int
) -> None:
    assert seals_room(streams, soft_limit) == room


@given(st.integers(min_value=0, max_value=10**6))
def test_a_limit_raised_to_the_files_a_follow_cap_needs_leaves_room_for_all_of_them(streams: int) -> None:
    assert streams_room(streams, files_for(streams)) == streams
    assert streams_room(streams + 1, files_for(streams)) == streams
