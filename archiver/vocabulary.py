"""The words the archive writes and compares: session states, item statuses and item outcomes.

They are StrEnums, so each member *is* its stored string: rows in the state DB, manifests, index
entries and metric labels keep exactly the bytes they had when these were bare strings. SQL
statements spell the same values as literals (see archiver.archive.state.schema).
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum


class SessionState(StrEnum):
    """Where a session instance is in the state DB (`sessions.state`).

    active → candidate → ended → finalizing → archived, or failed; skipped on a first start
    without backfill. A re-listed row goes back to candidate (re-open).
    """

    ACTIVE = "active"
    CANDIDATE = "candidate"
    ENDED = "ended"
    FINALIZING = "finalizing"
    ARCHIVED = "archived"
    FAILED = "failed"
    SKIPPED = "skipped"


class ItemStatus(StrEnum):
    """Where one item (logs or an artifact) is in the pipeline (`items.status`)."""

    PENDING_FETCH = "pending_fetch"
    FETCHING = "fetching"
    SPOOLED = "spooled"
    UPLOADING = "uploading"
    DONE = "done"


class Outcome(StrEnum):
    """How a `done` item ended (`items.outcome`, the manifest's `outcome`, index entry counts)."""

    ARCHIVED = "archived"
    SOURCE_GONE = "source_gone"
    TOO_LARGE = "too_large"
    EXPIRED = "expired"
    CONFLICT = "conflict"
    FAILED = "failed"


#: States a session row never leaves by itself (pruned after `prune_after`).
TERMINAL_STATES: tuple[SessionState, ...] = (SessionState.ARCHIVED, SessionState.FAILED, SessionState.SKIPPED)
#: States a session is still being detected in (not ended yet as far as we know).
DETECTING_STATES: tuple[SessionState, ...] = (SessionState.ACTIVE, SessionState.CANDIDATE)
#: Item statuses of unfinished work.
OPEN_ITEM_STATUSES: tuple[ItemStatus, ...] = (
    ItemStatus.PENDING_FETCH,
    ItemStatus.FETCHING,
    ItemStatus.SPOOLED,
    ItemStatus.UPLOADING,
)
#: Every outcome's value, in the order manifests and `ls` list them (plain strings: error messages show them).
OUTCOMES: tuple[str, ...] = tuple(o.value for o in Outcome)


class Standing(StrEnum):
    """How an item's outcome stands for the evidence, as every reader shows it (`ls`, `show`, the
    browser): kept; absent (an artifact path that simply was not in that container, e.g. no crash
    folder in a match that did not crash); not kept by policy (too large); or evidence lost."""

    KEPT = "kept"
    ABSENT = "absent"
    POLICY = "policy"
    LOST = "lost"


def standing(outcome: str, item_kind: str | None = None) -> Standing:
    """The one decision of how an outcome reads. ``source_gone`` of the logs is lost evidence (the
    service no longer had them); of an artifact path, an absent optional path. ``item_kind`` None
    (an index entry's counts, which do not say the kind): source_gone reads as an absent path, the
    common case (the manifest tells logs apart)."""
    if outcome == Outcome.ARCHIVED:
        return Standing.KEPT
    if outcome == Outcome.SOURCE_GONE and item_kind != "logs":
        return Standing.ABSENT
    return Standing.POLICY if outcome == Outcome.TOO_LARGE else Standing.LOST


def outcome_words(outcome: str, item_kind: str | None) -> str:
    """An item's outcome in words, as `show` and the browser's session page say it."""
    match standing(outcome, item_kind):
        case Standing.ABSENT:
            return "not present in this container (source_gone)"
        case Standing.LOST if outcome == Outcome.SOURCE_GONE:
            return "source_gone: the service no longer had the logs"
    return str(outcome)


def standings(counts: Mapping[str, int]) -> list[tuple[str, Standing, int]]:
    """An index entry's item counts as (outcome, standing, count), in OUTCOMES order, zeros left
    out. The entry does not say an item's kind, so source_gone reads as an absent path, the common
    case (the manifest, which `show` and the session page read, tells lost logs apart)."""
    return [(outcome, standing(outcome), counts[outcome]) for outcome in OUTCOMES if counts.get(outcome)]
