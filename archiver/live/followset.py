"""Which of the shard's active sessions to follow under the per-process cap (pure).

Every follow stream replays its session's log from the first line, so starting late loses nothing
as long as the stream is open when the session ends: what matters is being followed at the end.
Hence the rule when capped: a session already followed keeps its stream until it ends (no churn,
no second replay), and a free slot goes to the oldest unfollowed session (by creation time, then
id), the one likeliest to end next. Sessions that left the active list keep their slot while their
stream drains to its end, so the end of a session is never given up for a newer one.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SessionRef:
    """An active session to follow: the state DB's instance key (``{creation ms}:{id}``, see
    ``archive.state.rows.session_key``), its id and creation time."""

    key: str
    session_id: str
    created_ms: int


def ref_of(key: str) -> SessionRef:
    """The ref of an instance key ``{creation ms}:{id}`` (ids may hold ':', the time never does)."""
    ms, _, sid = key.partition(":")
    return SessionRef(key, sid, int(ms) if ms.lstrip("-").isdigit() else 0)


@dataclass(frozen=True, slots=True)
class Plan:
    """What to change after one poll: sessions to start following (oldest first), keys to drain
    (no longer active), and how many active sessions the cap leaves unfollowed."""

    start: tuple[SessionRef, ...]
    drain: tuple[str, ...]
    unfollowed: int


def plan(active: Iterable[SessionRef], held: AbstractSet[str], draining: AbstractSet[str], cap: int) -> Plan:
    """The change from the streams ``held`` (active or draining) to the shard's ``active`` sessions
    under ``cap`` streams in all. ``draining`` are held keys already draining."""
    wanted: dict[str, SessionRef] = {}
    for ref in active:
        wanted.setdefault(ref.key, ref)
    drain = tuple(sorted(key for key in held if key not in wanted and key not in draining))
    candidates: Sequence[SessionRef] = sorted(
        (ref for key, ref in wanted.items() if key not in held), key=lambda r: (r.created_ms, r.session_id)
    )
    free = max(0, cap - len(held))
    start = tuple(candidates[:free])
    return Plan(start=start, drain=drain, unfollowed=len(candidates) - len(start))
