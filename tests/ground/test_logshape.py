"""Log bodies in every upstream shape read back as the same plain lines."""

from __future__ import annotations

import json

from archiver.logshape import LEGACY, NDJSON, TEXT, LogLine, read_lines, sniff

LINES = [(1, "boot"), (2, "warning: low memory"), (1, "player p1 joined — ünïcode"), (1, "match over")]


def chunked(data: bytes, size: int = 3) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


def test_plain_text_with_split_multibyte_characters() -> None:
    body = "\n".join(text for _, text in LINES).encode() + b"\n"
    assert sniff(body[:100]) == TEXT
    assert [line.text for line in read_lines(chunked(body), TEXT)] == [t for _, t in LINES]


def test_ndjson_entries_keep_stream_types_and_skip_keepalive_blanks() -> None:
    body = b"\n\n".join(json.dumps({"streamType": s, "line": t}).encode() for s, t in LINES) + b"\n"
    assert sniff(body[:100], "application/x-ndjson") == NDJSON
    got = list(read_lines(chunked(body, 7), NDJSON))
    assert got == [LogLine(t, "stdout" if s == 1 else "stderr") for s, t in LINES]


def test_legacy_map_is_read_in_numeric_line_order() -> None:
    entries = {str(i + 1): {"lineKey": str(i + 1), "payload": t} for i, (_, t) in enumerate(LINES * 3)}
    body = json.dumps({"line": dict(reversed(list(entries.items())))}).encode()
    assert sniff(body[:100]) == LEGACY
    assert [line.text for line in read_lines([body], LEGACY)] == [t for _, t in LINES * 3]


def test_garbage_json_lines_are_kept_as_text_not_dropped() -> None:
    body = b'{"streamType": 1, "line": "ok"}\n{broken\n'
    assert [line.text for line in read_lines([body], NDJSON)] == ["ok", "{broken"]


def test_legacy_keys_that_look_like_digits_but_are_not_numbers_do_not_crash() -> None:
    body = json.dumps({"line": {"2": "b", "1": "a", "²": "odd"}}).encode()
    assert [line.text for line in read_lines([body], LEGACY)] == ["a", "b", "odd"]
