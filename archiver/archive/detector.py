"""End detection as a pure function: one list poll against the instances known active → what to write, what is gone.

Plain data in, plain data out, the clock passed in: the pipeline applies the decisions (state DB,
wake-ups, logs); this module decides nothing else and touches nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass, field

from archiver.archive.state import session_key_of
from archiver.upstream.models import Session


@dataclass(frozen=True, slots=True)
class Decisions:
    """What one successful poll means for the state DB."""

    #: Listed, non-terminal instances by key.
    listed: dict[str, Session] = field(default_factory=dict)
    #: Listed instances that are new or whose stored metadata changed: written.
    upserts: list[Session] = field(default_factory=list)
    #: Known instances of ids left out of the poll by quarantine: still there, not ended.
    kept: dict[str, Session | None] = field(default_factory=dict)
    #: (key, last seen alive) of known instances absent from the list: they become candidates.
    gone: list[tuple[str, float | None]] = field(default_factory=list)
    #: Move the list mark (the last-seen time of every remaining active row) in this poll's transaction.
    touch_active: bool = False

    @property
    def known(self) -> dict[str, Session | None]:
        """The instances known active after this poll."""
        return {**self.kept, **self.listed}


def same_metadata(a: Session, b: Session) -> bool:
    """Whether the stored row of `a` is still right for `b`.

    Player count and status change all the time and are re-read from the describe at the end,
    so they alone never cost a write per poll.
    """
    if a is b:  # the poller's parser hands back the very same object for an unchanged entry
        return True
    return (
        a.image == b.image
        and a.tag == b.tag
        and a.location == b.location
        and a.host == b.host
        and a.created_ms == b.created_ms
        and a.labels == b.labels
    )


def key_id(key: str) -> str:
    """The session id of an instance key (`{creation ms}:{id}`)."""
    return key.partition(":")[2]


def observe(
    sessions: Sequence[Session],
    known: Mapping[str, Session | None],
    now: float,
    *,
    last_seen: Mapping[str, float],
    last_persisted: float,
    persist_interval: float,
    present_ids: Set[str] = frozenset(),
) -> Decisions:
    """Decide what one successful list poll changes.

    A listed entry with a terminal status counts as missing (the describe confirms it). Entries
    left out by the range checks (`present_ids`, quarantined) carry no trustworthy creation time:
    their known instances are matched by id and kept. `last_seen_active` of the remaining active
    rows is persisted at most every `persist_interval` seconds (`last_persisted`: when it last was).
    """
    listed: dict[str, Session] = {}
    upserts: list[Session] = []
    for s in sessions:
        if s.terminal:
            continue
        key = session_key_of(s)
        listed[key] = s
        old = known.get(key)
        if old is None or not same_metadata(old, s):
            upserts.append(s)
    kept = {key: known[key] for key in known if key not in listed and key_id(key) in present_ids}
    gone = [(key, last_seen.get(key)) for key in known if key not in listed and key not in kept]
    touch = now - last_persisted >= persist_interval
    return Decisions(listed=listed, upserts=upserts, kept=kept, gone=gone, touch_active=touch)
