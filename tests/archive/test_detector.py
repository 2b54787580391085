"""The pure parts of end detection: one poll against the known instances, and the deadline rule."""

from __future__ import annotations

from dataclasses import replace

from archiver.archive.deadline import deadline_for
from archiver.archive.detector import observe
from archiver.archive.state import SessionRow, session_key_of
from archiver.upstream.models import Session

RUNNING = Session(
    id="sess-1", image="demo-game", tag="1.1.0", location="eu-west-1", host="203.0.113.7",
    created_ms=1_700_000_000_000, status="running", player_count=2, labels={"mode": "duel"},
)  # fmt: skip
KEY = session_key_of(RUNNING)


def test_a_new_session_is_written_and_an_unchanged_one_is_not() -> None:
    first = observe([RUNNING], {}, 100.0, last_seen={}, last_persisted=90.0, persist_interval=30.0)
    assert first.upserts == [RUNNING] and first.known == {KEY: RUNNING} and first.gone == []
    churn = replace(RUNNING, player_count=9)
    again = observe([churn], first.known, 101.0, last_seen={KEY: 100.0}, last_persisted=90.0, persist_interval=30.0)
    assert again.upserts == [] and again.touch_active is False


def test_an_absent_or_terminal_session_is_gone_with_its_last_seen_time() -> None:
    known: dict[str, Session | None] = {KEY: RUNNING}
    absent = observe([], known, 100.0, last_seen={KEY: 95.0}, last_persisted=0.0, persist_interval=30.0)
    assert absent.gone == [(KEY, 95.0)] and absent.known == {}
    ended = replace(RUNNING, status="exited")
    terminal = observe([ended], known, 100.0, last_seen={}, last_persisted=0.0, persist_interval=30.0)
    assert terminal.gone == [(KEY, None)]


def test_a_quarantined_id_keeps_its_known_instances() -> None:
    decisions = observe(
        [], {KEY: RUNNING}, 100.0, last_seen={}, last_persisted=0.0, persist_interval=30.0, present_ids={"sess-1"}
    )
    assert decisions.gone == [] and decisions.known == {KEY: RUNNING}


def test_last_seen_is_persisted_once_per_interval() -> None:
    early = observe([RUNNING], {}, 100.0, last_seen={}, last_persisted=80.0, persist_interval=30.0)
    due = observe([RUNNING], {}, 110.0, last_seen={}, last_persisted=80.0, persist_interval=30.0)
    assert early.touch_active is False and due.touch_active is True


def _row(last_seen: float | None, created: float) -> SessionRow:
    return SessionRow(
        key=KEY, id="sess-1", instance="", image="demo-game", tag="1.1.0", location="eu-west-1", host="",
        created=created, labels={}, players=(), player_count=0, status="ended", state="candidate",
        last_seen_active=last_seen, first_seen_ended=None, fetch_deadline=None, archived_at=None,
        manifest_key=None, revision=0, finalize_attempts=0, last_error=None,
    )  # fmt: skip


def test_the_deadline_is_last_seen_alive_plus_retention_minus_margin() -> None:
    assert deadline_for(_row(1000.0, 0.0), retention=14400.0, margin=600.0, now=5000.0) == 1000.0 + 14400.0 - 600.0


def test_a_session_never_seen_alive_is_bounded_by_its_creation_or_given_a_short_window() -> None:
    assert deadline_for(_row(None, 2000.0), retention=14400.0, margin=600.0, now=3000.0) == 2000.0 + 13800.0
    assert deadline_for(_row(None, 0.0), retention=14400.0, margin=600.0, now=50000.0) == 50000.0 + 600.0
