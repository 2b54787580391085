"""In-process leases and claims of rows: the candidates a confirmer describes, the complete sessions
an upload worker writes manifests for, and the spooled items upload workers hold, right now.

Held in memory, never written to the state DB (issue 35: a lease or a claim was a commit per batch,
each rewriting the rows' pages, for a fact only this process cares about). A restart starts with
none, as `reset_in_flight` made of the leases once kept in `wake_at` and of the `uploading` status;
a worker thread that died holding some leases lets them go when they run out, and its claims when
it hands them back (its edge).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from pathlib import Path

from archiver.archive.state.connection import Connection
from archiver.archive.state.rows import SESSION_COLUMNS, SessionRow, session_row


class Leases:
    """Keys leased until a moment of the pipeline's monotonic clock (thread-safe)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._until: dict[str, float] = {}

    def held(self, now: float) -> frozenset[str]:
        """The keys whose lease runs past ``now`` (those that ran out are forgotten). Claims call it
        and `take` under `lock`, so two workers never lease one key."""
        self._until = {key: until for key, until in self._until.items() if until > now}
        return frozenset(self._until)

    def take(self, keys: Iterable[str], until: float) -> None:
        self._until.update(dict.fromkeys(keys, until))

    def release(self, keys: Iterable[str]) -> None:
        """The work on these keys is recorded (or handed back): they are due as the DB says again."""
        with self.lock:
            for key in keys:
                self._until.pop(key, None)

    def earliest_end(self, now: float) -> float | None:
        """When the first lease still running ends (None: none runs)."""
        with self.lock:
            ends = [until for until in self._until.values() if until > now]
        return min(ends, default=None)


class Claims:
    """Item rows (id, archive instance) claimed by a worker until it records their outcome or hands
    them back (thread-safe). The instance tells a re-opened session's new items, which may reuse a
    dropped item's id, from the claim a worker still holds on the old one."""

    def __init__(self) -> None:
        #: Re-entrant: a claim holds it across `held` and `take`, so two workers never claim one row.
        self.lock = threading.RLock()
        self._held: set[tuple[int, str]] = set()

    def held(self) -> frozenset[tuple[int, str]]:
        """What is claimed now."""
        with self.lock:
            return frozenset(self._held)

    def take(self, claims: Iterable[tuple[int, str]]) -> None:
        with self.lock:
            self._held.update(claims)

    def holds(self, item_id: int, instance: str | None) -> bool:
        """Whether the item is claimed (of ``instance``; None: of any)."""
        with self.lock:
            return any(i == item_id and instance in (None, inst) for i, inst in self._held)

    def release_item(self, item_id: int, instance: str | None) -> None:
        """Let go of the item's claim (of ``instance``; None: of any)."""
        with self.lock:
            self._held = {(i, inst) for i, inst in self._held if i != item_id or instance not in (None, inst)}

    def release(self, claims: Iterable[tuple[int, str]]) -> None:
        with self.lock:
            self._held.difference_update(claims)


class LeasedSessions(Connection):
    """The state DB connection with this process's leases of session rows and claims of item rows
    (see the module doc)."""

    def __init__(self, path: Path, *, readonly: bool = False) -> None:
        super().__init__(path, readonly=readonly)
        self.candidate_leases = Leases()
        self.finalize_leases = Leases()
        #: Spooled items an upload worker holds (their rows stay `spooled`: `ItemRepo.claim_uploads`).
        self.upload_claims = Claims()

    def _claim_due(
        self, leases: Leases, state: str, order: str, now: float, lease: float, limit: int
    ) -> list[SessionRow]:
        """Up to ``limit`` sessions in ``state`` due at ``now`` (monotonic) that no lease holds, in
        ``order`` (an ORDER BY of constant text), leased until ``now + lease``."""
        with leases.lock:
            held = leases.held(now)
            with self.read() as db:
                rows = db.execute(
                    f"SELECT {SESSION_COLUMNS} FROM sessions WHERE state = ? AND wake_at <= ? ORDER BY {order} LIMIT ?",
                    (state, now, limit + len(held)),
                ).fetchall()
            rows = [r for r in rows if r[0] not in held][:limit]
            leases.take((r[0] for r in rows), now + lease)
        return [session_row(r) for r in rows]

    def _next_due(self, state: str, leases: Leases, now: float) -> float | None:
        """When a session in ``state`` is due next: the earliest retry gate of those nobody holds, or
        the end of a lease still running."""
        with leases.lock:
            held = sorted(leases.held(now))
        with self.read() as db:
            value = db.execute(
                f"SELECT MIN(wake_at) FROM sessions WHERE state = ? AND key NOT IN ({','.join('?' * len(held))})",
                (state, *held),
            ).fetchone()[0]
        gates = [float(value)] if value is not None else []
        end = leases.earliest_end(now)
        return min([*gates, *([end] if end is not None else [])], default=None)
