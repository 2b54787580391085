"""The state DB's transparency log queue: archives committed but not yet logged, and each writer's last checkpoint."""

from __future__ import annotations

from collections.abc import Iterable

from archiver.archive.state.connection import Connection


class LogRepo(Connection):
    """Rows of ``log_pending`` (inserted with the session's ``archived`` mark, in that transaction)
    and ``log_state``."""

    def log_pending(self, limit: int) -> list[tuple[str, bytes]]:
        """The oldest unlogged archives: (session key, leaf bytes), in the order they were committed."""
        with self.read() as db:
            rows = db.execute(
                "SELECT session_key, entry FROM log_pending ORDER BY added_at, rowid LIMIT ?", (limit,)
            ).fetchall()
        return [(str(key), bytes(entry)) for key, entry in rows]

    def log_pending_count(self) -> int:
        with self.read() as db:
            return int(db.execute("SELECT COUNT(*) FROM log_pending").fetchone()[0])

    def log_oldest_pending(self) -> float | None:
        """When the oldest unlogged archive was committed (pipeline clock), None when none waits."""
        with self.read() as db:
            value = db.execute("SELECT MIN(added_at) FROM log_pending").fetchone()[0]
        return None if value is None else float(value)

    def add_log_pending(self, session_key: str, entry: bytes, now: float) -> None:
        """Queue one archive (``archiver log backfill``, tests); the pipeline queues with ``mark_archived``."""
        with self.write() as db:
            db.execute(
                "INSERT OR IGNORE INTO log_pending (session_key, entry, added_at) VALUES (?, ?, ?)",
                (session_key, entry, now),
            )

    def log_done(self, writer: str, session_keys: Iterable[str], checkpoint: bytes) -> None:
        """These archives are in the log whose last signed checkpoint is now ``checkpoint``: one transaction."""
        with self.write() as db:
            db.executemany("DELETE FROM log_pending WHERE session_key = ?", [(k,) for k in session_keys])
            db.execute(
                "INSERT INTO log_state (writer, checkpoint) VALUES (?, ?) "
                "ON CONFLICT (writer) DO UPDATE SET checkpoint = excluded.checkpoint",
                (writer, checkpoint),
            )

    def log_checkpoint(self, writer: str) -> bytes | None:
        """The last checkpoint this writer signed and recorded, None before its first."""
        with self.read() as db:
            row = db.execute("SELECT checkpoint FROM log_state WHERE writer = ?", (writer,)).fetchone()
        return None if row is None else bytes(row[0])
