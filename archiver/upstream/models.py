"""Typed models of the upstream's sessions and session lists, and the tolerant pure function that
parses and range-checks one session (a list entry or a described session).

Whole lists are parsed elsewhere: `sessionlist` (the reference parse, reconciliation's scan) and
`listparser` (the incremental, streamed parse the poller uses)."""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from archiver.errors import PayloadError
from archiver.textsafe import valid_utf8
from archiver.upstream.checks import (
    INT64_MAX,
    INT64_MIN,
    as_int,
    check_strings,
    check_utf8,
    checked_int,
    loads_json,
    maybe_json_object,
    optional_str,
    out_of_int64,
    require_mapping,
    require_str,
    type_name,
    unwrap,
)

#: Statuses the real service is known to send (OpenAPI SessionStatus); anything else is "unknown".
KNOWN_STATUSES = frozenset(
    {
        "created",
        "running",
        "restarting",
        "exited",
        "dead",
        "draining",
        "shuttingdown",
        "server_unreachable",
    }
)
#: A described session in one of these has ended: its container is gone, artifacts can be fetched.
TERMINAL_STATUSES = frozenset({"exited", "dead"})
UNKNOWN_STATUS = "unknown"
#: Status values map to these constants, so 10k sessions share a handful of strings.
_CANONICAL_STATUS = {status: status for status in KNOWN_STATUSES}

#: Keys inside `labels` that the service itself sets; every other key is a raw image label.
_ENV_KEY = "env"
_TAGS_KEY = "tags"

#: Plausible `created` values (epoch ms): 2000-01-01 to 2200-01-01 UTC. Outside them a value is in
#: the wrong unit (µs: 1.7e15) or garbage (negative), and would corrupt end detection and rendering.
CREATED_MIN_MS = 946_684_800_000.0
CREATED_MAX_MS = 7_258_118_400_000.0
#: Ids in error messages are cut to this many characters: a megabyte id must not make a megabyte log line.
_ID_SHOWN = 80


@dataclass(frozen=True, slots=True)
class Session:
    """One session as listed (`GET /session`) or described (`GET /session/{id}`).

    The container env is deliberately reduced to its keys: its values hold callers' secrets.
    """

    id: str
    image: str
    tag: str
    location: str
    host: str
    #: Creation time in epoch milliseconds as sent (float when the service sends one).
    created_ms: float
    #: A value of KNOWN_STATUSES or "unknown" (missing, empty or new values).
    status: str
    player_count: int | None
    ports: Mapping[str, int] = field(default_factory=dict)
    #: The caller's labels (`labels.tags`), decoded.
    labels: Mapping[str, str] = field(default_factory=dict)
    #: Other raw image labels (not JSON), kept for the manifest.
    image_labels: Mapping[str, str] = field(default_factory=dict)
    #: Names of the container's environment variables; never their values.
    env_keys: tuple[str, ...] = ()
    #: Joined player ids; only described sessions carry them.
    players: tuple[str, ...] | None = None

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES

    @property
    def created_seconds(self) -> float:
        return self.created_ms / 1000.0


def _status(value: Any) -> str:
    return _CANONICAL_STATUS.get(value, UNKNOWN_STATUS) if isinstance(value, str) else UNKNOWN_STATUS


#: Image, tag, location, host and most label values repeat across thousands of sessions: one copy each.
_shared = sys.intern


def _created(obj: Mapping[str, Any], what: str) -> float:
    value = obj.get("created")
    if isinstance(value, int | float | str) and not isinstance(value, bool):
        try:
            # Epoch ms as float64 (exact to well past the year 2200); a 400-digit integer would
            # only fail later, in rendering or in the state DB, so it fails here.
            created = float(value)
        except (ValueError, OverflowError):
            created = math.nan
        if not math.isfinite(created):
            raise PayloadError(f"{what} field 'created' is not a finite number: {str(value)[:40]!r}")
        if not CREATED_MIN_MS <= created <= CREATED_MAX_MS:
            raise PayloadError(
                f"{what} field 'created' is not an epoch-ms time between 2000 and 2200: {str(value)[:40]!r}"
            )
        return created
    if value is None:
        raise PayloadError(f"{what} has no 'created'")
    raise PayloadError(f"{what} field 'created' is {type_name(value)}, expected a number")


def parse_ports(value: Any) -> dict[str, int]:
    """`port` as an object, a JSON string of one, or either wrapped in `{"port": ...}`; drops bad entries."""
    value = unwrap(value, "port")
    if not isinstance(value, dict):
        return {}
    ports: dict[str, int] = {}
    for name, raw in value.items():
        number = as_int(raw)
        # An unusable port is dropped like any other bad port entry: it must not cost the session.
        if number is not None and INT64_MIN <= number <= INT64_MAX and valid_utf8(str(name)):
            ports[str(name)] = number
    return ports


@dataclass(frozen=True, slots=True)
class ParsedLabels:
    user: dict[str, str]
    image: dict[str, str]
    env_keys: tuple[str, ...]


_NO_LABELS = ParsedLabels({}, {}, ())


def parse_labels(value: Any, *, with_env_keys: bool = True) -> ParsedLabels:
    """Split `labels` into the caller's labels (`tags`), raw image labels and env *keys* (values dropped).

    Without `with_env_keys` the env is not even decoded (nobody needs its keys from list entries).
    """
    value = unwrap(value, "labels")
    if not isinstance(value, dict) or not value:
        return _NO_LABELS
    user: dict[str, str] = {}
    image: dict[str, str] = {}
    env_keys: tuple[str, ...] = ()
    for key, raw in value.items():
        if key == _ENV_KEY:
            if not with_env_keys:
                continue
            env = maybe_json_object(raw)
            # Only the names survive: the values are the caller's secrets.
            env_keys = tuple(sorted(str(k) for k in env)) if isinstance(env, dict) else ()
        elif key == _TAGS_KEY:
            tags = maybe_json_object(raw)
            if isinstance(tags, dict):
                user.update({str(k): _shared(_label_value(v)) for k, v in tags.items()})
            elif isinstance(tags, str):
                image[key] = tags  # undecodable: keep the raw string
        elif isinstance(raw, str):
            image[str(key)] = _shared(raw)
        else:
            image[str(key)] = json.dumps(raw, sort_keys=True)
    return ParsedLabels(user, image, env_keys)


def _label_value(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


# --- payload parsers ----------------------------------------------------------------------------


def parse_session(obj: Any, *, what: str = "session", with_env_keys: bool = True) -> Session:
    """Parse a list entry or a described session, tolerating every quirk of api-behaviour.md.

    Values that would fail later (in SQLite, the store or the exposition) are refused here with a
    PayloadError naming the field: an empty id, a string that is not valid UTF-8, an integer beyond
    64 bits, a `created` outside CREATED_MIN_MS..CREATED_MAX_MS. Env values are never checked nor
    quoted: they are not kept. `with_env_keys=False` leaves `env_keys` empty without decoding the env
    (list entries).
    """
    entry = require_mapping(obj, what)
    sid = require_str(entry, "id", what)
    if not sid:
        raise PayloadError(f"{what} field 'id' is empty")
    if not sid.isascii():
        check_utf8(sid, what, "id")
    what = f"{what} {_shown_id(sid)!r}"
    image = require_str(entry, "image", what)
    tag = optional_str(entry, "tag")
    location = require_str(entry, "location", what)
    host = optional_str(entry, "host")
    if not (image.isascii() and tag.isascii() and location.isascii() and host.isascii()):
        # One cheap test for the common all-ASCII case; the field is named only when one fails.
        for name, text in (("image", image), ("tag", tag), ("location", location), ("host", host)):
            check_utf8(text, what, name)
    labels = parse_labels(entry.get("labels"), with_env_keys=with_env_keys)
    check_strings(labels.user, what, "labels.tags")
    check_strings(labels.image, what, "labels")
    if labels.env_keys and not all(map(valid_utf8, labels.env_keys)):
        raise PayloadError(f"{what} field 'labels.env' holds a name that is not valid UTF-8")
    players_obj = entry.get("players")
    players: tuple[str, ...] | None = None
    player_count = as_int(entry.get("playerCount"))  # checked_int inlined: this runs 10k times a cold poll
    if player_count is not None and not INT64_MIN <= player_count <= INT64_MAX:
        raise out_of_int64(entry.get("playerCount"), what, "playerCount")
    if isinstance(players_obj, dict):
        joined = players_obj.get("joined")
        if isinstance(joined, list):
            players = tuple(str(p) for p in joined)
            if not all(map(valid_utf8, players)):
                raise PayloadError(f"{what} field 'players.joined' holds an id that is not valid UTF-8")
        count = checked_int(players_obj.get("joinedCount"), what, "players.joinedCount")
        if count is None and players is not None:
            count = len(players)
        if player_count is None:
            player_count = count
    return Session(
        id=sid,
        image=_shared(image),
        tag=_shared(tag),
        location=_shared(location),
        host=_shared(host),
        created_ms=_created(entry, what),
        status=_status(entry.get("status")),
        player_count=player_count,
        ports=parse_ports(entry.get("port")),
        labels=labels.user,
        image_labels=labels.image,
        env_keys=labels.env_keys,
        players=players,
    )


def _shown_id(sid: str) -> str:
    return sid if len(sid) <= _ID_SHOWN else sid[:_ID_SHOWN] + "…"


@dataclass(frozen=True, slots=True)
class InvalidEntry:
    """A session-list entry left out of one poll because a value failed parsing or a range check.

    `session_id` is the entry's raw id whenever it has a non-empty string one (possibly unprintable,
    possibly not valid UTF-8: whoever shows it makes it printable), else None. `reason` is the
    PayloadError message: it names the entry and the field, never an env value.
    """

    index: int
    session_id: str | None
    reason: str


@dataclass(frozen=True, slots=True)
class ListDelta:
    """What changed between two consecutive lists of one `SessionListParser`: `added` holds the
    Session objects of `current` that are not objects of `base` (new and changed entries, in list
    order), `removed` the objects of `base` that are not in `current` (ended sessions, and the old
    objects of changed ones). Every other session of `current` is the very object `base` held.

    Built only by the parser, from its own map of the previous list's entries, so that a consumer
    (`SnapshotRenderer`) can follow a poll's changes without comparing every session again; `base`
    and `current` are the lists themselves, so a consumer applies a delta only to the list it saw
    last (`base is` what it rendered last, `current is` what it is given)."""

    base: list[Session]
    current: list[Session]
    added: list[Session]
    removed: list[Session]


@dataclass(frozen=True, slots=True)
class SessionList:
    """One `GET /session` body: the sessions that parsed, and the entries that were left out;
    `delta` when the parser could say what changed since its previous list (see `ListDelta`; not
    part of what a list says, so two equal lists compare equal whatever came before them)."""

    sessions: list[Session]
    invalid: tuple[InvalidEntry, ...] = ()
    delta: ListDelta | None = field(default=None, compare=False, repr=False)


def invalid_entry(index: int, entry: Any, exc: PayloadError) -> InvalidEntry:
    """The left-out record of list entry `index` (the decoded `entry`) that failed with `exc`."""
    sid = entry.get("id") if isinstance(entry, dict) else None
    return InvalidEntry(index, sid if isinstance(sid, str) and sid else None, str(exc))


def entry_name(index: int) -> str:
    """How errors name list entry `index`."""
    return f"session list entry {index}"


@dataclass(frozen=True, slots=True)
class EndedEntry:
    """A list entry whose status is terminal, not parsed yet: `parse_ended` parses it on demand."""

    index: int
    session_id: str
    created_ms: float
    raw: bytes


def parse_ended(entry: EndedEntry) -> Session | InvalidEntry:
    """The Session of an ended entry, or why it fails the checks every list entry must pass."""
    payload = loads_json(entry.raw)
    try:
        return parse_session(payload, what=entry_name(entry.index), with_env_keys=False)
    except PayloadError as exc:
        return invalid_entry(entry.index, payload, exc)
