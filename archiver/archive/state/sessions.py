"""Session rows of the state DB up to their end: what a poll records, candidates and their confirmation, ends."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Iterable, Sequence

from archiver.archive.state.leases import LeasedSessions
from archiver.archive.state.rows import (
    SESSION_COLUMNS,
    STATE_COLUMN,
    NewItem,
    Reopened,
    SessionRow,
    chunks,
    created_ms_of,
    labels_json,
    layout_instance,
    session_key_of,
    session_row,
)
from archiver.upstream.models import Session
from archiver.vocabulary import DETECTING_STATES, SessionState

#: A row's last-seen time or the list mark's (`schema.LIST_MARK_TABLE`), the later; NULL if neither.
_MARK = "(SELECT at FROM list_mark WHERE id = 1)"
_SEEN_OR_MARK = f"MAX(COALESCE(last_seen_active, {_MARK}), COALESCE({_MARK}, last_seen_active))"


class SessionRepo(LeasedSessions):
    """Session rows: detection (poll, candidates, ends) and looking sessions up."""

    # --- detection --------------------------------------------------------------------------

    def record_poll(
        self,
        upserts: Sequence[Session],
        gone: Sequence[tuple[str, float | None]],
        now: float,
        *,
        touch_active: bool,
    ) -> Reopened:
        """One successful list poll, in one transaction. Returns what it re-opened.

        `upserts`: listed (non-terminal) sessions that are new or whose metadata changed; they
        re-activate candidates, and re-open rows taken for ended meanwhile (a false end: their
        unfinished work is dropped, `revision` + 1 and a new instance name, so the real end gets an
        archive of its own). `gone`: (key, last seen) of sessions known active but absent: they
        become candidates (None: the stored last_seen_active or the list mark, the later).
        `touch_active`: also move the list mark to now, which stands for the last-seen time of
        every row still active (`schema.LIST_MARK_TABLE`; done only every few polls: a stale value
        only makes a deadline earlier, never later).
        """
        rows = [
            (
                session_key_of(s), s.id, layout_instance(s.created_ms), s.image, s.tag, s.location, s.host,
                s.created_seconds, labels_json(s), s.player_count, s.status, now,
            )
            for s in upserts
        ]  # fmt: skip
        reopened = Reopened()
        with self.write() as db:
            if rows:
                reopened = self._reopen(db, [r[0] for r in rows])
                db.executemany(
                    """
                    INSERT INTO sessions (key, id, instance, image, tag, location, host, created, labels,
                                          player_count, status, state, last_seen_active)
                    VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'active', ?)
                    ON CONFLICT (key) DO UPDATE SET
                        image = excluded.image, tag = excluded.tag, location = excluded.location,
                        host = excluded.host, labels = excluded.labels,
                        player_count = excluded.player_count, status = excluded.status,
                        state = 'active', last_seen_active = excluded.last_seen_active,
                        first_seen_ended = NULL, wake_at = 0, confirm_attempts = 0, not_found_at = NULL
                    WHERE sessions.state IN ('active', 'candidate')
                    """,
                    rows,
                )
            if gone:
                # Without a time seen (not in this process's memory: listed before a restart), the
                # later of the row's own and the list mark's: it was listed at the mark.
                db.executemany(
                    f"""
                    UPDATE sessions SET state = 'candidate',
                        last_seen_active = COALESCE(?, {_SEEN_OR_MARK}),
                        first_seen_ended = ?, wake_at = 0, confirm_attempts = 0, not_found_at = NULL
                    WHERE key = ? AND state = 'active'
                    """,
                    [(seen, now, key) for key, seen in gone],
                )
            if touch_active:
                db.execute(
                    "INSERT INTO list_mark (id, at) VALUES (1, ?) "
                    "ON CONFLICT (id) DO UPDATE SET at = MAX(at, excluded.at)",
                    (now,),
                )
        return reopened

    @staticmethod
    def _reopen(db: sqlite3.Connection, session_keys: Sequence[str]) -> Reopened:
        """Re-open the rows of `session_keys` that are past their end (see record_poll)."""
        spool_paths: list[str] = []
        reopened: list[str] = []
        for chunk in chunks(session_keys, 500):
            marks = ",".join("?" * len(chunk))
            found = db.execute(
                f"SELECT key, created, revision FROM sessions WHERE key IN ({marks}) "
                "AND state NOT IN ('active', 'candidate')",
                chunk,
            ).fetchall()
            for key, created, revision in found:
                spool_paths += [
                    r[0]
                    for r in db.execute(
                        "SELECT spool_path FROM items WHERE session_key = ? AND spool_path IS NOT NULL "
                        "AND status != 'done'",
                        (key,),
                    )
                ]
                db.execute("DELETE FROM items WHERE session_key = ?", (key,))
                db.execute(
                    "UPDATE sessions SET state = 'candidate', revision = ?, instance = ?, fetch_deadline = NULL, "
                    "archived_at = NULL, manifest_key = NULL, done_at = NULL, finalize_attempts = 0, "
                    "last_error = NULL WHERE key = ?",
                    (revision + 1, layout_instance(created_ms_of(created), revision + 1), key),
                )
                reopened.append(key)
        return Reopened(tuple(reopened), tuple(spool_paths))

    def active_session_keys(self) -> list[str]:
        with self.read() as db:
            return [r[0] for r in db.execute("SELECT key FROM sessions WHERE state = 'active'")]

    def hand_over(self, session_keys: Iterable[str]) -> int:
        """Forget these sessions while still `active` (another shard owns them now: it archives them
        when they end). Rows already ended stay: their work is finished here."""
        removed = 0
        with self.write() as db:
            for chunk in chunks(list(session_keys), 500):
                marks = ",".join("?" * len(chunk))
                removed += db.execute(
                    f"DELETE FROM sessions WHERE state = 'active' AND key IN ({marks})", chunk
                ).rowcount
        return removed

    def states_of(self, session_keys: Iterable[str]) -> dict[str, str]:
        """key → state of those of `session_keys` the DB knows."""
        found: dict[str, str] = {}
        with self.read() as db:
            for chunk in chunks(list(session_keys), 500):
                marks = ",".join("?" * len(chunk))
                found.update(db.execute(f"SELECT key, state FROM sessions WHERE key IN ({marks})", chunk).fetchall())
        return found

    def claim_candidates(self, now_mono: float, lease: float, limit: int) -> list[SessionRow]:
        """Candidates due for a describe, leased (in memory: `leases`) so another confirmer skips them."""
        return self._claim_due(self.candidate_leases, "candidate", "first_seen_ended", now_mono, lease, limit)

    def next_candidate_wake(self, now_mono: float) -> float | None:
        """When a candidate is due next: its retry gate, or the end of a lease another confirmer holds."""
        return self._next_due("candidate", self.candidate_leases, now_mono)

    def candidate_alive(self, key: str, now: float, retry_at: float) -> None:
        """The describe says it still runs (listed late?): seen alive now, check again at `retry_at`."""
        with self.write() as db:
            db.execute(
                "UPDATE sessions SET last_seen_active = MAX(COALESCE(last_seen_active, 0), ?), "
                "wake_at = ?, confirm_attempts = confirm_attempts + 1, last_error = NULL, not_found_at = NULL "
                "WHERE key = ? AND state = 'candidate'",
                (now, retry_at, key),
            )
        self.candidate_leases.release([key])

    def candidate_retry(self, key: str, retry_at: float, error: str) -> None:
        """The describe failed (transient or not): try again at `retry_at`."""
        with self.write() as db:
            db.execute(
                "UPDATE sessions SET wake_at = ?, confirm_attempts = confirm_attempts + 1, last_error = ? "
                "WHERE key = ? AND state = 'candidate'",
                (retry_at, error[:500], key),
            )
        self.candidate_leases.release([key])

    def candidate_not_found(self, key: str, now: float, retry_at: float) -> float:
        """The API's own 404 for a candidate: returns when it first said so (the end needs it twice)."""
        with self.write() as db:
            db.execute(
                "UPDATE sessions SET not_found_at = COALESCE(not_found_at, ?), wake_at = ?, "
                "confirm_attempts = confirm_attempts + 1, last_error = 'describe answered 404' "
                "WHERE key = ? AND state = 'candidate'",
                (now, retry_at, key),
            )
            row = db.execute("SELECT not_found_at FROM sessions WHERE key = ?", (key,)).fetchone()
        self.candidate_leases.release([key])
        return float(row[0]) if row is not None and row[0] is not None else now

    def end_session(
        self,
        key: str,
        *,
        described: Session | None,
        deadline_for: Callable[[SessionRow], float],
        items_for: Callable[[SessionRow], Sequence[NewItem]],
        now: float,
        backfill: bool = False,
    ) -> SessionRow | None:
        """Confirmed ended: store the describe's metadata, fix the deadline and create the items, at once.

        `deadline_for(row)` / `items_for(row)` compute the fetch deadline and the items from the
        (updated) row. Returns the row, or None when the session was not a candidate (re-listed
        meanwhile, already ended) — or, with `backfill`, when it is already past its end. An
        instance unknown to the DB is created from `described` (with `backfill` only).
        """
        with self.write() as db:
            row = self._end(db, key, described, deadline_for, items_for, now, backfill=backfill)
        self.candidate_leases.release([key])
        return row

    def end_sessions(
        self,
        ends: Sequence[tuple[str, Session | None]],
        *,
        deadline_for: Callable[[SessionRow], float],
        items_for: Callable[[SessionRow], Sequence[NewItem]],
        now: float,
    ) -> list[SessionRow]:
        """`end_session` for many confirmed candidates (key, describe) in one transaction: a flood
        of endings costs one commit per confirmation batch, not one per session (issue 35). Returns
        the rows that ended (the others were no candidates any more)."""
        if not ends:
            return []
        with self.write() as db:
            rows = [
                self._end(db, key, described, deadline_for, items_for, now, backfill=False) for key, described in ends
            ]
        self.candidate_leases.release(key for key, _ in ends)
        return [row for row in rows if row is not None]

    def add_candidates(self, ended: Sequence[Session], now: float) -> int:
        """Sessions found ended that the DB has never seen (reconciliation): candidates, to be
        described and ended like any other. Returns how many were new."""
        return self._insert_unseen(ended, "candidate", now, done_at=None)

    def skip_sessions(self, ended: Sequence[Session], now: float) -> int:
        """Record ended sessions as `skipped` (first start without backfill): never archived, pruned later."""
        return self._insert_unseen(ended, "skipped", now, done_at=now)

    def _insert_unseen(self, ended: Sequence[Session], state: str, now: float, *, done_at: float | None) -> int:
        with self.write() as db:
            return db.executemany(
                "INSERT OR IGNORE INTO sessions (key, id, instance, image, tag, location, host, created, labels, "
                "player_count, status, state, first_seen_ended, done_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    (
                        session_key_of(s),
                        s.id,
                        layout_instance(s.created_ms),
                        s.image,
                        s.tag,
                        s.location,
                        s.host,
                        s.created_seconds,
                        labels_json(s),
                        s.player_count,
                        s.status,
                        state,
                        now,
                        done_at,
                    )
                    for s in ended
                ],
            ).rowcount

    def _end(
        self,
        db: sqlite3.Connection,
        key: str,
        described: Session | None,
        deadline_for: Callable[[SessionRow], float],
        items_for: Callable[[SessionRow], Sequence[NewItem]],
        now: float,
        *,
        backfill: bool,
    ) -> SessionRow | None:
        found = db.execute(f"SELECT {SESSION_COLUMNS} FROM sessions WHERE key = ?", (key,)).fetchone()
        allowed = DETECTING_STATES if backfill else (SessionState.CANDIDATE,)
        if found is None:
            if not backfill or described is None:
                return None
            db.execute(
                "INSERT INTO sessions (key, id, instance, image, tag, location, host, created, labels, player_count, "
                "status, state, first_seen_ended) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'candidate', ?)",
                (
                    key, described.id, layout_instance(described.created_ms), described.image, described.tag,
                    described.location, described.host, described.created_seconds, labels_json(described),
                    described.player_count, described.status, now,
                ),
            )  # fmt: skip
        elif found[STATE_COLUMN] not in allowed:
            return None
        if described is not None:
            db.execute(
                "UPDATE sessions SET image = ?, tag = ?, location = ?, host = ?, "
                "labels = ?, players = ?, player_count = ?, status = ? WHERE key = ?",
                (
                    described.image, described.tag, described.location, described.host,
                    labels_json(described), json.dumps(list(described.players or ())),
                    described.player_count, described.status, key,
                ),
            )  # fmt: skip
        row = session_row(db.execute(f"SELECT {SESSION_COLUMNS} FROM sessions WHERE key = ?", (key,)).fetchone())
        deadline = deadline_for(row)
        items = items_for(row)
        db.execute(
            "UPDATE sessions SET state = 'ended', fetch_deadline = ?, "
            "first_seen_ended = COALESCE(first_seen_ended, ?), wake_at = 0, last_error = NULL "
            "WHERE key = ?",
            (deadline, now, key),
        )
        db.executemany(
            "INSERT OR IGNORE INTO items (session_key, session_id, instance, kind, path, status, deadline, source) "
            "VALUES (?, ?, ?, ?, ?, 'pending_fetch', ?, ?)",
            [(key, row.id, row.instance, i.kind, i.path, deadline, i.source) for i in items],
        )
        if not items:
            # Nothing to fetch at all: the session is complete as soon as it ended.
            db.execute("UPDATE sessions SET state = 'finalizing', archived_at = ? WHERE key = ?", (now, key))
            self._finalize_may_be_due()
        final = db.execute(f"SELECT {SESSION_COLUMNS} FROM sessions WHERE key = ?", (key,)).fetchone()
        return session_row(final)

    # --- looking sessions up -----------------------------------------------------------------

    def session(self, key: str) -> SessionRow | None:
        with self.read() as db:
            row = db.execute(f"SELECT {SESSION_COLUMNS} FROM sessions WHERE key = ?", (key,)).fetchone()
        return None if row is None else session_row(row)

    def latest(self, sid: str) -> SessionRow | None:
        """The newest instance of a session id (None when the DB has none)."""
        rows = self.sessions_by_id(sid)
        return rows[0] if rows else None

    def sessions_by_id(self, sid: str) -> list[SessionRow]:
        """Every instance of a session id, newest creation first."""
        with self.read() as db:
            rows = db.execute(
                f"SELECT {SESSION_COLUMNS} FROM sessions WHERE id = ? ORDER BY created DESC, revision DESC", (sid,)
            ).fetchall()
        return [session_row(r) for r in rows]

    def sessions_in(self, state: str) -> list[SessionRow]:
        with self.read() as db:
            rows = db.execute(
                f"SELECT {SESSION_COLUMNS} FROM sessions WHERE state = ? ORDER BY key", (state,)
            ).fetchall()
        return [session_row(r) for r in rows]
