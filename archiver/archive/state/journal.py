"""The store's multipart-upload journal, kept in the state DB so an upload resumes after a restart."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from archiver.archive.state.connection import Connection
from archiver.store.base import JournalEntry


class SqliteJournal:
    """The store's MultipartJournal on the state DB: every call is a committed transaction.

    `on_part_done` (set by the pipeline) runs after a part's row is committed; the crash point
    `after_part_upload` hangs there, since the store itself has no hook.
    """

    def __init__(self, db: Connection) -> None:
        self._db = db
        self.on_part_done: Callable[[], None] | None = None

    def get(self, key: str) -> JournalEntry | None:
        with self._db.read() as conn:
            row = conn.execute(
                "SELECT upload_id, sha256, part_size FROM multipart_uploads WHERE key = ?", (key,)
            ).fetchone()
            if row is None:
                return None
            parts = dict(conn.execute("SELECT number, etag FROM multipart_parts WHERE key = ?", (key,)).fetchall())
        return JournalEntry(upload_id=row[0], sha256=row[1], part_size=row[2], parts=parts)

    def start(self, key: str, upload_id: str, *, sha256: str, part_size: int) -> None:
        with self._db.write() as conn:
            conn.execute("DELETE FROM multipart_parts WHERE key = ?", (key,))
            conn.execute(
                "INSERT OR REPLACE INTO multipart_uploads (key, upload_id, sha256, part_size) VALUES (?, ?, ?, ?)",
                (key, upload_id, sha256, part_size),
            )

    def part_done(self, key: str, number: int, etag: str) -> None:
        # Without an fsync: a part record lost with the OS (never with the process: it is in the
        # WAL) only means sending that part again on resume. Synced, each 8 MiB part waited for the
        # disk, which the server's own writes keep busy, and a large upload went far slower.
        with self._db.write(durable=False) as conn:
            conn.execute(
                "INSERT OR REPLACE INTO multipart_parts (key, number, etag) VALUES (?, ?, ?)",
                (key, number, etag),
            )
        if self.on_part_done is not None:
            self.on_part_done()

    def finish(self, key: str) -> None:
        with self._db.write() as conn:
            conn.execute("DELETE FROM multipart_parts WHERE key = ?", (key,))
            conn.execute("DELETE FROM multipart_uploads WHERE key = ?", (key,))

    def upload_ids(self) -> set[str]:
        """Upload ids in progress: what the orphan sweep must keep."""
        with self._db.read() as conn:
            return {r[0] for r in conn.execute("SELECT upload_id FROM multipart_uploads")}

    def entries(self) -> Iterable[tuple[str, str]]:
        with self._db.read() as conn:
            return list(conn.execute("SELECT key, upload_id FROM multipart_uploads ORDER BY key"))
