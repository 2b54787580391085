"""Search in logs: `archiver grep` over many archived sessions (directory store in tmpfs, moto for one run).

Sessions are written with ``put_session`` (objects, manifest, index entry as the pipeline writes
them) with planted lines among decoys; the search must print exactly the planted lines.
"""

from __future__ import annotations

import io
import json
import os
import pty
import random
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from archiver import logshape
from archiver.layout import keys
from archiver.layout.manifest import ManifestItem
from archiver.retrieval import retrieve
from archiver.retrieval.grep import WINDOW, Matcher, grep_sessions, search_chunks
from archiver.store import ObjectStore
from archiver.store.file import FileStore
from tests import fixtures_retrieval
from tests.support import HOUR, NOW, ClosedPipe, gzipped, overwrite, put_capture, put_session, run_cli

Line = tuple[str, str, str]  # (session, stream or "-", text): one row of `archiver grep`

memory_dir = fixtures_retrieval.memory_dir
file_store = fixtures_retrieval.file_store
s3_store = fixtures_retrieval.s3_store
store = fixtures_retrieval.store

NEEDLE = "speedhack detected"
#: Five hours before NOW: the CLI counts durations from the real clock, not from NOW.
SINCE = "2026-11-22T07:30"
DECOYS = ["speedhack detect", "SPEEDHACK DETECTED", "speed hack detected", "speedhack\tdetected"]


def _ndjson(lines: list[tuple[str, str]]) -> bytes:
    return b"".join(json.dumps({"streamType": stream, "line": text + "\n"}).encode() + b"\n" for stream, text in lines)


def _seed(store: ObjectStore, sessions: int, rng: random.Random) -> list[Line]:
    """``sessions`` archives ending a minute apart, plain text or NDJSON logs of 50-150 lines, with
    the needle planted in about a third of them (sometimes several times, in unicode, at a line's
    very start or end) among decoys; every line archived."""
    archived: list[Line] = []
    for n in range(sessions):
        sid = f"match-{n:03d}"
        lines: list[tuple[str, str]] = []
        for i in range(rng.randint(50, 150)):
            roll = rng.random()
            if roll < 0.01:
                text = rng.choice([f"{NEEDLE}", f"[{i}] anticheat: {NEEDLE} for player 試合-{i}", f"x{NEEDLE}x"])
            elif roll < 0.05:
                text = f"[{i}] {rng.choice(DECOYS)}"
            else:
                text = f"[{i}] tick {rng.randint(0, 10**6)} players={rng.randint(0, 16)}"
            lines.append(("stdout", text))
            archived.append((sid, "stdout" if n % 2 else "-", text))
        if n % 2:
            put_session(store, sid, ended_at=NOW - n * 60, logs=_ndjson(lines), log_ext="jsonl")
        else:
            put_session(store, sid, ended_at=NOW - n * 60, logs=b"".join(t.encode() + b"\n" for _, t in lines))
    return archived


@pytest.fixture
def seeded(memory_dir: Path) -> tuple[ObjectStore, list[Line]]:
    """200 archived sessions in a directory store (tmpfs: 600 fsynced writes would take a loaded disk long)."""
    root = memory_dir / "archive"
    root.mkdir()
    store = FileStore(root)
    archived = _seed(store, 200, random.Random(12))
    planted = {sid for sid, _s, text in archived if NEEDLE in text}
    assert 50 <= len(planted) <= 150  # many sessions have some, many have none
    return store, archived


def _grep(store: ObjectStore, pattern: str, *, fmt: str = "table", **matcher: bool) -> tuple[str, int]:
    entries = retrieve.list_sessions(store, since=NOW - 5 * HOUR, now=NOW)
    out = io.StringIO()
    seen: list[int] = []
    report = grep_sessions(store, entries, Matcher(pattern, **matcher), out, fmt=fmt, progress=seen.append)
    assert report.sessions == len(seen) == len(entries)
    return out.getvalue(), report.hits


def _rows(text: str, fmt: str = "table") -> list[Line]:
    if fmt == "json":
        return [(d["session"], d["stream"] or "-", d["line"]) for d in map(json.loads, text.splitlines())]
    return [(sid, stream, line) for sid, stream, line in (row.split("  ", 2) for row in text.splitlines())]


def test_grep_finds_every_planted_line_across_200_sessions_and_nothing_else(
    seeded: tuple[ObjectStore, list[Line]],
) -> None:
    """Every planted line, once, as `session  stream  line`, in archive order (sessions newest
    first); no decoy. The same with -F, as JSON, with a regex and with -i."""
    store, archived = seeded
    planted = [row for row in archived if NEEDLE in row[2]]
    text, hits = _grep(store, NEEDLE)
    assert _rows(text) == planted and hits == len(planted)  # archived is newest first: match-000 first

    text, _ = _grep(store, NEEDLE, fmt="json", fixed=True)
    assert _rows(text, "json") == planted
    assert all(json.loads(line)["instance"] is None for line in text.splitlines())

    pattern = r"speedhack\s+detected$|^\[1\d\] speedhack"
    text, _ = _grep(store, pattern)
    expected = [row for row in archived if re.search(pattern, row[2])]
    assert _rows(text) == expected and len(expected) > len(planted) // 2

    text, _ = _grep(store, NEEDLE.upper(), ignore_case=True)
    assert _rows(text) == [row for row in archived if NEEDLE in row[2].lower()]


def test_grep_cli_exit_status_like_grep(seeded: tuple[ObjectStore, list[Line]]) -> None:
    """0 when a line matched, 1 when none did, 2 for a bad pattern or an archive that does not check out."""
    store, archived = seeded
    planted = [row for row in archived if NEEDLE in row[2]]
    found = run_cli(store, ["grep", NEEDLE, "--since", SINCE, "--no-progress"])
    assert found.exit_code == 0 and len(found.stdout.splitlines()) == len(planted)
    assert run_cli(store, ["grep", "no such line anywhere", "--since", SINCE]).exit_code == 1
    bad = run_cli(store, ["grep", "(unclosed", "--since", SINCE])
    assert bad.exit_code == 2 and "not a valid regular expression" in bad.output

    sid = planted[0][0]
    overwrite(store, keys.logs_key(store.prefix, sid, "jsonl" if int(sid[-3:]) % 2 else "txt"), gzipped(b""))
    tampered = run_cli(store, ["grep", NEEDLE, "--since", SINCE, "--format", "json"])
    assert tampered.exit_code == 2
    assert "do not match the manifest" in tampered.stderr
    others = {json.loads(line)["session"] for line in tampered.stdout.splitlines()}
    assert others == {s for s, _t, _l in planted} - {sid}  # the other sessions were still searched


#: Python's ``re`` backtracks for ever on such a pattern against a long line that does not match.
CATASTROPHIC = r"^(\S+\s*)*QQQ$"


def _long_lines(store: ObjectStore, sessions: int) -> int:
    """``sessions`` archives of 1 MB of 10 KB lines, a ``hit N`` line before each 100 KB; the hits in each."""
    line = b"word " * 2000 + b"\n"
    hits = 10
    for n in range(sessions):
        body = b"".join(b"hit %d\n" % i + line * 10 for i in range(hits))
        put_session(store, f"long-{n:02d}", ended_at=NOW - 60 - n, logs=body)
    return hits


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["grep", r"(\w+) \1"], r"uses a backreference \1"),
        (["grep", "error(?=: fatal)"], "uses a lookahead (?=…)"),
        (["grep", "a++"], "uses a possessive quantifier ++"),
        (["logs", "s1", "--grep", "(?<!not )found"], "uses a negative lookbehind (?<!…)"),
    ],
)
def test_a_pattern_re2_cannot_run_exits_2_with_one_line_naming_the_construct(
    file_store: ObjectStore, args: list[str], says: str
) -> None:
    put_session(file_store, "s1", ended_at=NOW - 60)
    result = run_cli(file_store, [*args, "--since", SINCE] if args[0] == "grep" else args)
    assert result.exit_code == 2 and result.stdout == ""
    assert "pattern not supported" in result.stderr and says in result.stderr
    assert 'see "Search patterns" in the README' in result.stderr


def test_a_catastrophic_pattern_is_searched_in_linear_time_within_the_budget(file_store: ObjectStore) -> None:
    """The issue's pattern over 4 MB of 10 KB lines: with ``re`` it never ends; with RE2 the search
    ends (nothing matches: exit 1) or stops at its 5 s budget (exit 3), well within the budget."""
    hits = _long_lines(file_store, 4)
    began = time.monotonic()
    result = run_cli(file_store, ["grep", CATASTROPHIC, "--since", SINCE, "--grep.max-seconds", "5"])
    elapsed = time.monotonic() - began
    assert result.exit_code in (1, 3), result.output
    assert elapsed < 5 + 5, elapsed  # the budget, and slack for a loaded machine: never "until killed"
    found = run_cli(file_store, ["grep", r"^(\S+\s*)*\d$", "--since", SINCE, "--format", "json"])
    assert found.exit_code == 0 and len(found.stdout.splitlines()) == 4 * hits


def test_a_search_past_its_budget_stops_prints_what_it_found_and_exits_3(file_store: ObjectStore) -> None:
    """--grep.max-bytes: the hits found before the budget ran out are printed, then one line on
    stderr saying it stopped and how far it went; exit 3. --grep.max-seconds likewise."""
    hits = _long_lines(file_store, 6)
    whole = run_cli(file_store, ["grep", "^hit", "--since", SINCE])
    assert whole.exit_code == 0 and len(whole.stdout.splitlines()) == 6 * hits
    cut = run_cli(file_store, ["grep", "^hit", "--since", SINCE, "--workers", "1", "--grep.max-bytes", "2.5MB"])
    assert cut.exit_code == 3, cut.output
    printed = cut.stdout.splitlines()
    assert hits <= len(printed) < 6 * hits and printed == whole.stdout.splitlines()[: len(printed)]
    # The last stderr line says it stopped (a note on the index's token filter may come before it).
    assert re.fullmatch(
        r"archiver grep: stopped after budget: \d+ s / \d+ MB read; narrow --since or the pattern",
        cut.stderr.splitlines()[-1],
    )
    timed = run_cli(file_store, ["grep", "^hit", "--since", SINCE, "--grep.max-seconds", "0.001"])
    assert timed.exit_code == 3 and "stopped after budget" in timed.stderr
    assert run_cli(file_store, ["grep", "^hit", "--since", SINCE, "--grep.max-bytes", "x"]).exit_code == 2


def test_grep_skips_sessions_without_logs_and_searches_the_one_asked_for(file_store: ObjectStore) -> None:
    """A session whose logs expired is counted, not an error; --label/--image narrow the sessions."""
    put_session(file_store, "kept", ended_at=NOW - 60, logs=b"boot\nspeedhack detected\n", labels={"t": "spring"})
    put_session(file_store, "other", ended_at=NOW - 90, logs=b"speedhack detected\n", image="other-game")
    put_session(
        file_store, "expired", ended_at=NOW - 120, logs=None,
        extra_items=[ManifestItem(kind="logs", source="GET /query/log", outcome="expired", error="deadline")],
    )  # fmt: skip
    entries = retrieve.list_sessions(file_store, since=NOW - HOUR, now=NOW)
    out = io.StringIO()
    report = grep_sessions(file_store, entries, Matcher("detected"), out)
    assert (report.sessions, report.hits, report.without_logs, report.problems) == (3, 2, 1, [])
    result = run_cli(file_store, ["grep", "detected", "--label", "t=spring", "--since", "2026-11-22T11:00"])
    assert result.stdout == "kept  -  speedhack detected\n"
    result = run_cli(file_store, ["grep", "detected", "--image", "other-game", "--since", "2026-11-22T11:00"])
    assert result.stdout == "other  -  speedhack detected\n"


def test_grep_searches_the_live_capture_kept_beside_the_logs_each_hit_naming_its_item(
    file_store: ObjectStore,
) -> None:
    """An archive keeping a live capture beside its logs (they differ): both are searched, the logs
    first, each hit naming its item (`logs`/`capture`), so a line only the capture holds is found;
    an archive with one logs item prints exactly as before (no source column, no source field)."""
    capture = _ndjson([("stdout", "speedhack detected at 12:00"), ("stderr", "speedhack detected, only live")])
    put_session(
        file_store, "both", ended_at=NOW - 60, logs=b"boot\nspeedhack detected at 12:00\n",
        extra_items=[put_capture(file_store, "both", capture)],
    )  # fmt: skip
    put_session(file_store, "single", ended_at=NOW - 120, logs=b"speedhack detected\n")
    result = run_cli(file_store, ["grep", NEEDLE, "--since", SINCE])
    assert result.exit_code == 0, result.output
    assert result.stdout == (
        "both  logs  -  speedhack detected at 12:00\n"
        "both  capture  stdout  speedhack detected at 12:00\n"
        "both  capture  stderr  speedhack detected, only live\n"
        "single  -  speedhack detected\n"
    )
    result = run_cli(file_store, ["grep", "only live", "--since", SINCE, "--format", "json"])
    assert [json.loads(line) for line in result.stdout.splitlines()] == [
        {"session": "both", "instance": None, "stream": "stderr", "line": "speedhack detected, only live",
         "source": "capture"},
    ]  # fmt: skip
    result = run_cli(file_store, ["grep", "-F", NEEDLE, "--since", SINCE, "--format", "json"])
    assert json.loads(result.stdout.splitlines()[-1]) == {
        "session": "single", "instance": None, "stream": None, "line": NEEDLE,
    }  # fmt: skip
    # The hit's item is the one `archiver logs --capture` prints.
    shown = run_cli(file_store, ["logs", "both", "--capture"])
    assert shown.stdout == "speedhack detected at 12:00\nspeedhack detected, only live\n"


def test_a_damaged_capture_is_reported_by_name_and_the_hits_of_the_logs_beside_it_still_show(
    file_store: ObjectStore,
) -> None:
    """Each logs item's sha256 is checked on its own: a capture that does not match its manifest is a
    problem naming the capture (exit 2), the logs' hits and the other sessions' are printed."""
    item = put_capture(file_store, "both", _ndjson([("stdout", "speedhack detected live")]))
    put_session(file_store, "both", ended_at=NOW - 60, logs=b"speedhack detected\n", extra_items=[item])
    put_session(file_store, "other", ended_at=NOW - 120, logs=b"speedhack detected too\n")
    assert item.key is not None
    overwrite(file_store, item.key, gzipped(_ndjson([("stdout", "speedhack detected, forged")])))
    result = run_cli(file_store, ["grep", NEEDLE, "--since", SINCE])
    assert result.exit_code == 2
    assert result.stdout == (
        "both  logs  -  speedhack detected\n"
        "both  capture  stdout  speedhack detected, forged\n"
        "other  -  speedhack detected too\n"
    )
    assert "both (capture): the stored logs of both do not match the manifest" in result.stderr
    assert "the lines above may have been altered" in result.stderr


def test_several_captures_are_each_searched_and_named_in_the_order_of_the_manifest(
    file_store: ObjectStore,
) -> None:
    """Nothing read after the end and a capture that diverged twice (a rotated log): the newest
    capture is the logs, the two older ones are kept beside them as `capture` and `capture-2`; each
    is what `logs --capture` / `print_logs(capture=2)` reads. An archive whose only logs are a
    capture has none beside them, and `logs --capture` says so in one line."""
    items = [
        put_capture(file_store, "rotated", b"speedhack detected 3\n", segment=None, log_ext="txt", capture="complete"),
        put_capture(file_store, "rotated", _ndjson([("stdout", "speedhack detected 1")]), segment=0),
        put_capture(file_store, "rotated", _ndjson([("stderr", "speedhack detected 2")]), segment=1),
    ]
    put_session(file_store, "rotated", ended_at=NOW - 60, logs=None, extra_items=items)
    text, hits = _grep(file_store, NEEDLE)
    assert text == (
        "rotated  logs  -  speedhack detected 3\n"
        "rotated  capture  stdout  speedhack detected 1\n"
        "rotated  capture-2  stderr  speedhack detected 2\n"
    )
    assert hits == 3
    out = io.StringIO()
    assert retrieve.print_logs(file_store, "rotated", out, capture=2) == 1
    assert out.getvalue() == "speedhack detected 2\n"

    only = put_capture(file_store, "gone", b"speedhack detected\n", segment=None, log_ext="txt", capture="gap")
    put_session(file_store, "gone", ended_at=NOW - 120, logs=None, extra_items=[only])
    result = run_cli(file_store, ["logs", "gone", "--capture"])
    assert result.exit_code != 0 and result.stdout == ""
    assert "keeps no live capture beside its logs (its logs are the live capture)" in result.stderr
    assert run_cli(file_store, ["grep", NEEDLE, "--since", SINCE]).stdout.endswith("gone  -  speedhack detected\n")


def test_grep_over_s3_reads_the_same_lines(store: ObjectStore) -> None:
    """The same search through the S3 store (moto) as through the directory store."""
    put_session(store, "s3-a", ended_at=NOW - 60, logs=b"one\nspeedhack detected twice\n")
    put_session(store, "s3-b", ended_at=NOW - 120, logs=_ndjson([("stderr", "speedhack detected")]), log_ext="jsonl")
    text, hits = _grep(store, NEEDLE)
    assert text == "s3-a  -  speedhack detected twice\ns3-b  stderr  speedhack detected\n" and hits == 2


def test_a_reader_that_leaves_stops_the_search(file_store: ObjectStore) -> None:
    """`archiver grep … | head -1`: BrokenPipeError reaches the CLI edge and no search thread is left waiting."""
    for n in range(12):
        put_session(file_store, f"many-{n:02d}", ended_at=NOW - n, logs=b"hit\n" * 5000)
    entries = retrieve.list_sessions(file_store, since=NOW - HOUR, now=NOW)
    with pytest.raises(BrokenPipeError):
        grep_sessions(file_store, entries, Matcher("hit"), ClosedPipe(keep=1), workers=2)


def _split(data: bytes, rng: random.Random) -> Iterator[bytes]:
    """``data`` in chunks of random sizes: cuts fall inside lines and inside UTF-8 characters."""
    pos = 0
    while pos < len(data):
        size = rng.choice([1, 3, 7, 64, 4096])
        yield data[pos : pos + size]
        pos += size


@pytest.mark.parametrize(
    "pattern",
    ["speedhack", r"a\sb", "$", "^$", "", r"^\[1", r"\d$", r"\bx\b", r"(?s)a.b", r"\Aab", r"b\z", r"é+", "b\r"],
)
def test_searching_whole_chunks_finds_what_searching_each_line_finds(pattern: str) -> None:
    """The chunked search is exactly the pattern searched in each line (lines without their CR), however
    the bytes are cut, for patterns that span lines, anchor, test word boundaries or match the empty string."""
    rng = random.Random(pattern)
    words = ["a", "b", "x", "é", "speedhack", "[1]", "7", "", " ", "\r"]
    lines = ["".join(rng.choice(words) for _ in range(rng.randint(0, 6))) for _ in range(400)]
    data = "".join(line + "\n" for line in lines).encode()
    matcher = Matcher(pattern)
    expected = [line.rstrip("\r") for line in lines if matcher.matches(line.rstrip("\r"))]
    found = [line for _stream, line in search_chunks(_split(data, rng), logshape.TEXT, matcher, [0])]
    assert found == expected
    # NDJSON: the same lines as entries; a plain pattern takes the chunked path, any other the per-line one.
    body = _ndjson([("stdout", line) for line in lines])
    found = [line for _stream, line in search_chunks(_split(body, rng), logshape.NDJSON, matcher, [0])]
    entries = [e.text for raw in body.decode().splitlines() if (e := logshape.ndjson_line(raw)) is not None]
    assert found == [text for text in entries if matcher.matches(text)]


@pytest.mark.parametrize("pattern", ["speedhack", r"^\[\d+\] speedhack$", r"speedhack\s+\[", "$", r"\d{5}$"])
def test_windows_of_whole_lines_find_every_line_a_search_of_each_line_finds(pattern: str) -> None:
    """A megabyte of lines is searched many windows at a time: no hit is lost or doubled at a window's edge."""
    rng = random.Random(pattern)
    lines = [f"[{i}] " + rng.choice(["speedhack", "tick " + str(rng.randint(0, 10**6)), "x" * rng.randint(0, 300)])
             for i in range(40_000)]  # fmt: skip
    data = "".join(line + "\n" for line in lines).encode()
    assert len(data) > 8 * WINDOW
    matcher = Matcher(pattern)
    found = [line for _stream, line in search_chunks(_split(data, rng), logshape.TEXT, matcher, [0])]
    assert found == [line for line in lines if re.search(pattern, line)]


def test_a_log_without_newlines_is_searched_in_bounded_pieces() -> None:
    """A 3 MiB "line" is searched in pieces of at most MAX_LINE characters, not gathered whole."""
    data = b"x" * (3 * 1024 * 1024) + b"needle" + b"y" * 100
    counted = [0]
    found = list(search_chunks(iter([data[i : i + 65536] for i in range(0, len(data), 65536)]),
                               logshape.TEXT, Matcher("needle"), counted))  # fmt: skip
    assert len(found) == 1 and "needle" in found[0][1] and len(found[0][1]) <= 1024 * 1024 + 65536
    assert counted == [len(data)]


def test_lines_are_searched_as_shown_invalid_bytes_as_u_fffd_and_long_lines_never_cut_in_a_character() -> None:
    """Non-ASCII text is searched as `archiver logs` shows it: an invalid byte is U+FFFD (a pattern may
    name it); a line longer than MAX_LINE is cut between characters, never inside one."""
    data = "héllo\r\n".encode() + b"bad \xff byte\n" + "é".encode() * 600_001 + b"needle"
    chunks = [data[i : i + 65537] for i in range(0, len(data), 65537)]  # odd cuts: inside characters
    found = [line for _s, line in search_chunks(iter(chunks), logshape.TEXT, Matcher("\ufffd|needle|é"), [0])]
    assert found[:2] == ["héllo", "bad \ufffd byte"] and found[-1].endswith("needle")
    assert all("\ufffd" not in line for line in found[2:]) and "".join(found[2:]) == "é" * 600_001 + "needle"


def test_the_report_counts_decompressed_bytes(file_store: ObjectStore) -> None:
    """The report counts decompressed bytes (what the benchmark's MB/s is made of)."""
    body = b"line\n" * 1000
    put_session(file_store, "counted", ended_at=NOW - 60, logs=body)
    entries = retrieve.list_sessions(file_store, since=NOW - HOUR, now=NOW)
    report = grep_sessions(file_store, entries, Matcher("nothing"), io.StringIO())
    assert (report.bytes, report.hits) == (len(body), 0)


def test_a_damaged_log_shows_its_readable_hits_then_a_problem(file_store: ObjectStore) -> None:
    """A truncated log: the hits before the cut are printed, then the problem is reported (exit 2 in the CLI)."""
    body = b"".join(b"line %06d speedhack detected\n" % i for i in range(200_000))
    put_session(file_store, "cut", ended_at=NOW - 60, logs=body)
    key = keys.logs_key(file_store.prefix, "cut", "txt")
    stored = b"".join(file_store.iter_bytes(key))
    overwrite(file_store, key, stored[: len(stored) // 2])
    entries = retrieve.list_sessions(file_store, since=NOW - HOUR, now=NOW)
    out = io.StringIO()
    warnings: list[str] = []
    report = grep_sessions(file_store, entries, Matcher(NEEDLE), out, warn=warnings.append)
    lines = out.getvalue().splitlines()
    assert 1000 < len(lines) < 200_000 and lines[0] == "cut  -  line 000000 speedhack detected"
    assert len(report.problems) == 1 and "truncated" in warnings[0]


def test_on_a_terminal_grep_shows_a_progress_bar_and_clears_it_for_each_hit(file_store: ObjectStore) -> None:
    """stdout and stderr on one terminal (a real pty): the bar is drawn on stderr, each hit line
    first clears the bar's line, and control characters in a log line are escaped."""
    put_session(file_store, "tty", ended_at=NOW - 60, logs=b"boot\n\x1b]0;owned\x07 speedhack detected\n")
    master, slave = pty.openpty()
    argv = [sys.executable, "-m", "archiver.cli", "grep", NEEDLE, "--since", SINCE, "--store", file_store.url]
    try:
        proc = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave, timeout=60, check=False)
        os.close(slave)
        shown = b""
        while chunk := _read_pty(master):
            shown += chunk
    finally:
        os.close(master)
    assert proc.returncode == 0, shown
    assert b"searching" in shown and b"100%" in shown
    assert b"\r\x1b[Ktty  -  \\x1b]0;owned\\x07 speedhack detected" in shown
    assert b"Traceback" not in shown


def _read_pty(fd: int) -> bytes:
    try:
        return os.read(fd, 65536)
    except OSError:  # EIO: the other side is closed and everything was read
        return b""
