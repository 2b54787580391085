"""What the state DB's rows are in Python: session and item rows, instance keys, and their decoding."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from archiver.layout import keys
from archiver.upstream.models import Session


def created_ms_of(created_seconds: float | None) -> int:
    """Whole milliseconds of a creation time in seconds (the epsilon absorbs float error of * 1000)."""
    return math.floor((created_seconds or 0.0) * 1000.0 + 1e-3)


def session_key(sid: str, created_ms: float) -> str:
    """The state DB key of one session instance: `{creation ms}:{id}` (ms first: ids may hold ':')."""
    return f"{math.floor(created_ms + 1e-3)}:{sid}"


def session_key_of(session: Session) -> str:
    return session_key(session.id, session.created_ms)


def layout_instance(created_ms: float, revision: int = 0) -> str:
    """The instance segment of the store layout: creation time, plus `-r{n}` after a re-open."""
    return keys.instance_name(math.floor(created_ms + 1e-3), revision)


@dataclass(frozen=True, slots=True)
class SessionRow:
    """One session instance as the state DB knows it."""

    key: str
    id: str
    instance: str
    image: str
    tag: str
    location: str
    host: str
    created: float | None
    labels: Mapping[str, str]
    players: tuple[str, ...]
    player_count: int | None
    status: str
    state: str
    last_seen_active: float | None
    first_seen_ended: float | None
    fetch_deadline: float | None
    archived_at: float | None
    manifest_key: str | None
    revision: int = 0
    last_error: str | None = None
    finalize_attempts: int = 0
    not_found_at: float | None = None

    @property
    def created_ms(self) -> int:
        return created_ms_of(self.created)


@dataclass(frozen=True, slots=True)
class ItemRow:
    """One archive item: a session's logs or one artifact path."""

    id: int
    session_key: str
    session_id: str
    instance: str
    kind: str
    path: str
    status: str
    outcome: str | None
    attempts: int
    last_error: str | None
    deadline: float
    source: str
    key: str | None
    spool_path: str | None
    size: int | None
    sha256: str | None
    content_type: str | None
    fetched_at: float | None
    #: A logs item filled from a live capture: how complete it was (`archiver.live.policy.Finish`).
    capture: str | None = None


@dataclass(frozen=True, slots=True)
class Reopened:
    """Rows a poll re-opened (listed again after they were taken for ended), and the spool files
    of their dropped work, to delete now that the commit no longer refers to them."""

    keys: tuple[str, ...] = ()
    spool_paths: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class StoredOutcome:
    """An uploaded item whose `archived` outcome waits for the upload stage's group commit."""

    item_id: int
    instance: str
    spool_path: str


@dataclass(frozen=True, slots=True)
class ExtraItem:
    """A logs item added when another one is spooled (a live capture kept beside the after-end
    body): already spooled, it is uploaded like any other."""

    path: str
    source: str
    key: str
    spool_path: str
    size: int
    sha256: str
    content_type: str
    capture: str | None


@dataclass(frozen=True, slots=True)
class SpooledMark:
    """A fetched item whose spool file is durable, to be marked `spooled` (with its extra logs items)."""

    item_id: int
    spool_path: str
    size: int
    sha256: str
    content_type: str
    source: str
    key: str
    fetched_at: float
    capture: str | None = None
    extras: tuple[ExtraItem, ...] = ()


@dataclass(frozen=True, slots=True)
class ArchivedMark:
    """A session whose manifest is written, to be marked `archived` (with its transparency log leaf)."""

    key: str
    manifest_key: str
    now: float | None = None
    log_entry: bytes | None = None


@dataclass(frozen=True, slots=True)
class NewItem:
    """An item to create when a session's end is confirmed."""

    kind: str
    path: str
    source: str


@dataclass(frozen=True, slots=True)
class PendingItem:
    """A not yet finished item, for `archiver status` (time_left is None once fetched: no deadline)."""

    session_id: str
    instance: str
    kind: str
    path: str
    stage: str  # fetch | upload
    status: str
    deadline: float
    time_left: float | None
    attempts: int
    last_error: str | None


@dataclass(frozen=True, slots=True)
class Backlog:
    """What the gauges show: items per stage, the earliest fetch deadline, spooled bytes."""

    pending_fetch: int
    pending_upload: int
    next_fetch_deadline: float | None
    spool_bytes: int
    candidates: int
    finalizing: int
    failed: int = 0

    @property
    def idle(self) -> bool:
        return not (self.pending_fetch or self.pending_upload or self.candidates or self.finalizing)


SESSION_COLUMNS = (
    "key, id, instance, image, tag, location, host, created, labels, players, player_count, status, state, "
    "last_seen_active, first_seen_ended, fetch_deadline, archived_at, manifest_key, revision, last_error, "
    "finalize_attempts, not_found_at"
)
STATE_COLUMN = 12
ITEM_COLUMNS = (
    "id, session_key, session_id, instance, kind, path, status, outcome, attempts, last_error, deadline, "
    "source, key, spool_path, size, sha256, content_type, fetched_at, capture"
)


def session_row(r: Sequence[Any]) -> SessionRow:
    return SessionRow(
        key=r[0],
        id=r[1],
        instance=r[2],
        image=r[3],
        tag=r[4],
        location=r[5],
        host=r[6],
        created=r[7],
        labels=json.loads(r[8]),
        players=tuple(json.loads(r[9])),
        player_count=r[10],
        status=r[11],
        state=r[12],
        last_seen_active=r[13],
        first_seen_ended=r[14],
        fetch_deadline=r[15],
        archived_at=r[16],
        manifest_key=r[17],
        revision=r[18],
        last_error=r[19],
        finalize_attempts=r[20],
        not_found_at=r[21],
    )


def item_row(r: Sequence[Any]) -> ItemRow:
    return ItemRow(*r)


_T = TypeVar("_T")


def chunks(values: Sequence[_T], size: int) -> Iterator[Sequence[_T]]:
    for start in range(0, len(values), size):
        yield values[start : start + size]


def labels_json(session: Session) -> str:
    # Caller labels only (`labels.tags`); image labels and env keys never reach the archive.
    return json.dumps(dict(session.labels), sort_keys=True, ensure_ascii=True)
