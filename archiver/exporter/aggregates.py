"""Session counts by (image, location, status, tag) and player sums by (image, location, tag): the
aggregate families' data, computed in C over a whole list or moved by the sessions that changed."""

from __future__ import annotations

import operator
from collections import Counter
from collections.abc import Callable, Collection

from archiver.upstream.models import Session

#: Session counts by (image, location, status, tag) and player sums by (image, location, tag).
Aggregates = tuple[dict[tuple[str, str, str, str], int], dict[tuple[str, str, str], int]]

#: Aggregate keys, in label-name order so rendered labels come out sorted.
_AGGREGATE_FIELDS: Callable[[Session], tuple[str, str, str, str]] = operator.attrgetter(
    "image", "location", "status", "tag"
)
_GROUP_FIELDS: Callable[[Session], tuple[str, str, str]] = operator.attrgetter("image", "location", "tag")
_PLAYERS_FIELD: Callable[[Session], int | None] = operator.attrgetter("player_count")


class Aggregator:
    """Session counts by (image, location, status, tag) and player sums by (image, location, tag),
    kept up to date by removing and adding the sessions that changed (see `aggregate`)."""

    def __init__(self) -> None:
        self.counts: Counter[tuple[str, str, str, str]] = Counter()
        self.players: dict[tuple[str, str, str], int] = {}
        #: Sessions per player group: a group is dropped with its last session.
        self.groups: Counter[tuple[str, str, str]] = Counter()

    def rebuild(self, sessions: Collection[Session]) -> None:
        counts, players = aggregate(sessions)
        self.counts = Counter(counts)
        self.players = players
        self.groups = Counter()
        for (image, location, _, tag), n in counts.items():
            self.groups[image, location, tag] += n

    def add(self, session: Session) -> None:
        key = _AGGREGATE_FIELDS(session)
        self.counts[key] += 1
        group = (key[0], key[1], key[3])
        self.groups[group] += 1
        self.players[group] = self.players.get(group, 0) + (session.player_count or 0)

    def remove(self, session: Session) -> None:
        key = _AGGREGATE_FIELDS(session)
        self.counts[key] -= 1
        if not self.counts[key]:
            del self.counts[key]
        group = (key[0], key[1], key[3])
        self.groups[group] -= 1
        if self.groups[group]:
            self.players[group] -= session.player_count or 0
        else:
            del self.groups[group], self.players[group]

    def result(self) -> Aggregates:
        return dict(self.counts), dict(self.players)


def aggregate(sessions: Collection[Session]) -> Aggregates:
    """Session counts by (image, location, status, tag) and player sums by (image, location, tag).

    Keys are in label-name order so the rendered labels come out sorted. A group whose sessions all
    lack a player count still gets a players sample (0): the group exists, its known players are 0.
    """
    # Counter's C helper does the counting; only the player sums need a Python loop.
    counts: dict[tuple[str, str, str, str], int] = Counter(map(_AGGREGATE_FIELDS, sessions))
    players: dict[tuple[str, str, str], int] = dict.fromkeys(((im, loc, tag) for im, loc, _, tag in counts), 0)
    for group, count in zip(map(_GROUP_FIELDS, sessions), map(_PLAYERS_FIELD, sessions), strict=True):
        if count:
            players[group] += count
    return dict(counts), players
