"""Session rows past their items: finalization (to `archived` or `failed`), another replica's archive, pruning."""

from __future__ import annotations

from collections.abc import Sequence

from archiver.archive.state.leases import LeasedSessions
from archiver.archive.state.rows import SESSION_COLUMNS, ArchivedMark, SessionRow, session_row
from archiver.vocabulary import TERMINAL_STATES


class FinalizeRepo(LeasedSessions):
    """Session rows whose items all have an outcome (or another replica's archive): leased for their
    manifests, marked archived or failed, then forgotten; and what `status` and the gauges read of them."""

    def claim_finalize(self, now_mono: float, lease: float) -> SessionRow | None:
        """A complete session due for its manifest, leased so that no other worker takes it meanwhile."""
        rows = self.claim_finalizes(now_mono, lease, 1)
        return rows[0] if rows else None

    def claim_finalizes(self, now_mono: float, lease: float, limit: int) -> list[SessionRow]:
        """Up to `limit` complete sessions due for their manifests, leased (in memory: `leases`).

        Ordered by retry gate, so a session whose finalization keeps failing (backed off) never
        keeps the others waiting.
        """
        return self._claim_due(self.finalize_leases, "finalizing", "wake_at, archived_at", now_mono, lease, limit)

    def release_finalize(self, session_keys: Sequence[str]) -> None:
        """Hand back leased sessions not attempted (due again now)."""
        if session_keys:
            self.finalize_leases.release(session_keys)
            self._finalize_changed()

    def next_finalize_wake(self, now_mono: float) -> float | None:
        """When a manifest is due next: a retry gate, or the end of a lease another worker holds."""
        return self._next_due("finalizing", self.finalize_leases, now_mono)

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
        self.finalize_leases.release([key])
        return int(row[0]) if row else 0

    def fail_session(self, key: str, reason: str, now: float) -> bool:
        """Give up on a session whose finalization kept failing past its deadline (kept for `status`)."""
        with self.write() as db:
            failed = db.execute(
                "UPDATE sessions SET state = 'failed', last_error = ?, done_at = ? "
                "WHERE key = ? AND state = 'finalizing'",
                (reason[:500], now, key),
            ).rowcount
        self.finalize_leases.release([key])
        return bool(failed)

    def mark_archived(
        self, key: str, manifest_key: str, now: float | None = None, *, log_entry: bytes | None = None
    ) -> bool:
        """The session is archived; with ``log_entry``, its leaf is queued for the transparency log in
        the same transaction, so no crash can lose it between the manifest and the log."""
        return bool(self.mark_archived_many([ArchivedMark(key, manifest_key, now, log_entry)]))

    def mark_archived_many(self, marks: Sequence[ArchivedMark]) -> set[str]:
        """`mark_archived` for sessions whose manifests are written, in one transaction (a flood of
        endings: one commit per batch of manifests). Returns the keys marked (still finalizing).

        Not synced on its own (the next durable commit syncs it): the manifests are in the store, and
        should a machine crash lose the mark, the next start writes them again byte for byte (the
        create-once store takes them as already there) and queues the same log leaves."""
        if not marks:
            return set()
        done: set[str] = set()
        with self.write(durable=False) as db:
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
        self.finalize_leases.release(m.key for m in marks)
        return done

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
