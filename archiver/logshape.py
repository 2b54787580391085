"""The upstream's log body shapes (plain text, NDJSON entries, the legacy map): their names, how a body
or an answer's content type tells them, and reading lines of each; fetch, live capture and retrieval
all use these."""

from __future__ import annotations

import codecs
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

TEXT = "text"
NDJSON = "ndjson"
LEGACY = "legacy"

STDOUT = "stdout"
STDERR = "stderr"
_STREAMS = {1: STDOUT, 2: STDERR, "1": STDOUT, "2": STDERR, "stdout": STDOUT, "stderr": STDERR}


@dataclass(frozen=True, slots=True)
class LogLine:
    text: str
    #: "stdout", "stderr", or None when the source does not tell them apart.
    stream: str | None = None


def declared(content_type: str) -> str:
    """The shape an answer's content type declares: NDJSON entries for any JSON type, else plain text."""
    return NDJSON if "json" in content_type.lower() else TEXT


def starts_like_json(head: bytes) -> bool:
    """Whether a body's first bytes open a JSON object (text log lines start with a timestamp, not a brace)."""
    return head.lstrip()[:1] == b"{"


def sniff(head: bytes, content_type: str = "") -> str:
    """The shape of a log body from its first bytes (and content type, when it is telling).

    A body starting with `{"line":` followed by an object is the legacy map; other JSON objects,
    one per line, are NDJSON entries; anything else is plain text.
    """
    if not starts_like_json(head):
        return TEXT
    compact = head.lstrip()[:64].replace(b" ", b"").replace(b"\n", b"")
    if compact.startswith(b'{"line":{'):
        return LEGACY
    if "ndjson" in content_type or "json" in content_type or compact.startswith((b'{"streamType"', b'{"line"')):
        return NDJSON
    return TEXT


def _lines(chunks: Iterable[bytes]) -> Iterator[str]:
    """Decode UTF-8 incrementally (a chunk may split a character) and split on newlines."""
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    pending = ""
    for chunk in chunks:
        pending += decoder.decode(chunk)
        *complete, pending = pending.split("\n")
        yield from (line.rstrip("\r") for line in complete)
    pending += decoder.decode(b"", final=True)
    if pending:
        yield pending.rstrip("\r")


def _entry(obj: Any) -> LogLine | None:
    if not isinstance(obj, dict):
        return None
    text = obj.get("line", obj.get("payload"))
    if not isinstance(text, str):
        return None
    stream = obj.get("streamType", obj.get("stream"))
    return LogLine(text.rstrip("\n"), _STREAMS.get(stream) if isinstance(stream, int | str) else None)


def ndjson_line(raw: str) -> LogLine | None:
    """One line of an NDJSON body: its entry's text and stream, the raw line when it is no entry, None when blank."""
    if not raw.strip():
        return None
    try:
        entry = _entry(json.loads(raw))
    except (ValueError, RecursionError):  # not JSON, or nested deeper than the parser goes
        entry = None
    return entry if entry is not None else LogLine(raw)


def read_lines(chunks: Iterable[bytes], shape: str) -> Iterator[LogLine]:
    """Plain lines of a log body of the given shape; blank keep-alive lines of NDJSON are skipped."""
    if shape == TEXT:
        yield from (LogLine(line) for line in _lines(chunks))
    elif shape == NDJSON:
        for raw in _lines(chunks):
            line = ndjson_line(raw)
            if line is not None:
                yield line
    elif shape == LEGACY:
        # One JSON document: it has to be read whole (logs of one session, not artifacts).
        body = b"".join(chunks)
        try:
            lines = json.loads(body).get("line", {})
        except (ValueError, AttributeError):
            yield from read_lines([body], TEXT)
            return
        if not isinstance(lines, dict):
            return
        for _key, value in sorted(lines.items(), key=lambda kv: _order(kv[0])):
            entry = _entry(value) if isinstance(value, dict) else None
            if entry is None and isinstance(value, str):
                entry = LogLine(value)
            if entry is not None:
                yield entry
    else:
        raise ValueError(f"unknown log shape {shape!r}")


def _order(key: str) -> tuple[int, str]:
    # Legacy keys are line numbers as strings: "10" comes after "9".
    return (int(key), "") if key.isdecimal() else (1 << 62, key)  # isdigit() admits "²", int() does not
