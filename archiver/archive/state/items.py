"""Item rows of the state DB: the fetch and upload stages' claims and outcomes, start-up recovery, reports."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from pathlib import Path

from archiver.archive.state.leases import LeasedSessions
from archiver.archive.state.rows import (
    ITEM_COLUMNS,
    Backlog,
    ExtraItem,
    ItemRow,
    PendingItem,
    SpooledMark,
    StoredOutcome,
    chunks,
    item_row,
)
from archiver.vocabulary import OPEN_ITEM_STATUSES, ItemStatus, Outcome, SessionState


def _extra_values(e: ExtraItem, fetched_at: float, item_id: int) -> tuple[object, ...]:
    return (e.path, e.source, e.key, e.spool_path, e.size, e.sha256, e.content_type, fetched_at, e.capture, item_id)


#: An upload claimed (in memory, `leases.Claims`) or, in a DB an older archiver left, `uploading`.
_UPLOAD_CLAIMABLE = "status IN ('spooled', 'uploading')"


class ItemRepo(LeasedSessions):
    """Item rows: claims of the fetch and upload stages, outcomes, start-up recovery and reporting."""

    # --- items ------------------------------------------------------------------------------

    def items_of(self, key: str) -> list[ItemRow]:
        with self.read() as db:
            rows = db.execute(
                f"SELECT {ITEM_COLUMNS} FROM items WHERE session_key = ? ORDER BY kind DESC, path", (key,)
            ).fetchall()
        return [item_row(r) for r in rows]

    def claim_fetch(self, now_mono: float, skip: Callable[[ItemRow], bool] | None = None) -> ItemRow | None:
        """The pending item with the earliest deadline whose retry gate is open, now `fetching`."""
        claimed = self.claim_fetches(now_mono, 1, skip)
        return claimed[0] if claimed else None

    def claim_fetches(
        self, now_mono: float, limit: int, skip: Callable[[ItemRow], bool] | None = None
    ) -> list[ItemRow]:
        """Up to `limit` pending items whose retry gate is open, earliest deadline first, now `fetching`
        (one non-durable commit).

        ``skip``: items it is true for are passed over and stay as they are (a logs item waiting
        for its live capture): no write, no attempt counted. When every open item is skipped the
        transaction changed nothing, and its commit writes nothing.
        """
        with self.write(durable=False) as db:  # a lost claim is one recovery undoes anyway
            cursor = db.execute(
                f"SELECT {ITEM_COLUMNS} FROM items WHERE status = 'pending_fetch' AND not_before <= ? "
                "ORDER BY deadline, id" + ("" if skip else " LIMIT ?"),
                (now_mono,) if skip else (now_mono, limit),
            )
            rows = []
            for r in cursor:
                if skip is None or not skip(item_row(r)):
                    rows.append(r)
                    if len(rows) >= limit:
                        break
            cursor.close()
            db.executemany(
                "UPDATE items SET status = 'fetching', attempts = attempts + 1 WHERE id = ?", [(r[0],) for r in rows]
            )
        return [
            dataclasses.replace(item, status=ItemStatus.FETCHING, attempts=item.attempts + 1)
            for item in map(item_row, rows)
        ]

    def claim_upload(self, now_mono: float) -> ItemRow | None:
        """The spooled item with the earliest deadline whose retry gate is open, now `uploading`."""
        claimed = self.claim_uploads(now_mono, 1)
        return claimed[0] if claimed else None

    def claim_uploads(self, now_mono: float, limit: int) -> list[ItemRow]:
        """Up to `limit` spooled items whose retry gate is open and that no worker holds, earliest
        deadline first, claimed (returned as `uploading`).

        The claim is this process's (`leases.Claims`), not the row's: the row stays `spooled`
        until the outcome (issue 35: marking it `uploading` rewrote its pages, a third of a page per
        item, for a fact only this process cares about; a restart starts with no claim, which is
        what recovery made of `uploading`). Deadline order (then id), not id alone: it is the order
        of the `items_by_status` index, so the claim reads the first open entries instead of
        sorting every spooled item. Items of one session share their deadline, so they still go
        together, oldest first.
        """
        claims = self.upload_claims
        with claims.lock:
            held = claims.held()
            with self.read() as db:
                rows = db.execute(  # `uploading` is never claimed: recovery makes it `spooled` first
                    f"SELECT {ITEM_COLUMNS} FROM items WHERE status = 'spooled' AND not_before <= ? "
                    "ORDER BY deadline, id LIMIT ?",
                    (now_mono, limit + len(held)),
                ).fetchall()
            items = [item for item in map(item_row, rows) if (item.id, item.instance) not in held][:limit]
            claims.take((item.id, item.instance) for item in items)
        return [dataclasses.replace(item, status=ItemStatus.UPLOADING) for item in items]

    def release_uploads(self, items: Sequence[ItemRow]) -> None:
        """Claimed items a worker did not attempt are free for any worker again, their row (still
        `spooled`), retry gate and error untouched."""
        self.upload_claims.release((item.id, item.instance) for item in items)

    def _in_flight(self, item_id: int, instance: str | None) -> str:
        """The condition (SQL) that an item row is in flight for the caller: being fetched, or
        uploaded under this process's claim (of ``instance``; None: of any)."""
        claimed = self.upload_claims.holds(item_id, instance)
        return f"(status = 'fetching' OR {'1' if claimed else '0'} AND {_UPLOAD_CLAIMABLE})"

    def next_gate(self, status: ItemStatus, after: float | None = None) -> float | None:
        """The earliest retry gate (monotonic) among items in `status`, for a worker's wait; with
        ``after``, among the gates still closed then (the open ones are waiting for something else)."""
        with self.read() as db:
            value = db.execute(
                "SELECT MIN(not_before) FROM items WHERE status = ? AND (? IS NULL OR not_before > ?)",
                (status, after, after),
            ).fetchone()[0]
        return None if value is None else float(value)

    def unclaim_item(self, item_id: int, *, not_before: float) -> None:
        """A claimed item that turned out to be waiting (its live capture still follows) goes back
        to `pending_fetch` as it was: the claim's attempt taken back, its error kept, not fsynced
        (a crash puts it back all the same)."""
        with self.write(durable=False) as db:
            db.execute(
                "UPDATE items SET status = 'pending_fetch', attempts = MAX(0, attempts - 1), not_before = ? "
                "WHERE id = ? AND status = 'fetching'",
                (not_before, item_id),
            )

    def mark_spooled(
        self,
        item_id: int,
        *,
        spool_path: str,
        size: int,
        sha256: str,
        content_type: str,
        source: str,
        key: str,
        fetched_at: float,
        capture: str | None = None,
        extras: Sequence[ExtraItem] = (),
    ) -> None:
        """The fetched item is in the spool; ``extras`` (more logs items of its session, spooled
        too) are added in the same transaction, so its session never looks complete without them."""
        self.mark_spooled_many(
            [
                SpooledMark(
                    item_id, spool_path, size, sha256, content_type, source, key, fetched_at, capture, tuple(extras)
                )
            ]
        )

    def mark_spooled_many(self, marks: Sequence[SpooledMark]) -> None:
        """`mark_spooled` for fetched items whose spool files are durable, in one transaction (a
        flood of endings: one commit per fetch batch, issue 35)."""
        if not marks:
            return
        with self.write() as db:
            for m in marks:
                db.executemany(
                    "INSERT OR IGNORE INTO items (session_key, session_id, instance, kind, path, status, deadline, "
                    "source, key, spool_path, size, sha256, content_type, fetched_at, capture) "
                    "SELECT session_key, session_id, instance, kind, ?, 'spooled', deadline, ?, ?, ?, ?, ?, ?, ?, ? "
                    "FROM items WHERE id = ? AND status = 'fetching'",
                    [_extra_values(e, m.fetched_at, m.item_id) for e in m.extras],
                )
                db.execute(
                    "UPDATE items SET status = 'spooled', spool_path = ?, size = ?, sha256 = ?, "
                    "content_type = ?, source = ?, key = ?, fetched_at = ?, capture = ?, not_before = 0, "
                    "last_error = NULL WHERE id = ? AND status = 'fetching'",
                    (m.spool_path, m.size, m.sha256, m.content_type, m.source, m.key, m.fetched_at, m.capture,
                     m.item_id),
                )  # fmt: skip

    def retry_item(
        self, item_id: int, *, status: ItemStatus, not_before: float, error: str, instance: str | None = None
    ) -> None:
        """Back to `status` (pending_fetch or spooled), not to be picked before `not_before`; an
        upload's claim (of ``instance``) is let go.

        Only an item still in flight moves: an error raised after the item's final write (a gauge
        refresh, a metrics call) must not undo an outcome that is already committed.
        """
        with self.write() as db:
            db.execute(
                "UPDATE items SET status = ?, not_before = ?, last_error = ?"
                f" WHERE id = ? AND {self._in_flight(item_id, instance)} AND (? IS NULL OR instance = ?)",
                (status, not_before, error[:500], item_id, instance, instance),
            )
        self.upload_claims.release_item(item_id, instance)

    def finish_item(
        self,
        item_id: int,
        outcome: Outcome,
        *,
        now: float,
        error: str | None = None,
        source: str | None = None,
        key: str | None = None,
        spool_path: str | None = None,
        instance: str | None = None,
        stored: tuple[int, str] | None = None,
    ) -> bool:
        """The in-flight item reached its outcome. True when that completed its session, which is
        then `finalizing` with `archived_at=now` fixed in the same transaction.

        A re-open drops a session's unfinished items and its real end creates new ones, which SQLite
        may give the very same ids: only an item still in flight (and, given `instance`, of that
        archive instance) takes the outcome, so a worker still holding a dropped item changes nothing.
        `stored` replaces the item's size and sha256 with those of the object found at its key.
        """
        # A claim is let go once the outcome is committed (a failed commit keeps it for the retry).
        completed = self._finish_item(item_id, outcome, now, error, source, key, spool_path, instance, stored)
        self.upload_claims.release_item(item_id, instance)
        return completed

    def _finish_item(
        self,
        item_id: int,
        outcome: Outcome,
        now: float,
        error: str | None,
        source: str | None,
        key: str | None,
        spool_path: str | None,
        instance: str | None,
        stored: tuple[int, str] | None,
    ) -> bool:
        with self.write() as db:
            found = db.execute(
                f"SELECT session_key FROM items WHERE id = ? AND {self._in_flight(item_id, instance)} "
                "AND (? IS NULL OR instance = ?)",
                (item_id, instance, instance),
            ).fetchone()
            if found is None:  # dropped meanwhile: its session was re-opened
                return False
            size, sha256 = stored if stored is not None else (None, None)
            db.execute(
                "UPDATE items SET status = 'done', outcome = ?, last_error = ?, "
                "source = COALESCE(?, source), key = COALESCE(?, key), spool_path = ?, "
                "size = COALESCE(?, size), sha256 = COALESCE(?, sha256) WHERE id = ?",
                (outcome, error[:500] if error else None, source, key, spool_path, size, sha256, item_id),
            )
            skey = found[0]
            open_left = db.execute(
                "SELECT COUNT(*) FROM items WHERE session_key = ? AND status != 'done'", (skey,)
            ).fetchone()[0]
            if open_left:
                return False
            changed = db.execute(
                "UPDATE sessions SET state = 'finalizing', archived_at = ?, wake_at = 0 "
                "WHERE key = ? AND state = 'ended'",
                (now, skey),
            ).rowcount
            if changed:
                self._finalize_may_be_due()
        return bool(changed)

    def finish_uploads(self, stored: Sequence[StoredOutcome], now: float) -> tuple[set[int], list[str]]:
        """Several uploaded items are `archived`, in one transaction: one fsync for all of them (the
        upload stage's group commit, `archive/outcomes.py`). Returns the ids of the items that took the
        outcome, and the spool paths that may go now.

        As in `finish_item`, only an item still in flight of the same instance takes the outcome, and
        a session whose last open item this was becomes `finalizing` with `archived_at=now`. A spool
        file may go when its item took the outcome, or when no open row refers to it any more (its
        item was dropped by a re-open); one still referred to (its item was put back to `spooled`
        meanwhile, or a new item reuses the id) stays.
        """
        if not stored:
            return set(), []
        # Claims are let go once the outcomes are committed: a failed commit keeps them for its retry.
        result = self._finish_uploads(stored, now)
        self.upload_claims.release((s.item_id, s.instance) for s in stored)
        return result

    def _finish_uploads(self, stored: Sequence[StoredOutcome], now: float) -> tuple[set[int], list[str]]:
        # Only items this process claimed: a row re-created by a re-open (another instance) or
        # put back to fetch is not the one uploaded.
        claimed = self.upload_claims.held()
        mine = [s for s in stored if (s.item_id, s.instance) in claimed]
        applied: dict[int, str] = {}
        with self.write() as db:
            for chunk in chunks(mine, 400):
                pairs = ",".join(["(?, ?)"] * len(chunk))
                values = [v for s in chunk for v in (s.item_id, s.instance)]
                applied.update(
                    db.execute(
                        # Only an upload in flight: a row put back to fetch meanwhile must not take an
                        # outcome (and a size and sha256) recorded for other bytes.
                        f"SELECT id, session_key FROM items WHERE {_UPLOAD_CLAIMABLE} "
                        f"AND (id, instance) IN (VALUES {pairs})",
                        values,
                    ).fetchall()
                )
            for ids in chunks(list(applied), 800):
                db.execute(
                    "UPDATE items SET status = 'done', outcome = 'archived', last_error = NULL, spool_path = NULL "
                    f"WHERE id IN ({','.join('?' * len(ids))})",
                    ids,
                )
            for skeys in chunks(sorted(set(applied.values())), 800):
                if db.execute(
                    "UPDATE sessions SET state = 'finalizing', archived_at = ?, wake_at = 0 "
                    f"WHERE key IN ({','.join('?' * len(skeys))}) AND state = 'ended' AND NOT EXISTS "
                    "(SELECT 1 FROM items WHERE items.session_key = sessions.key AND items.status != 'done')",
                    (now, *skeys),
                ).rowcount:
                    self._finalize_may_be_due()
            others = [s for s in stored if s.item_id not in applied]
            in_use: set[str] = set()
            for chunk in chunks(others, 400):
                paths = [s.spool_path for s in chunk]
                ids = [s.item_id for s in chunk]
                in_use.update(
                    r[0]
                    for r in db.execute(
                        f"SELECT spool_path FROM items WHERE spool_path IN ({','.join('?' * len(paths))}) "
                        "AND status IN ('spooled', 'uploading')",
                        paths,
                    )
                )
                # Spool files are named by item id: an open item reusing the id (a re-open dropped the
                # old one, the real end made it anew) may be fetching into that very name right now.
                reused = {
                    r[0]
                    for r in db.execute(
                        f"SELECT id FROM items WHERE id IN ({','.join('?' * len(ids))}) AND status != 'done'", ids
                    )
                }
                in_use.update(s.spool_path for s in chunk if s.item_id in reused)
        return set(applied), [s.spool_path for s in stored if s.item_id in applied or s.spool_path not in in_use]

    # --- start-up ---------------------------------------------------------------------------

    def reset_in_flight(self) -> tuple[int, int]:
        """After a restart: fetching → pending_fetch, uploading → spooled, every retry gate open.

        Returns (fetches reset, uploads reset).
        """
        with self.write() as db:
            fetches = db.execute("UPDATE items SET status = 'pending_fetch' WHERE status = 'fetching'").rowcount
            uploads = db.execute("UPDATE items SET status = 'spooled' WHERE status = 'uploading'").rowcount
            db.execute("UPDATE items SET not_before = 0 WHERE not_before != 0")
            db.execute("UPDATE sessions SET wake_at = 0 WHERE wake_at != 0")
            self._finalize_may_be_due()
        return fetches, uploads

    def relocate_spool(self, directory: Path) -> int:
        """Points every recorded spool file at `directory` by its name (a spool file is named by its
        item alone): a state dir moved, copied or mounted elsewhere keeps its spooled bodies instead
        of fetching them again, which fails once the upstream has removed them. Returns rows moved."""
        prefix = str(directory) + os.sep
        with self.write() as db:
            rows = db.execute(
                "SELECT id, spool_path FROM items WHERE spool_path IS NOT NULL AND substr(spool_path, 1, ?) != ?",
                (len(prefix), prefix),
            ).fetchall()
            db.executemany(
                "UPDATE items SET spool_path = ? WHERE id = ?",
                [(str(directory / Path(path).name), item_id) for item_id, path in rows],
            )
        return len(rows)

    def spool_paths_in_use(self) -> set[str]:
        with self.read() as db:
            return {
                r[0]
                for r in db.execute(
                    "SELECT spool_path FROM items WHERE status IN ('spooled', 'uploading') AND spool_path IS NOT NULL"
                )
            }

    # --- reporting --------------------------------------------------------------------------

    def backlog(self) -> Backlog:
        marks = ",".join("?" * len(OPEN_ITEM_STATUSES))
        with self.read() as db:
            counts: dict[str, int] = {}
            next_deadline: float | None = None
            spool = 0
            for status, count, deadline, size in db.execute(
                f"SELECT status, COUNT(*), MIN(deadline), SUM(COALESCE(size, 0)) FROM items "
                f"WHERE status IN ({marks}) GROUP BY status",
                OPEN_ITEM_STATUSES,
            ):
                counts[status] = count
                if status in (ItemStatus.PENDING_FETCH, ItemStatus.FETCHING) and deadline is not None:
                    next_deadline = deadline if next_deadline is None else min(next_deadline, deadline)
                if status in (ItemStatus.SPOOLED, ItemStatus.UPLOADING):
                    spool += int(size or 0)
            states = dict(
                db.execute(
                    "SELECT state, COUNT(*) FROM sessions WHERE state IN ('candidate', 'finalizing', 'failed') "
                    "GROUP BY state"
                ).fetchall()
            )
        return Backlog(
            pending_fetch=counts.get(ItemStatus.PENDING_FETCH, 0) + counts.get(ItemStatus.FETCHING, 0),
            pending_upload=counts.get(ItemStatus.SPOOLED, 0) + counts.get(ItemStatus.UPLOADING, 0),
            next_fetch_deadline=next_deadline,
            spool_bytes=spool,
            candidates=int(states.get(SessionState.CANDIDATE, 0)),
            finalizing=int(states.get(SessionState.FINALIZING, 0)),
            failed=int(states.get(SessionState.FAILED, 0)),
        )

    def pending_items(self, now: float) -> list[PendingItem]:
        """Every unfinished item, earliest deadline first."""
        marks = ",".join("?" * len(OPEN_ITEM_STATUSES))
        with self.read() as db:
            rows = db.execute(
                f"SELECT session_id, instance, kind, path, status, deadline, attempts, last_error FROM items "
                f"WHERE status IN ({marks}) ORDER BY deadline, id",
                OPEN_ITEM_STATUSES,
            ).fetchall()
        result = []
        for sid, instance, kind, path, status, deadline, attempts, error in rows:
            fetch = status in (ItemStatus.PENDING_FETCH, ItemStatus.FETCHING)
            result.append(
                PendingItem(
                    session_id=sid,
                    instance=instance,
                    kind=kind,
                    path=path,
                    stage="fetch" if fetch else "upload",
                    status=status,
                    deadline=deadline,
                    time_left=deadline - now if fetch else None,
                    attempts=attempts,
                    last_error=error,
                )
            )
        return result

    def outcome_counts(self) -> dict[tuple[str, str], int]:
        """(kind, outcome) → items, over the whole DB (tests and the demo summary)."""
        with self.read() as db:
            return {
                (kind, outcome): count
                for kind, outcome, count in db.execute(
                    "SELECT kind, outcome, COUNT(*) FROM items WHERE status = 'done' GROUP BY kind, outcome"
                )
            }
