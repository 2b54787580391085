"""The session list's query and its pages: `archiver ls`'s filters (player and session id too), paged both ways.

Pages are keyset pages over the list order (newest end first, then id, then instance): a page
after the cursor ``before`` holds older sessions, one before the cursor ``after`` newer ones, so
paging never repeats or skips an entry while archives are added. The index is read in windows of
index hours growing from the cursor, so a page of recent sessions reads one or two partitions.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from archiver.browse import params as p
from archiver.layout.manifest import LATEST_TIME, IndexEntry
from archiver.retrieval.query import list_sessions, parse_label, parse_time_range
from archiver.store.base import ObjectStore

log = logging.getLogger("archiver.browse")

#: The first list window (one index hour partition); each further window doubles, so a page of
#: recent sessions reads one or two partitions while a rare filter still reaches back quickly.
FIRST_WINDOW = 3600.0

#: A keyset position in the list: ``(ended_at, session_id, instance or "")``.
Cursor = tuple[float, str, str]


@dataclass(frozen=True)
class ListQuery:
    """The list filters as typed (kept for the form and the paging links) and as parsed."""

    since_text: str
    until_text: str
    image: str | None
    location: str | None
    label_texts: tuple[str, ...]
    since: float
    until: float | None
    labels: Mapping[str, str]
    #: Only sessions this player took part in (the player index, as `archiver ls --player`).
    player: str | None = None
    #: Only session ids containing this text (case-insensitive).
    session: str | None = None
    #: Keyset cursor: the last entry of the newer page (this page holds older sessions) ...
    before: Cursor | None = None
    #: ... or the first entry of the older page (this page holds newer sessions).
    after: Cursor | None = None

    def filter_pairs(self) -> list[tuple[str, str]]:
        """The filters as query pairs, for the links of this list's other pages."""
        pairs = [
            ("since", self.since_text),
            ("until", self.until_text),
            ("image", self.image or ""),
            ("location", self.location or ""),
            ("player", self.player or ""),
            ("session", self.session or ""),
        ]
        return pairs + [("label", text) for text in self.label_texts]

    def with_session(self, entries: list[IndexEntry]) -> list[IndexEntry]:
        """The ``entries`` whose id contains ``session`` (case-insensitive); all of them without one."""
        if not self.session:
            return entries
        needle = self.session.casefold()
        return [e for e in entries if needle in e.session_id.casefold()]


def _cursor(params: p.Params, name: str) -> Cursor | None:
    text = p.one(params, name, limit=32)
    if not text:
        return None
    try:
        at = float(text)
    except ValueError:
        raise ValueError(f"{name}: not a time: {text!r}") from None
    if not math.isfinite(at) or not 0 <= at <= LATEST_TIME:  # the index's years, 1970..9999
        raise ValueError(f"{name}: not a time: {text!r}")
    return at, p.one(params, f"{name}_id", strip=False), p.one(params, f"{name}_instance", strip=False)


def parse_list_query(params: p.Params, now: float) -> ListQuery:
    """The list's query string; ``ValueError`` naming the bad field."""
    since_text, until_text = p.one(params, "since", limit=64), p.one(params, "until", limit=64)
    since, until = parse_time_range(since_text or None, until_text or None, now)
    label_texts = p.many(params, "label")
    labels = dict(parse_label(v) for v in label_texts)
    before, after = _cursor(params, "before"), _cursor(params, "after")
    if before is not None and after is not None:
        raise ValueError("before and after: give one cursor, not both")
    return ListQuery(
        since_text,
        until_text,
        p.one(params, "image") or None,
        p.one(params, "location") or None,
        label_texts,
        since,
        until,
        labels,
        player=p.one(params, "player") or None,
        session=p.one(params, "session") or None,
        before=before,
        after=after,
    )


def order(entry: IndexEntry) -> Cursor:
    """The list's sort key: newest end first, then id, then instance (a reused id may end twice at once)."""
    return (-entry.ended_at, entry.session_id, entry.instance or "")


def cursor_of(entry: IndexEntry) -> Cursor:
    return (entry.ended_at, entry.session_id, entry.instance or "")


def _key(cursor: Cursor) -> Cursor:
    return (-cursor[0], cursor[1], cursor[2])


@dataclass(frozen=True)
class ListPage:
    """One page of the list, newest first, and whether a newer or an older page exists."""

    entries: list[IndexEntry]
    newer: bool
    older: bool


Window = tuple[float, float | None]


def _windows_down(top: float, since: float, first_upper: float | None) -> Iterator[Window]:
    """Disjoint ``[start, upper]`` windows walking back from ``top`` to ``since``, doubling in width."""
    start = max(since, math.floor(top / FIRST_WINDOW) * FIRST_WINDOW)
    upper, width = first_upper, FIRST_WINDOW
    while True:
        yield start, upper
        if start <= since:
            return
        # `until` is inclusive: the largest float below this window's start keeps the next one disjoint.
        upper = math.nextafter(start, -math.inf)
        width *= 2
        start = max(since, start - width)


def _windows_up(bottom: float, until: float | None, now: float) -> Iterator[Window]:
    """Disjoint windows walking forward from ``bottom``; the last ends at ``until`` (open when ``None``)."""
    top = until if until is not None else now
    start, end, width = bottom, (math.floor(bottom / FIRST_WINDOW) + 1) * FIRST_WINDOW, FIRST_WINDOW
    while end < top:
        yield start, math.nextafter(end, -math.inf)
        start, width = end, width * 2
        end = start + width
    yield start, until


def page_sessions(store: ObjectStore, query: ListQuery, *, limit: int, now: float) -> ListPage:
    """Up to ``limit`` sessions of the query next to its cursor (the newest without one), newest first.

    ``archiver.retrieval.query.list_sessions`` over growing windows walking away from the
    cursor; with a player, one read of the player index over the range (its cost grows with the
    player's matches, not with the windows).
    """

    def fetch(window: Window, cap: int | None) -> list[IndexEntry]:
        found = list_sessions(
            store,
            since=window[0],
            until=window[1],
            image=query.image,
            location=query.location,
            labels=query.labels,
            # A substring filter is applied here, after the listing: the listing's limit cannot count it.
            limit=None if query.session else cap,
            now=now,
            player=query.player,
            warn=log.warning,
        )
        return query.with_session(found)

    if query.after is not None:
        return _page_newer(fetch, query, query.after, limit=limit, now=now)
    top = query.until if query.until is not None else max(now, query.since)
    upper = query.until
    if query.before is not None:
        top = upper = min(top, query.before[0])
    windows = [(query.since, upper)] if query.player else _windows_down(top, query.since, upper)
    cursor = None if query.before is None else _key(query.before)
    found: list[IndexEntry] = []
    for first, window in enumerate(windows):
        # With a cursor, the ties at its time must all be seen to skip the shown ones: no limit then.
        batch = fetch(window, None if cursor is not None and first == 0 else limit + 1 - len(found))
        found.extend(e for e in batch if cursor is None or order(e) > cursor)
        if len(found) > limit:
            break
    found.sort(key=order)
    return ListPage(found[:limit], newer=query.before is not None, older=len(found) > limit)


def _page_newer(
    fetch: Callable[[Window, int | None], list[IndexEntry]], query: ListQuery, after: Cursor, *, limit: int, now: float
) -> ListPage:
    """The ``limit`` sessions just newer than ``after``, newest first (windows walk forward from it)."""
    bottom = max(query.since, after[0])
    windows = [(bottom, query.until)] if query.player else _windows_up(bottom, query.until, now)
    cursor = _key(after)
    found: list[IndexEntry] = []
    for window in windows:
        # Forward windows are read whole: a listing's limit keeps the newest, and these need the oldest.
        found.extend(e for e in fetch(window, None) if order(e) < cursor)
        if len(found) > limit:
            break
    found.sort(key=order)
    return ListPage(found[-limit:] if limit else [], newer=len(found) > limit, older=True)
