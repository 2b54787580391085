"""Typed models of the upstream's payloads, the tolerant pure functions that parse and range-check them,
and the incremental session-list parser that reuses the models of unchanged entries between polls."""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import operator
import os
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import msgspec

from archiver.errors import PayloadError
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
    valid_utf8,
)
from archiver.upstream.checks import decode_json as decode_json

# The answers of the other endpoints live in responses.py, re-exported (`x as x`) so the client reads
# every payload type from `models`.
from archiver.upstream.responses import CreatedSession as CreatedSession
from archiver.upstream.responses import ErrorBody as ErrorBody
from archiver.upstream.responses import Location as Location
from archiver.upstream.responses import PlayersResult as PlayersResult
from archiver.upstream.responses import PortMapping as PortMapping
from archiver.upstream.responses import parse_created as parse_created
from archiver.upstream.responses import parse_error_body as parse_error_body
from archiver.upstream.responses import parse_locations as parse_locations
from archiver.upstream.responses import parse_players_result as parse_players_result
from archiver.upstream.responses import parse_tag_exists as parse_tag_exists

# place the client reads payload types from.

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


class _PlainEntry(msgspec.Struct, gc=False):
    """A list entry in the shape the service sends nearly always, every field of the expected type.

    Anything else (a field missing, null where a string is required, a number as a string, a
    `players` object, an escape msgspec refuses) fails this decode, and the entry takes the tolerant
    path. Fields parse_session does not read are ignored by both. Not tracked by the cyclic GC (it
    holds no cycle and lives for one entry): one object fewer to count towards a collection."""

    id: str
    image: str
    location: str
    created: int | float
    tag: str | None = None
    host: str | None = None
    status: str | None = None
    player_count: int | None = msgspec.field(default=None, name="playerCount")
    port: dict[str, int] | None = None
    labels: dict[str, str] | None = None
    players: msgspec.Raw | None = None


_decode_plain = msgspec.json.Decoder(_PlainEntry).decode


def _plain_list_entry(raw: msgspec.Raw | bytes) -> Session | None:
    """`parse_session(loads_json(raw), with_env_keys=False)` of a plain, valid entry at a fraction of
    the cost (one typed decode, no tolerant coercions); None whenever the entry is not plain or would
    fail a check, so that the tolerant path gives the result or the error, exactly.

    Each step is the tolerant path's own on these types: strings decoded by msgspec are valid UTF-8
    (it refuses lone surrogates), `optional_str`/`_status` of None give "" and "unknown", `as_int`
    of an int is the int, and the labels go through the same `parse_labels` and checks."""
    try:
        entry = _decode_plain(raw)
    except (msgspec.DecodeError, UnicodeDecodeError):  # ValidationError is a DecodeError
        return None
    count = entry.player_count
    ports = entry.port
    if (
        not entry.id
        or entry.players is not None
        or (count is not None and not INT64_MIN <= count <= INT64_MAX)
        or not CREATED_MIN_MS <= entry.created <= CREATED_MAX_MS
    ):
        return None
    if ports is None:
        ports = {}
    elif (len(ports) == 1 and "port" in ports) or not all(INT64_MIN <= n <= INT64_MAX for n in ports.values()):
        return None  # a wrapped field, or a port the tolerant path drops
    labels = parse_labels(entry.labels, with_env_keys=False)
    if not (_all_valid_utf8(labels.user) and _all_valid_utf8(labels.image)):
        return None
    return Session(
        id=entry.id,
        image=_shared(entry.image),
        tag=_shared(entry.tag or ""),
        location=_shared(entry.location),
        host=_shared(entry.host or ""),
        created_ms=float(entry.created),
        status=_status(entry.status),
        player_count=count,
        ports=ports,
        labels=labels.user,
        image_labels=labels.image,
        env_keys=labels.env_keys,
        players=None,
    )


def _all_valid_utf8(values: Mapping[str, str]) -> bool:
    """What `check_strings` checks, as a bool (the tolerant path then names the field)."""
    try:
        check_strings(values, "", "")
    except PayloadError:
        return False
    return True


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


def _invalid_entry(index: int, entry: Any, exc: PayloadError) -> InvalidEntry:
    sid = entry.get("id") if isinstance(entry, dict) else None
    return InvalidEntry(index, sid if isinstance(sid, str) and sid else None, str(exc))


def parse_session_list(payload: Any) -> SessionList:
    """`{"sessions": [...]}` → the sessions, and the entries that fail parsing or a range check.

    A bad entry is quarantined, never fatal: failing the whole list would stop end detection for
    every other session. A bad envelope (no `sessions` array) still raises PayloadError: with no
    list at all the poll failed. List entries carry no `env_keys` (nobody needs them, and not
    decoding the env is a third of the parse)."""
    body = require_mapping(payload, "session list")
    entries = body.get("sessions")
    if not isinstance(entries, list):
        raise PayloadError(f"session list field 'sessions' is {type_name(entries)}, expected an array")
    sessions: list[Session] = []
    invalid: list[InvalidEntry] = []
    for index, entry in enumerate(entries):
        try:
            sessions.append(parse_session(entry, what=_entry_name(index), with_env_keys=False))
        except PayloadError as exc:
            invalid.append(_invalid_entry(index, entry, exc))
    return SessionList(sessions, tuple(invalid))


def _entry_name(index: int) -> str:
    return f"session list entry {index}"


class _ListEnvelope(msgspec.Struct):
    """`{"sessions": [...]}` with every entry left undecoded (bytes), other fields ignored."""

    sessions: list[msgspec.Raw]


_decode_envelope = msgspec.json.Decoder(_ListEnvelope).decode
#: A JSON escape of U+D800..U+DFFF (half of a pair, or a lone surrogate msgspec refuses).
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
#: What may separate the `sessions` key and its entries.
_ENTRY_GAP = b" \t\r\n:[,"
_digest = operator.methodcaller("digest")

#: What an entry is remembered by between polls: Python's hash of its bytes (an int), or their SHA-256.
Digest = int | bytes

#: Whether `hash()` of bytes is keyed by a secret the process drew at start (the default): it is not
#: when PYTHONHASHSEED fixes the key (0 turns the randomisation off, a number makes the key public).
_HASH_KEY_SECRET = bool(sys.flags.hash_randomization) and (
    sys.flags.ignore_environment or os.environ.get("PYTHONHASHSEED", "random") in ("", "random")
)


def _sha256_digests(raws: list[msgspec.Raw] | list[bytes]) -> Iterator[Digest]:
    """SHA-256 of each entry's bytes; map() keeps the loop in C (~1.1 µs an entry, mostly call overhead)."""
    return map(_digest, map(hashlib.sha256, raws))


def _keyed_hash_digests(raws: list[msgspec.Raw] | list[bytes]) -> Iterator[Digest]:
    """`hash()` of each entry's bytes: SipHash-1-3 under the process's secret 128-bit key, 64 bits out
    (~0.35 µs an entry, a third of SHA-256's cost; the bytes copy is freed at once, only the int stays).

    The digest only has to answer "are these the bytes of an entry of the previous poll", and is
    never stored or compared across processes. A wrong answer needs a changed entry's 64-bit hash to
    equal one of the ~N previous ones: with 2 % of 10,000 entries changing, ~200 x 10^4 / 2^64 ≈ 1e-13
    a poll (one poll a second for 300,000 years per expected collision; 5e-12 for a wholly new body).
    Nobody can aim for a collision either: the key is random per process and never leaves it. Under
    a fixed PYTHONHASHSEED the key is known, so SHA-256 is used instead (`_HASH_KEY_SECRET`).
    Mixing in the length or a CRC-32 for more bits was measured at 2.5x to 3x the cost (the result
    becomes a big int), for a risk already far below the machine's own memory errors."""
    return map(hash, map(bytes, raws))


_digests = _keyed_hash_digests if _HASH_KEY_SECRET else _sha256_digests


def _raws_around_surrogates(body: bytes | bytearray) -> list[bytes] | None:
    """The entries' bytes of a list body that msgspec refused only for its lone-surrogate escapes;
    None when that was not the reason (the pure path then decides).

    One poisoned entry must not cost the whole list its incremental parse (5x slower, every model
    new). Each surrogate escape is swapped for the same-length `\\u0000`, which keeps the structure
    and every offset, so the envelope decodes and each entry's original bytes are found where its
    patched bytes are.
    """
    patched = _SURROGATE_ESCAPE.sub(rb"\\u0000", body)
    if patched == body:
        return None
    try:
        raws = _decode_envelope(patched).sessions
    except (msgspec.DecodeError, UnicodeDecodeError):
        return None
    # Entries follow the `sessions` key, in order, with only `:`, `[`, `,` and whitespace between
    # them; anything else in a gap means a match elsewhere (an odd envelope): the pure path decides.
    pos = patched.find(b'"sessions"')
    if pos < 0 or patched.count(b'"sessions"') != 1:
        return None  # the key escaped, or the word elsewhere too: rare enough for the pure path
    pos += len(b'"sessions"')
    originals: list[bytes] = []
    for raw in raws:
        piece = bytes(raw)
        start = patched.find(piece, pos)
        if start < 0 or patched[pos:start].strip(_ENTRY_GAP):
            return None
        pos = start + len(piece)
        originals.append(bytes(body[start:pos]))
    return originals


class WholeBodyNeeded(Exception):
    """Raised by `SessionListParser.parse_stream` when a body is not in the plain shape it streams
    (an odd envelope, JSON only Python's decoder accepts): the caller parses it whole with `parse`,
    whose result or error is the reference. `body` is the whole body when the envelope's opening was
    already odd (nothing dropped yet, nothing to fetch again); None when a window had been parsed
    and dropped before the oddity showed, and the body must be fetched again. Never leaves the
    upstream client."""

    def __init__(self, body: bytes | None = None) -> None:
        super().__init__("the session list must be parsed whole")
        self.body = body


#: The plain envelope's opening and what may follow the last entry.
_STREAM_HEAD = re.compile(rb'[ \t\r\n]*\{[ \t\r\n]*"sessions"[ \t\r\n]*:[ \t\r\n]*\[')
_WS = b" \t\r\n"
#: A streamed body is parsed in windows of about this size: the whole body is never held. Below
#: the 256 KiB mmap threshold the daemon gives glibc (`daemon.tune_allocator`), so each window
#: reuses heap memory; 1 MiB windows were mapped and faulted in afresh each time (~20 % slower).
STREAM_WINDOW = 128 * 1024
#: Bytes read before the envelope's opening must have been seen.
_HEAD_LIMIT = 4096


class _ListBuild:
    """The state of one parse in progress: committed to the parser only when the whole body parsed."""

    def __init__(self, parser: SessionListParser) -> None:
        self.parser = parser
        #: The previous list's entries, each taken out (popped) when it is listed again: what is left
        #: at the end is what vanished (`ListDelta.removed`), with no diff of the whole list. `abort`
        #: puts the taken ones back when the parse fails.
        self.previous = parser._by_digest
        #: Sessions parsed anew by this build (`ListDelta.added`) and their digests.
        self.added: list[Session] = []
        self.fresh: list[Digest] = []
        self.known_owners = parser._owners
        self.current: dict[Digest, Session] = {}
        #: The id -> owner map grows with every new id; it is rebuilt from the listed ids only once
        #: it holds twice as many as were listed (rebuilding it every poll costs ~15 ms at 100k).
        prune = len(parser._owners) > 2 * parser._listed + 1024
        self.owners: dict[str | None, bool] = {} if prune else parser._owners
        self.sessions: list[Session] = []
        self.invalid: list[InvalidEntry] = []
        #: Index in the whole list of the next piece's first entry.
        self.offset = 0

    def add(self, doc: bytes | bytearray | memoryview, raws: list[msgspec.Raw] | list[bytes]) -> None:
        """The entries `raws` of the envelope `doc` (the whole body, or one streamed window of it).

        The unchanged majority goes through C-level maps (hash, look-up, append); Python code runs
        for new or changed entries only."""
        offset = self.offset
        self.offset += len(raws)
        indices: Sequence[int] = range(offset, offset + len(raws))
        if self.parser._owns is not None:
            # Sharded: other shards' entries are dropped before they are even hashed.
            local = self._owned_indices(doc, raws)
            raws = [raws[i] for i in local]
            indices = [offset + i for i in local]
        digests = list(_digests(raws))
        found: list[Session | None] = list(map(self.previous.pop, digests, itertools.repeat(None)))
        current = self.current
        # At once, so that everything taken out of `previous` is in `current` (see `abort`); only
        # the found ones (compress), so a None never hides an earlier copy of the same entry.
        known = itertools.compress(zip(digests, found, strict=True), found)
        current.update(cast("Iterator[tuple[Digest, Session]]", known))
        for n in _positions_of_none(found):
            digest = digests[n]
            session = current.get(digest)  # a duplicated entry within this body, known already
            if session is None:
                # Only new or changed entries get here, so the range checks cost nothing on the
                # unchanged majority.
                session = _plain_list_entry(raws[n])
                if session is None:
                    entry = loads_json(bytes(raws[n]))
                    try:
                        session = parse_session(entry, what=_entry_name(indices[n]), with_env_keys=False)
                    except PayloadError as exc:
                        # Left out, not remembered (the same bytes fail the same way).
                        self.invalid.append(_invalid_entry(indices[n], entry, exc))
                        continue
                self.added.append(session)
                self.fresh.append(digest)
            current[digest] = found[n] = session
        self.sessions.extend(filter(None, found))

    def _owned_indices(self, doc: bytes | bytearray | memoryview, raws: Sequence[msgspec.Raw | bytes]) -> list[int]:
        """Indices (within `raws`) of the entries this shard owns. The ids come from one more pass of
        msgspec over the piece (in C, ~3x cheaper than hashing every entry); each id's owner is
        remembered while the id stays listed, so a poll computes the hash of new ids only, and the
        known ones are looked up by C-level maps."""
        owns = self.parser._owns
        assert owns is not None
        ids: list[str | None]
        try:
            ids = list(map(_get_id, _decode_ids(doc).sessions))
        except (msgspec.DecodeError, UnicodeDecodeError):
            ids = []
        if len(ids) != len(raws):  # an entry that is not an object, an id not a string: one at a time
            ids = [_brief_id(raw) for raw in raws]
        known = self.known_owners
        mine: list[bool | None] = list(map(known.get, ids))
        for n in _positions_of_none(mine):
            sid = ids[n]
            # Ownership is a pure function of the id, so remembering it at once is right even
            # should this parse fail.
            mine[n] = known[sid] = owns(sid or None)
        if self.owners is not known:
            self.owners.update(zip(ids, mine, strict=True))  # type: ignore[arg-type]
        return list(itertools.compress(range(len(ids)), mine))

    def finish(self) -> SessionList:
        parser = self.parser
        # Every entry listed again was taken out of `previous`: the rest vanished.
        delta = ListDelta(parser._sessions, self.sessions, self.added, list(self.previous.values()))
        parser._by_digest = self.current
        parser._sessions = self.sessions
        parser._owners = self.owners
        parser._listed = self.offset
        return SessionList(self.sessions, tuple(self.invalid), delta)

    def abort(self) -> None:
        """Puts back what this build took out of the parser's state: a failed parse leaves the state
        of the last good one in place."""
        fresh = set(self.fresh)
        self.previous.update((d, s) for d, s in self.current.items() if d not in fresh)


def _positions_of_none(values: list[Any]) -> Iterator[int]:
    """Where `values` holds None, found in C (an `==` scan would call each model's `__eq__`)."""
    return itertools.compress(itertools.count(), map(operator.is_, values, itertools.repeat(None)))


def _piece_raws(doc: memoryview) -> list[msgspec.Raw] | list[bytes] | None:
    """The entries of an envelope by msgspec (or around lone surrogates); None when neither can."""
    try:
        return _decode_envelope(doc).sessions
    except (msgspec.DecodeError, UnicodeDecodeError):
        return _raws_around_surrogates(bytes(doc))


class SessionListParser:
    """Parses successive `GET /session` bodies into the same models as `parse_session_list`, reusing
    the previous poll's `Session` object for every entry whose bytes did not change.

    Between two polls only a few percent of the entries change, so the decode of all the others is
    skipped, and each result says which sessions are new and which vanished (`ListDelta`, against
    the last good parse), so the renderer skips comparing the others too. Entries are
    recognised by a digest of their bytes (`_digests`: a keyed 64-bit hash) rather than the bytes
    themselves: the bytes hold the container env, whose values must not be kept, and an int per
    session is cheaper than ~650 bytes.

    Not thread-safe: one poller owns one parser. A failed parse leaves the state of the last good
    one in place.
    """

    def __init__(self, owns: Callable[[str | None], bool] | None = None) -> None:
        self._by_digest: dict[Digest, Session] = {}
        #: Sharding (`archiver.sharding.Shard.owns`): entries of other shards' sessions are left out
        #: before their full parse (one small decode of the id when new, nothing when unchanged).
        self._owns = owns
        self._owners: dict[str | None, bool] = {}
        #: Entries in the last body parsed.
        self._listed = 0
        #: The sessions of the last good parse (`ListDelta.base` of the next one).
        self._sessions: list[Session] = []

    def parse(self, body: bytes | bytearray) -> SessionList:
        """The sessions of one list body, and its entries that failed parsing or a range check (left
        out, not remembered: only the current body's good entries are kept). A malformed envelope
        raises PayloadError and leaves the state of the last good parse in place."""
        raws: list[msgspec.Raw] | list[bytes] | None
        try:
            raws = _decode_envelope(body).sessions
        except (msgspec.DecodeError, UnicodeDecodeError):
            raws = _raws_around_surrogates(body)
            if raws is None:
                # Not the usual shape, or JSON only Python's json accepts: the pure path decides, so
                # the result or the error message is exactly the one parse_session_list gives.
                return _only_owned(parse_session_list(decode_json(body)), self._owns)
        build = _ListBuild(self)
        try:
            build.add(body, raws)
        except BaseException:
            build.abort()
            raise
        return build.finish()

    def parse_stream(self, chunks: Iterable[bytes], *, window: int = STREAM_WINDOW) -> SessionList:
        """`parse` of the body made of `chunks`, without ever holding the whole body: entries are
        parsed a window (about `window` bytes) at a time as the chunks arrive, so a 100,000-session
        list (64 MB) costs a few hundred KiB instead of its size, and each window is still in the
        CPU's cache when it is hashed. The result is `parse`'s; a body it cannot stream (not the plain
        `{"sessions": [...]}` envelope, or a window msgspec refuses) raises WholeBodyNeeded, leaving
        the state of the last good parse in place.

        A window is cut after an entry's closing brace followed by a comma and an opening brace; a
        cut inside a string or a nested object leaves brackets or a string open, so the window's
        envelope fails to decode and an earlier cut is tried. Correct cuts are thus proved by msgspec
        itself, never guessed."""
        build = _ListBuild(self)
        try:
            return _stream_windows(build, chunks, window)
        except BaseException:
            build.abort()
            raise


def _stream_windows(build: _ListBuild, chunks: Iterable[bytes], window: int) -> SessionList:
    """The body of `SessionListParser.parse_stream`: every window of `chunks` into `build`."""
    buf = bytearray()
    stream = iter(chunks)
    head = None
    for chunk in stream:
        buf += chunk
        head = _STREAM_HEAD.match(buf)
        if head is not None or len(buf) >= _HEAD_LIMIT:
            break
    if head is None:
        for chunk in stream:
            buf += chunk
        raise WholeBodyNeeded(bytes(buf))
    # The window is kept as an envelope of its own: its entries follow `{"sessions":[`, so a
    # window is decoded where it lies, never copied.
    buf = bytearray(_ENVELOPE_HEAD) + buf[head.end() :]
    limit = window
    for chunk in stream:
        buf += chunk
        if len(buf) >= limit:
            rest = _cut_window(build, buf)
            # No cut found (a huge entry, or one msgspec refuses): wait for twice as much, so
            # the retries stay linear in the body.
            limit = window if rest is not buf else 2 * len(buf)
            buf = rest
    # What is left is the last window and the envelope's end: `]`, `}`, whitespace, and only that.
    end = len(buf.rstrip(_WS))
    if not buf.endswith(b"}", 0, end):
        raise WholeBodyNeeded
    close = len(buf.rstrip(_WS)[: end - 1].rstrip(_WS))
    if not buf.endswith(b"]", 0, close) or close <= len(_ENVELOPE_HEAD):
        raise WholeBodyNeeded
    if buf[len(_ENVELOPE_HEAD) : close - 1].strip(_WS) and not _add_window(build, buf, end):
        raise WholeBodyNeeded
    return build.finish()


_ENVELOPE_HEAD = b'{"sessions":['
#: Candidate cuts tried per window before waiting for more bytes.
_CUT_TRIES = 4


def _add_window(build: _ListBuild, buf: bytearray, end: int) -> bool:
    """Parses `buf[:end]`, an envelope, into `build`; False (nothing added) when it does not decode."""
    with memoryview(buf) as view, view[:end] as doc:
        raws = _piece_raws(doc)
        if raws is None:
            return False
        build.add(doc, raws)
        # The entries' Raw views into `buf` must be gone before `buf` changes (a live one would
        # make the release below fail loudly rather than see other bytes).
        del raws
    return True


def _cut_window(build: _ListBuild, buf: bytearray) -> bytearray:
    """Parses the complete entries of the window `buf` into `build` and returns the next window (the
    envelope's head and what follows them), or `buf` itself when no cut proved good."""
    pos = len(buf)
    for _ in range(_CUT_TRIES):
        close = buf.rfind(b"}", len(_ENVELOPE_HEAD), pos)
        if close < 0:
            break
        pos = close
        after = close + 1
        while after < len(buf) and buf[after] in _WS:
            after += 1
        if buf[after : after + 1] != b",":
            continue
        comma = after
        after += 1
        while after < len(buf) and buf[after] in _WS:
            after += 1
        if buf[after : after + 1] != b"{":
            continue
        # Close the envelope in place for the decode (the comma and the next entry's brace are
        # there to be borrowed), then put the two bytes back.
        saved = bytes(buf[close + 1 : close + 3])
        buf[close + 1 : close + 3] = b"]}"
        try:
            added = _add_window(build, buf, close + 3)
        finally:
            buf[close + 1 : close + 3] = saved
        if added:
            return bytearray(_ENVELOPE_HEAD) + buf[comma + 1 :]
    return buf


def _brief_id(raw: msgspec.Raw | bytes) -> str | None:
    """The `id` of a list entry without parsing the rest (None when it has no string id)."""
    try:
        sid = _decode_brief(raw).id
    except (msgspec.DecodeError, UnicodeDecodeError):
        return None
    return sid if isinstance(sid, str) and sid else None


def _only_owned(listed: SessionList, owns: Callable[[str | None], bool] | None) -> SessionList:
    """The sessions and left-out entries of a list that belong to this shard (all without sharding)."""
    if owns is None:
        return listed
    return SessionList(
        [s for s in listed.sessions if owns(s.id)], tuple(e for e in listed.invalid if owns(e.session_id))
    )


class _Brief(msgspec.Struct):
    """The three fields reconciliation looks at first; everything else is left undecoded."""

    id: Any = None
    status: Any = None
    created: Any = None


_decode_brief = msgspec.json.Decoder(_Brief).decode


class _IdOnly(msgspec.Struct):
    #: Typed, so the ids are hashable; an entry with another kind of id sends its piece to `_brief_id`.
    id: str | None = None


_get_id = operator.attrgetter("id")


class _IdEnvelope(msgspec.Struct):
    """`{"sessions": [{"id": ...}, ...]}`: the ids alone (sharding decides on them)."""

    sessions: list[_IdOnly]


_decode_ids = msgspec.json.Decoder(_IdEnvelope).decode


@dataclass(frozen=True, slots=True)
class EndedEntry:
    """A list entry whose status is terminal, not parsed yet: `parse_ended` parses it on demand."""

    index: int
    session_id: str
    created_ms: float
    raw: bytes


def scan_ended(body: bytes | bytearray) -> list[EndedEntry]:
    """The entries of an `all=true` list body that say they have ended, without parsing them.

    Reconciliation lists every session the upstream still holds, most of them running or already
    archived: reading three fields of each (msgspec, ~1 µs an entry) and parsing only the few the
    state DB does not know keeps it from costing a full parse of thousands of entries. Entries
    without a string id or a numeric creation time are skipped here (the poll quarantines them).
    PayloadError when the envelope is not a session list.
    """
    raws: list[msgspec.Raw] | list[bytes] | None
    try:
        raws = _decode_envelope(body).sessions
    except (msgspec.DecodeError, UnicodeDecodeError):
        raws = _raws_around_surrogates(body)
    if raws is None:
        payload = require_mapping(decode_json(body), "session list")
        entries = payload.get("sessions")
        if not isinstance(entries, list):
            raise PayloadError(f"session list field 'sessions' is {type_name(entries)}, expected an array")
        raws = [json.dumps(entry).encode() for entry in entries]
    ended: list[EndedEntry] = []
    for index, raw in enumerate(raws):
        try:
            brief = _decode_brief(raw)
            sid, status, created = brief.id, brief.status, brief.created
        except (msgspec.DecodeError, UnicodeDecodeError):
            try:
                entry = loads_json(bytes(raw))
            except (ValueError, UnicodeError):
                continue
            if not isinstance(entry, dict):
                continue
            sid, status, created = entry.get("id"), entry.get("status"), entry.get("created")
        if not isinstance(status, str) or status not in TERMINAL_STATUSES or not isinstance(sid, str) or not sid:
            continue
        if isinstance(created, bool) or not isinstance(created, int | float) or not math.isfinite(created):
            continue
        ended.append(EndedEntry(index, sid, float(created), bytes(raw)))
    return ended


def parse_ended(entry: EndedEntry) -> Session | InvalidEntry:
    """The Session of an ended entry, or why it fails the checks every list entry must pass."""
    payload = loads_json(entry.raw)
    try:
        return parse_session(payload, what=_entry_name(entry.index), with_env_keys=False)
    except PayloadError as exc:
        return _invalid_entry(entry.index, payload, exc)
