"""The durable state DB (SQLite): sessions, archive items, multipart journal; every SQL statement lives here.

One writer connection guarded by a lock; each public write method is one `BEGIN IMMEDIATE`
transaction that has committed (WAL, `synchronous=FULL`: on disk) before the method returns, so
a caller may act on it (delete a spool file, tell the store) only afterwards. Readers (`status`,
gauges) use their own connection: WAL lets them run beside the writer.

Two clocks appear in rows. Deadlines and timestamps (`deadline`, `last_seen_active`, ...) are in the
pipeline's clock (epoch seconds). Retry gates (`not_before`, `wake_at`) are `time.monotonic()`
values of the running process only: `reset_in_flight()` zeroes them at start-up, which is exactly
"retry everything now" after a restart and keeps a frozen or jumping test clock from stalling
backoffs.

A row is one session *instance*: the same caller-chosen id with another creation time is another
row (`key` = `{creation ms}:{id}`), archived under its own `instance` in the store layout ('' for
rows migrated mid-way from schema 1, which keep the legacy layout).

Session states: `active` (listed) → `candidate` (absent from a successful list, to be confirmed)
→ `ended` (confirmed; items exist) → `finalizing` (every item has an outcome; `archived_at`
fixed so a re-written manifest is byte-identical) → `archived` (manifest and index stored), or
`failed` (finalization kept failing past the deadline). `skipped`: ended sessions found on the
very first start with backfill turned off. A row that is listed again after it was taken for
ended is re-opened (`revision` + 1, a new instance name), so its real end is archived too.
Terminal rows (`archived`, `failed`, `skipped`) are pruned after a while: the store is the record.
Item statuses: `pending_fetch` → `fetching` → `spooled` → `done` (with an outcome). An upload's
claim is held in memory (`leases.Claims`), the row staying `spooled`; `uploading` is found only in
a DB an older archiver left, and start-up recovery makes it `spooled`.
"""

from __future__ import annotations

from pathlib import Path

from archiver.archive.state.finalize import FinalizeRepo
from archiver.archive.state.items import ItemRepo
from archiver.archive.state.journal import SqliteJournal
from archiver.archive.state.logqueue import LogRepo
from archiver.archive.state.rows import (
    ArchivedMark,
    Backlog,
    ExtraItem,
    ItemRow,
    NewItem,
    PendingItem,
    Reopened,
    SessionRow,
    SpooledMark,
    StoredOutcome,
    created_ms_of,
    layout_instance,
    session_key,
    session_key_of,
)
from archiver.archive.state.schema import BUSY_TIMEOUT_MS, DB_NAME, PAGE_SIZE, SCHEMA_VERSION
from archiver.archive.state.sessions import SessionRepo
from archiver.vocabulary import TERMINAL_STATES, SessionState

__all__ = [
    "BUSY_TIMEOUT_MS",
    "DB_NAME",
    "PAGE_SIZE",
    "SCHEMA_VERSION",
    "TERMINAL_STATES",
    "ArchivedMark",
    "Backlog",
    "ExtraItem",
    "ItemRow",
    "NewItem",
    "PendingItem",
    "Reopened",
    "SessionRow",
    "SpooledMark",
    "SqliteJournal",
    "StateDB",
    "StoredOutcome",
    "created_ms_of",
    "layout_instance",
    "read_status",
    "session_key",
    "session_key_of",
]


class StateDB(SessionRepo, FinalizeRepo, ItemRepo, LogRepo):
    """The state DB of one archiver (`{state_dir}/state.db`): session and item repositories on one
    connection pair, and the multipart journal. Thread-safe."""

    def __init__(self, path: Path, *, readonly: bool = False) -> None:
        super().__init__(path, readonly=readonly)
        self.journal = SqliteJournal(self)

    def attention_items(self, now: float) -> list[PendingItem]:
        """`archiver status`: every unfinished item, then every session given up on (stage `failed`)."""
        failed = [
            PendingItem(
                session_id=row.id,
                instance=row.instance,
                kind="session",
                path="",
                stage="failed",
                status=SessionState.FAILED,
                deadline=row.fetch_deadline or 0.0,
                time_left=None,
                attempts=row.finalize_attempts,
                last_error=row.last_error,
            )
            for row in self.failed_sessions()
        ]
        return [*self.pending_items(now), *failed]


def read_status(state_dir: Path, now: float) -> list[PendingItem]:
    """`archiver status` without a running pipeline: read the state DB beside the daemon."""
    state = StateDB.open_readonly(state_dir)
    try:
        return state.attention_items(now)
    finally:
        state.close()
