"""Session rows of the state DB: what a poll records, candidates and their confirmation, ends, finalization."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Iterable, Sequence

from archiver.archive.state.connection import Connection
from archiver.archive.state.rows import (
    SESSION_COLUMNS,
    STATE_COLUMN,
    ArchivedMark,
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
from archiver.vocabulary import DETECTING_STATES, TERMINAL_STATES, SessionState


class SessionRepo(Connection):
    """Session rows: detection (poll, candidates, ends) and finalization."""

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
        become candidates (None keeps the stored last_seen_active). `touch_active`: also set
        last_seen_active=now on every remaining active row (done only every few polls: a stale
        value only makes a deadline earlier, never later).
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
                db.executemany(
                    """
                    UPDATE sessions SET state = 'candidate',
                        last_seen_active = COALESCE(?, last_seen_active),
                        first_seen_ended = ?, wake_at = 0, confirm_attempts = 0, not_found_at = NULL
                    WHERE key = ? AND state = 'active'
                    """,
                    [(seen, now, key) for key, seen in gone],
                )
            if touch_active:
                db.execute(
                    "UPDATE sessions SET last_seen_active = ? WHERE state = 'active' AND last_seen_active < ?",
                    (now, now),
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

    def archived_elsewhere(self, key: str, manifest_key: str, now: float) -> tuple[list[str], bool] | None:
        """Another replica (or the session's earlier owner) wrote this instance's manifest: the
        session is archived by it, and its items still open here are closed without fetching.
        Returns the spool files no longer needed and whether this call recorded it (False: another
        worker of this daemon already did, and closed the item this one holds too), or None when the
        session is no longer ended here (re-opened or failed meanwhile): then the caller fetches."""
        with self.write() as db:
            changed = db.execute(
                "UPDATE sessions SET state = 'archived', manifest_key = ?, archived_at = COALESCE(archived_at, ?), "
                "done_at = ?, wake_at = 0, last_error = NULL WHERE key = ? AND state IN ('ended', 'finalizing')",
                (manifest_key, now, now, key),
            ).rowcount
            if not changed:
                # Two fetch workers may hold two items of one session: the first closed them all.
                row = db.execute("SELECT state FROM sessions WHERE key = ?", (key,)).fetchone()
                return ([], False) if row is not None and row[0] == "archived" else None
            spooled = db.execute(
                "SELECT spool_path FROM items WHERE session_key = ? AND status != 'done' AND spool_path IS NOT NULL",
                (key,),
            ).fetchall()
            db.execute(
                "UPDATE items SET status = 'done', outcome = COALESCE(outcome, 'archived'), "
                "last_error = 'archived by another replica', spool_path = NULL "
                "WHERE session_key = ? AND status != 'done'",
                (key,),
            )
        return [r[0] for r in spooled], True

    def states_of(self, session_keys: Iterable[str]) -> dict[str, str]:
        """key → state of those of `session_keys` the DB knows."""
        found: dict[str, str] = {}
        with self.read() as db:
            for chunk in chunks(list(session_keys), 500):
                marks = ",".join("?" * len(chunk))
                found.update(db.execute(f"SELECT key, state FROM sessions WHERE key IN ({marks})", chunk).fetchall())
        return found

    def claim_candidates(self, now_mono: float, lease: float, limit: int) -> list[SessionRow]:
        """Candidates due for a describe; leased (`wake_at` moved) so another confirmer skips them."""
        with self.write(durable=False) as db:  # a lease: `reset_in_flight` zeroes every wake_at at start
            rows = db.execute(
                f"SELECT {SESSION_COLUMNS} FROM sessions WHERE state = 'candidate' AND wake_at <= ? "
                "ORDER BY first_seen_ended LIMIT ?",
                (now_mono, limit),
            ).fetchall()
            _lease(db, rows, now_mono + lease)
        return [session_row(r) for r in rows]

    def next_candidate_wake(self) -> float | None:
        return self._next_wake("candidate")

    def candidate_alive(self, key: str, now: float, retry_at: float) -> None:
        """The describe says it still runs (listed late?): seen alive now, check again at `retry_at`."""
        with self.write() as db:
            db.execute(
                "UPDATE sessions SET last_seen_active = MAX(COALESCE(last_seen_active, 0), ?), "
                "wake_at = ?, confirm_attempts = confirm_attempts + 1, last_error = NULL, not_found_at = NULL "
                "WHERE key = ? AND state = 'candidate'",
                (now, retry_at, key),
            )

    def candidate_retry(self, key: str, retry_at: float, error: str) -> None:
        """The describe failed (transient or not): try again at `retry_at`."""
        with self.write() as db:
            db.execute(
                "UPDATE sessions SET wake_at = ?, confirm_attempts = confirm_attempts + 1, last_error = ? "
                "WHERE key = ? AND state = 'candidate'",
                (retry_at, error[:500], key),
            )

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
            return self._end(db, key, described, deadline_for, items_for, now, backfill=backfill)

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

    def _next_wake(self, state: str) -> float | None:
        """The earliest `wake_at` of the sessions in `state` (None: there are none)."""
        with self.read() as db:
            value = db.execute("SELECT MIN(wake_at) FROM sessions WHERE state = ?", (state,)).fetchone()[0]
        return None if value is None else float(value)

    # --- finalization -----------------------------------------------------------------------

    def claim_finalize(self, now_mono: float, lease: float) -> SessionRow | None:
        """A complete session due for its manifest, leased so that no other worker takes it meanwhile."""
        rows = self.claim_finalizes(now_mono, lease, 1)
        return rows[0] if rows else None

    def claim_finalizes(self, now_mono: float, lease: float, limit: int) -> list[SessionRow]:
        """Up to `limit` complete sessions due for their manifests, leased in one (non-durable) commit.

        Ordered by retry gate, so a session whose finalization keeps failing (backed off) never
        keeps the others waiting.
        """
        # Upload workers ask before every item, and almost always nothing is due: a look on the
        # reader connection spares them the write lock (the claim below looks again, under it).
        with self.read() as db:
            due = db.execute(
                "SELECT 1 FROM sessions WHERE state = 'finalizing' AND wake_at <= ? LIMIT 1", (now_mono,)
            ).fetchone()
        if due is None:
            return []
        # The lease lives in wake_at, monotonic and reset at start-up: a crash may lose it.
        with self.write(durable=False) as db:
            rows = db.execute(
                f"SELECT {SESSION_COLUMNS} FROM sessions WHERE state = 'finalizing' AND wake_at <= ? "
                "ORDER BY wake_at, archived_at LIMIT ?",
                (now_mono, limit),
            ).fetchall()
            _lease(db, rows, now_mono + lease)
        return [session_row(r) for r in rows]

    def release_finalize(self, session_keys: Sequence[str]) -> None:
        """Hand back leased sessions not attempted (due again now); non-durable: a restart resets leases anyway."""
        if not session_keys:
            return
        with self.write(durable=False) as db:
            self._finalize_may_be_due()
            db.executemany(
                "UPDATE sessions SET wake_at = 0 WHERE key = ? AND state = 'finalizing'", [(k,) for k in session_keys]
            )

    def next_finalize_wake(self) -> float | None:
        return self._next_wake("finalizing")

    def finalize_retry(self, key: str, retry_at: float, error: str) -> int:
        """Finalization failed: try again at `retry_at`. Returns the attempts so far."""
        with self.write() as db:
            self._finalize_may_be_due()
            db.execute(
                "UPDATE sessions SET wake_at = ?, finalize_attempts = finalize_attempts + 1, last_error = ? "
                "WHERE key = ? AND state = 'finalizing'",
                (retry_at, error[:500], key),
            )
            row = db.execute("SELECT finalize_attempts FROM sessions WHERE key = ?", (key,)).fetchone()
        return int(row[0]) if row else 0

    def fail_session(self, key: str, reason: str, now: float) -> bool:
        """Give up on a session whose finalization kept failing past its deadline (kept for `status`)."""
        with self.write() as db:
            return bool(
                db.execute(
                    "UPDATE sessions SET state = 'failed', last_error = ?, done_at = ? "
                    "WHERE key = ? AND state = 'finalizing'",
                    (reason[:500], now, key),
                ).rowcount
            )

    def mark_archived(
        self, key: str, manifest_key: str, now: float | None = None, *, log_entry: bytes | None = None
    ) -> bool:
        """The session is archived; with ``log_entry``, its leaf is queued for the transparency log in
        the same transaction, so no crash can lose it between the manifest and the log."""
        return bool(self.mark_archived_many([ArchivedMark(key, manifest_key, now, log_entry)]))

    def mark_archived_many(self, marks: Sequence[ArchivedMark]) -> set[str]:
        """`mark_archived` for sessions whose manifests are written, in one transaction (a flood of
        endings: one commit per batch of manifests). Returns the keys marked (still finalizing)."""
        if not marks:
            return set()
        done: set[str] = set()
        with self.write() as db:
            for m in marks:
                if db.execute(
                    "UPDATE sessions SET state = 'archived', manifest_key = ?, done_at = COALESCE(?, archived_at), "
                    "last_error = NULL WHERE key = ? AND state = 'finalizing'",
                    (m.manifest_key, m.now, m.key),
                ).rowcount:
                    done.add(m.key)
                    if m.log_entry is not None:
                        db.execute(
                            "INSERT OR IGNORE INTO log_pending (session_key, entry, added_at) VALUES (?, ?, ?)",
                            (m.key, m.log_entry, m.now if m.now is not None else 0.0),
                        )
        return done

    def prune(self, before: float) -> int:
        """Forget terminal sessions (and their items) done before `before`: the store is the record."""
        marks = ",".join("?" * len(TERMINAL_STATES))
        with self.write() as db:
            return db.execute(
                f"DELETE FROM sessions WHERE state IN ({marks}) AND COALESCE(done_at, 0) < ?",
                (*TERMINAL_STATES, before),
            ).rowcount

    def last_archived_at(self) -> float | None:
        """When the newest manifest was written (restores the gauge after a restart)."""
        with self.read() as db:
            value = db.execute("SELECT MAX(done_at) FROM sessions WHERE state = 'archived'").fetchone()[0]
        return None if value is None else float(value)

    def failed_sessions(self) -> list[SessionRow]:
        """Sessions given up on (until pruned), newest first, for `archiver status`."""
        with self.read() as db:
            rows = db.execute(
                f"SELECT {SESSION_COLUMNS} FROM sessions WHERE state = 'failed' ORDER BY done_at DESC"
            ).fetchall()
        return [session_row(r) for r in rows]


def _lease(db: sqlite3.Connection, rows: Sequence[Sequence[object]], until: float) -> None:
    """Lease claimed session `rows` (key first) until `until`: another worker skips them meanwhile."""
    db.executemany("UPDATE sessions SET wake_at = ? WHERE key = ?", [(until, r[0]) for r in rows])
