"""The words the archive writes and compares: session states, item statuses and item outcomes.

They are StrEnums, so each member *is* its stored string: rows in the state DB, manifests, index
entries and metric labels keep exactly the bytes they had when these were bare strings. SQL
statements spell the same values as literals (see archiver.archive.state.schema).
"""

from __future__ import annotations

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
