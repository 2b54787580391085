"""Per-log token Bloom filters (as Loki's and ClickHouse's ``tokenbf``) and the literal tokens a grep
pattern requires, so grep reads only the logs that may match (pure).

A token is a maximal run of ``[A-Za-z0-9_]`` of at least ``MIN_TOKEN`` bytes, lowercased, after the
few non-ASCII characters that case-insensitive matching equates with ASCII letters (KELVIN SIGN,
LONG S, dotted and dotless I) are mapped to them. A pattern token counts only when the pattern
itself delimits it on both sides (a literal non-word character, ``\b``, ``^``/``$``), so every line the
pattern matches holds it as a whole token: a log whose filter lacks it cannot match.
"""

from __future__ import annotations

import base64
import hashlib
import math
import re
import zlib
from collections.abc import Iterable, Iterator
from typing import Final

MIN_TOKEN: Final = 2
#: False-positive rate a filter is sized for.
FALSE_POSITIVES: Final = 0.01
#: Positions per token: at the 9.6 bits per token a 1 % filter gets, 5 give about 1.1 % (7, the
#: optimum, 1.0 %) for 30 % less hashing at compaction.
HASHES: Final = 5
_TOKEN_RE = re.compile(rb"[A-Za-z0-9_]{%d,}" % MIN_TOKEN)
_CASE_TWINS: Final = ((b"\xe2\x84\xaa", b"k"), (b"\xc5\xbf", b"s"), (b"\xc4\xb0", b"i"), (b"\xc4\xb1", b"i"))
_TWIN_CHARS: Final = {0x212A: "k", 0x17F: "s", 0x130: "i", 0x131: "i"}
_WORD: Final = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")


def _normal(data: bytes) -> bytes:
    for twin, ascii_letter in _CASE_TWINS:
        if twin in data:
            data = data.replace(twin, ascii_letter)
    return data.lower()


def log_tokens(chunks: Iterable[bytes]) -> set[bytes]:
    """The distinct tokens of a log's text given in chunks (cut anywhere; lines never split a token)."""
    tokens: set[bytes] = set()
    carry = b""
    for chunk in chunks:
        data = carry + chunk
        cut = data.rfind(b"\n") + 1
        carry = data[cut:]
        tokens.update(_TOKEN_RE.findall(_normal(data[:cut])))
    tokens.update(_TOKEN_RE.findall(_normal(carry)))
    return tokens


def gunzipped(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """The decompressed bytes of a gzip stream given in chunks (every member)."""
    inflater = zlib.decompressobj(31)
    for chunk in chunks:
        data = chunk
        while data:
            yield inflater.decompress(data)
            if inflater.eof:
                data = inflater.unused_data
                inflater = zlib.decompressobj(31)
            else:
                data = b""
    yield inflater.flush()


def _positions(token: bytes, bits: int) -> list[int]:
    # Double hashing (Kirsch-Mitzenmacher): two 64-bit halves of one blake2b digest give every position.
    value = int.from_bytes(hashlib.blake2b(token, digest_size=16).digest(), "little")
    h1, h2 = value & 0xFFFFFFFFFFFFFFFF, (value >> 64) | 1
    return [(h1 + i * h2) % bits for i in range(HASHES)]


def build(tokens: set[bytes]) -> str:
    """The filter of ``tokens`` as base64 (its size follows from its length; ``HASHES`` positions each)."""
    n = max(1, len(tokens))
    bits = max(64, math.ceil(-n * math.log(FALSE_POSITIVES) / math.log(2) ** 2))
    bits = (bits + 7) // 8 * 8
    array = bytearray(bits // 8)
    for token in tokens:
        for p in _positions(token, bits):
            array[p >> 3] |= 1 << (p & 7)
    return base64.b64encode(bytes(array)).decode("ascii")


def may_contain(bloom: str, tokens: Iterable[bytes]) -> bool:
    """Whether every token may be in the filter (``False``: certainly not all)."""
    array = base64.b64decode(bloom)
    bits = len(array) * 8
    if bits == 0:
        return True
    return all(array[p >> 3] & (1 << (p & 7)) for t in tokens for p in _positions(t, bits))


# --- the tokens a pattern requires ---------------------------------------------------------------

_LIT, _OTHER, _EDGE = "lit", "other", "edge"
_QUANTIFIER_RE = re.compile(r"\{\d*(,\d*)?\}")


def _atoms(pattern: str) -> list[tuple[str, str]] | None:
    """A regex as (kind, char) atoms; ``None`` when it has alternation or groups (no sure literal)."""
    atoms: list[tuple[str, str]] = []
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        if ch in "|()":
            return None
        if ch == "\\" and i + 1 < len(pattern):
            nxt = pattern[i + 1]
            if nxt == "b":
                atoms.append((_EDGE, ""))  # a word boundary: \w is wider than a token's characters
            elif nxt.isalnum():
                atoms.append((_LIT, "\n") if nxt in "nt" else (_OTHER, ""))
            else:
                atoms.append((_LIT, nxt))
            i += 2
            continue
        if ch == "[":
            end = pattern.find("]", i + 2)
            if end < 0:
                return None
            atoms.append((_OTHER, ""))
            i = end + 1
            continue
        quantifier = _QUANTIFIER_RE.match(pattern, i) if ch == "{" else None
        if ch in "*?+" or quantifier:
            if atoms:
                atoms[-1] = (_OTHER, "")
            i = quantifier.end() if quantifier else i + 1
            continue
        if (ch == "^" and i == 0) or (ch == "$" and i == len(pattern) - 1):
            atoms.append((_EDGE, ""))
        elif ch in ".^$":
            atoms.append((_OTHER, ""))
        else:
            atoms.append((_LIT, ch))
        i += 1
    return atoms


def pattern_tokens(pattern: str, *, fixed: bool) -> list[bytes] | None:
    """The tokens every line ``pattern`` matches holds whole; ``None`` when there is none to use."""
    pattern = pattern.translate(_TWIN_CHARS)  # matched case-insensitively, they are ASCII letters
    atoms = [(_LIT, ch) for ch in pattern] if fixed else _atoms(pattern)
    if atoms is None:
        return None
    found: list[bytes] = []
    run: list[str] = []
    opened = False  # the run began right after a delimiter
    for kind, ch in [*atoms, (_OTHER, "")]:
        if kind == _LIT and ch in _WORD:
            run.append(ch)
            continue
        closes = kind == _EDGE or (kind == _LIT and ch not in _WORD)
        if run and opened and closes and len(run) >= MIN_TOKEN:
            found.append(_normal("".join(run).encode()))
        run = []
        opened = closes
    return sorted(set(found)) or None
