"""Whole `GET /session` bodies: the reference parse, the split into undecoded entries, the digests
entries are remembered by between polls, and reconciliation's scan for ended entries."""

from __future__ import annotations

import hashlib
import json
import math
import operator
import os
import re
import sys
from collections.abc import Callable, Iterator
from typing import Any

import msgspec

from archiver.errors import PayloadError
from archiver.upstream.checks import decode_json, loads_json, require_mapping, type_name
from archiver.upstream.models import (
    TERMINAL_STATUSES,
    EndedEntry,
    InvalidEntry,
    Session,
    SessionList,
    entry_name,
    invalid_entry,
    parse_session,
)


def parse_session_list(payload: Any) -> SessionList:
    """`{"sessions": [...]}` → the sessions, and the entries that fail parsing or a range check.

    The reference every other way of parsing a list must agree with (`listparser` falls back to it
    for any body it does not take apart itself). A bad entry is quarantined, never fatal: failing the
    whole list would stop end detection for every other session. A bad envelope (no `sessions`
    array) still raises PayloadError: with no list at all the poll failed. List entries carry no
    `env_keys` (nobody needs them, and not decoding the env is a large share of the parse)."""
    sessions: list[Session] = []
    invalid: list[InvalidEntry] = []
    for index, entry in enumerate(_entries(payload)):
        try:
            sessions.append(parse_session(entry, what=entry_name(index), with_env_keys=False))
        except PayloadError as exc:
            invalid.append(invalid_entry(index, entry, exc))
    return SessionList(sessions, tuple(invalid))


def _entries(payload: Any) -> list[Any]:
    """The `sessions` array of a decoded list body; PayloadError when there is none."""
    entries = require_mapping(payload, "session list").get("sessions")
    if not isinstance(entries, list):
        raise PayloadError(f"session list field 'sessions' is {type_name(entries)}, expected an array")
    return entries


def only_owned(listed: SessionList, owns: Callable[[str | None], bool] | None) -> SessionList:
    """The sessions and left-out entries of a list that belong to this shard (all without sharding)."""
    if owns is None:
        return listed
    return SessionList(
        [s for s in listed.sessions if owns(s.id)], tuple(e for e in listed.invalid if owns(e.session_id))
    )


# --- entries left undecoded ----------------------------------------------------------------------


class _ListEnvelope(msgspec.Struct):
    """`{"sessions": [...]}` with every entry left undecoded (bytes), other fields ignored."""

    sessions: list[msgspec.Raw]


_decode_envelope = msgspec.json.Decoder(_ListEnvelope).decode
#: A JSON escape of U+D800..U+DFFF (half of a pair, or a lone surrogate msgspec refuses).
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
#: What may separate the `sessions` key and its entries.
_ENTRY_GAP = b" \t\r\n:[,"


def list_entries(doc: bytes | bytearray | memoryview) -> list[msgspec.Raw] | list[bytes] | None:
    """The undecoded entries of a list envelope, by msgspec (or around lone surrogates); None when
    neither can split it (the reference parse then decides)."""
    try:
        return _decode_envelope(doc).sessions
    except (msgspec.DecodeError, UnicodeDecodeError):
        return _raws_around_surrogates(bytes(doc))


def _raws_around_surrogates(body: bytes) -> list[bytes] | None:
    """The entries' bytes of a list body that msgspec refused only for its lone-surrogate escapes;
    None when that was not the reason.

    One poisoned entry (a caller's label cut in the middle of an emoji is enough) must not cost every
    other entry its reuse, every poll, for as long as it is listed. Each surrogate escape is swapped
    for the same-length `\\u0000`, which keeps the structure and every offset, so the envelope
    decodes and each entry's original bytes are found where its patched bytes are.
    """
    patched = _SURROGATE_ESCAPE.sub(rb"\\u0000", body)
    if patched == body:
        return None
    try:
        raws = _decode_envelope(patched).sessions
    except (msgspec.DecodeError, UnicodeDecodeError):
        return None
    # Entries follow the `sessions` key, in order, with only `:`, `[`, `,` and whitespace between
    # them; anything else in a gap means a match elsewhere (an odd envelope): the reference decides.
    pos = patched.find(b'"sessions"')
    if pos < 0 or patched.count(b'"sessions"') != 1:
        return None  # the key escaped, or the word elsewhere too: rare enough for the reference
    pos += len(b'"sessions"')
    originals: list[bytes] = []
    for raw in raws:
        piece = bytes(raw)
        start = patched.find(piece, pos)
        if start < 0 or patched[pos:start].strip(_ENTRY_GAP):
            return None
        pos = start + len(piece)
        originals.append(body[start:pos])
    return originals


# --- what an entry is remembered by ----------------------------------------------------------------

#: What an entry is remembered by between polls: Python's hash of its bytes (an int), or their SHA-256.
Digest = int | bytes
#: A way to digest a list of entries (`sha256_digests`, `keyed_hash_digests`), handed to the parser.
Digests = Callable[[list[msgspec.Raw] | list[bytes]], Iterator[Digest]]

#: Whether `hash()` of bytes is keyed by a secret the process drew at start (the default): it is not
#: when PYTHONHASHSEED fixes the key (0 turns the randomisation off, a number makes the key public).
#: A fact about the interpreter, read here; the choice of digests is the entry point's
#: (`archiver.app.process.list_digests`).
HASH_KEY_SECRET = bool(sys.flags.hash_randomization) and (
    sys.flags.ignore_environment or os.environ.get("PYTHONHASHSEED", "random") in ("", "random")
)
_digest = operator.methodcaller("digest")


def sha256_digests(raws: list[msgspec.Raw] | list[bytes]) -> Iterator[Digest]:
    """SHA-256 of each entry's bytes; map() keeps the loop in C. The parser's default: the same in
    every process, whatever the interpreter's hash key."""
    return map(_digest, map(hashlib.sha256, raws))


def keyed_hash_digests(raws: list[msgspec.Raw] | list[bytes]) -> Iterator[Digest]:
    """`hash()` of each entry's bytes: SipHash-1-3 under the process's secret 128-bit key, 64 bits out
    (the bytes copy is freed at once, only the int stays); a fraction of SHA-256's cost on
    entries of a few hundred bytes, and every entry of every poll is hashed.

    The digest only has to answer "are these the bytes of an entry of the previous poll", and is
    never stored or compared across processes. A wrong answer needs a changed entry's 64-bit hash to
    equal one of the ~N previous ones: with 2 % of 10,000 entries changing, ~200 x 10^4 / 2^64 ≈ 1e-13
    a poll (one poll a second for 300,000 years per expected collision; 5e-12 for a wholly new body).
    Nobody can aim for a collision either: the key is random per process and never leaves it. Under
    a fixed PYTHONHASHSEED the key is known, so the entry point keeps SHA-256 (`HASH_KEY_SECRET`).
    Mixing in the length or a CRC-32 for more bits makes the result a big int and the hash several
    times dearer, for a risk already far below the machine's own memory errors."""
    return map(hash, map(bytes, raws))


# --- reconciliation --------------------------------------------------------------------------------


class _Brief(msgspec.Struct):
    """The three fields reconciliation looks at first; everything else is left undecoded."""

    id: Any = None
    status: Any = None
    created: Any = None


_decode_brief = msgspec.json.Decoder(_Brief).decode


def brief_id(raw: msgspec.Raw | bytes) -> str | None:
    """The `id` of a list entry without parsing the rest (None when it has no string id)."""
    try:
        sid = _decode_brief(raw).id
    except (msgspec.DecodeError, UnicodeDecodeError):
        return None
    return sid if isinstance(sid, str) and sid else None


def scan_ended(body: bytes | bytearray) -> list[EndedEntry]:
    """The entries of an `all=true` list body that say they have ended, without parsing them.

    Reconciliation lists every session the upstream still holds, most of them running or already
    archived: reading three fields of each (one small msgspec decode) and parsing only the few the
    state DB does not know keeps it from costing a full parse of thousands of entries. Entries
    without a string id or a numeric creation time are skipped here (the poll quarantines them).
    PayloadError when the envelope is not a session list.
    """
    raws = list_entries(body)
    if raws is None:
        raws = [json.dumps(entry).encode() for entry in _entries(decode_json(body))]
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
