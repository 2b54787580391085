"""The poller's session-list parser: successive bodies parsed as they stream in, a window at a time,
reusing the `Session` of every entry whose bytes did not change and saying what changed (`ListDelta`)."""

from __future__ import annotations

import itertools
import operator
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, cast

import msgspec

from archiver.errors import PayloadError
from archiver.upstream.checks import decode_json, loads_json
from archiver.upstream.models import (
    InvalidEntry,
    ListDelta,
    Session,
    SessionList,
    entry_name,
    invalid_entry,
    parse_session,
)
from archiver.upstream.sessionlist import (
    Digest,
    Digests,
    brief_id,
    list_entries,
    only_owned,
    parse_session_list,
    sha256_digests,
)


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
#: A streamed body is parsed in windows of about this size: the whole body is never held. Small, so
#: each window reuses heap memory freed by the last rather than being mapped and faulted in afresh
#: (glibc maps large allocations of their own), and is still in the CPU's cache when it is hashed.
STREAM_WINDOW = 128 * 1024
#: Bytes read before the envelope's opening must have been seen.
_HEAD_LIMIT = 4096
_ENVELOPE_HEAD = b'{"sessions":['
#: Candidate cuts tried per window before waiting for more bytes.
_CUT_TRIES = 4


class SessionListParser:
    """Parses successive `GET /session` bodies into the same models as `parse_session_list`, reusing
    the previous poll's `Session` object for every entry whose bytes did not change.

    Between two polls only a few percent of the entries change, so the decode of all the others is
    skipped, and each result says which sessions are new and which vanished (`ListDelta`, against
    the last good parse), so the renderer skips comparing the others too. Entries are
    recognised by a digest of their bytes (`digests`: SHA-256, or the keyed 64-bit hash
    `sessionlist.keyed_hash_digests` when the entry point hands it over) rather than the bytes
    themselves: the bytes hold the container env, whose values must not be kept, and a digest per
    session is far smaller than an entry.

    Not thread-safe: one poller owns one parser. A failed parse leaves the state of the last good
    one in place.
    """

    def __init__(self, owns: Callable[[str | None], bool] | None = None, *, digests: Digests = sha256_digests) -> None:
        self._by_digest: dict[Digest, Session] = {}
        #: How entries are remembered: the entry point's choice (`archiver.app.process.list_digests`).
        self.digests = digests
        #: Sharding (`archiver.config.sharding.Shard.owns`): entries of other shards' sessions are left out
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
        raises PayloadError and leaves the state of the last good parse in place.

        The body is parsed as one window of `parse_stream`; one that cannot be streamed (not the
        plain `{"sessions": [...]}` envelope, or JSON only Python's json accepts) goes to the
        reference, `parse_session_list`, so the result or the error message is exactly its own
        (without a delta, and leaving the state of the last good parse in place)."""
        try:
            return self._streamed((body,), STREAM_WINDOW)
        except WholeBodyNeeded:
            return only_owned(parse_session_list(decode_json(body)), self._owns)

    def parse_stream(self, chunks: Iterable[bytes], *, window: int = STREAM_WINDOW) -> SessionList:
        """`parse` of the body made of `chunks`, without ever holding the whole body: entries are
        parsed a window (about `window` bytes) at a time as the chunks arrive, so a 100,000-session
        list costs a few hundred KiB instead of its size, and each window is still in the CPU's cache
        when it is hashed. The result is `parse`'s; a body it cannot stream (not the plain
        `{"sessions": [...]}` envelope, or a window msgspec refuses) raises WholeBodyNeeded, leaving
        the state of the last good parse in place.

        A window is cut after an entry's closing brace followed by a comma and an opening brace; a
        cut inside a string or a nested object leaves brackets or a string open, so the window's
        envelope fails to decode and an earlier cut is tried. Correct cuts are thus proved by msgspec
        itself, never guessed."""
        return self._streamed(chunks, window)

    def _streamed(self, chunks: Iterable[bytes | bytearray], window: int) -> SessionList:
        build = _ListBuild(self)
        try:
            return _stream_windows(build, chunks, window)
        except BaseException:
            build.abort()
            raise


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
        #: it holds twice as many as were listed (rebuilding it every poll would cost a pass over
        #: every id of a large list).
        prune = len(parser._owners) > 2 * parser._listed + 1024
        self.owners: dict[str | None, bool] = {} if prune else parser._owners
        self.sessions: list[Session] = []
        self.invalid: list[InvalidEntry] = []
        #: Index in the whole list of the next window's first entry.
        self.offset = 0

    def add(self, doc: bytes | bytearray | memoryview, raws: list[msgspec.Raw] | list[bytes]) -> None:
        """The entries `raws` of the envelope `doc` (one window of the body, or all of it).

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
        keys = list(self.parser.digests(raws))
        found: list[Session | None] = list(map(self.previous.pop, keys, itertools.repeat(None)))
        current = self.current
        # At once, so that everything taken out of `previous` is in `current` (see `abort`); only
        # the found ones (compress), so a None never hides an earlier copy of the same entry.
        known = itertools.compress(zip(keys, found, strict=True), found)
        current.update(cast("Iterator[tuple[Digest, Session]]", known))
        for n in _positions_of_none(found):
            digest = keys[n]
            session = current.get(digest)  # a duplicated entry within this body, known already
            if session is None:
                # Only new or changed entries get here: the unchanged majority is never decoded.
                entry = loads_json(bytes(raws[n]))
                try:
                    session = parse_session(entry, what=entry_name(indices[n]), with_env_keys=False)
                except PayloadError as exc:
                    # Left out, not remembered (the same bytes fail the same way).
                    self.invalid.append(invalid_entry(indices[n], entry, exc))
                    continue
                self.added.append(session)
                self.fresh.append(digest)
            current[digest] = found[n] = session
        self.sessions.extend(filter(None, found))

    def _owned_indices(self, doc: bytes | bytearray | memoryview, raws: Sequence[msgspec.Raw | bytes]) -> list[int]:
        """Indices (within `raws`) of the entries this shard owns. The ids come from one more pass of
        msgspec over the window (in C, cheaper than hashing every entry); each id's owner is
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
            ids = [brief_id(raw) for raw in raws]
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


class _IdOnly(msgspec.Struct):
    #: Typed, so the ids are hashable; an entry with another kind of id sends its window to `brief_id`.
    id: str | None = None


_get_id = operator.attrgetter("id")


class _IdEnvelope(msgspec.Struct):
    """`{"sessions": [{"id": ...}, ...]}`: the ids alone (sharding decides on them)."""

    sessions: list[_IdOnly]


_decode_ids = msgspec.json.Decoder(_IdEnvelope).decode


# --- windows -------------------------------------------------------------------------------------


def _stream_windows(build: _ListBuild, chunks: Iterable[bytes | bytearray], window: int) -> SessionList:
    """Every window of `chunks` into `build` (see `SessionListParser.parse_stream`)."""
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
    buf[: head.end()] = _ENVELOPE_HEAD
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


def _add_window(build: _ListBuild, buf: bytearray, end: int) -> bool:
    """Parses `buf[:end]`, an envelope, into `build`; False (nothing added) when it does not decode."""
    with memoryview(buf) as view, view[:end] as doc:
        raws = list_entries(doc)
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
