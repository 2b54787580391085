"""The deadline rule: by when an ended session's items must be fetched, before the upstream removes it."""

from __future__ import annotations

from archiver.archive.state import SessionRow


def deadline_for(row: SessionRow, *, retention: float, margin: float, now: float) -> float:
    """Fetch deadline of an ended session: last seen alive + retention - margin.

    Never later than the real removal. For a session never seen alive (backfilled, or found by
    reconciliation) the creation time bounds its end from below, so that bound is safe; when it
    has passed already, the upstream still holding the session (it was just listed or described
    as ended, at `now`) is all we know: allow a short window rather than giving up unseen.
    """
    if row.last_seen_active is not None:
        return row.last_seen_active + retention - margin
    bound = (row.created or 0.0) + retention - margin
    return max(bound, now + max(margin, 60.0))
