"""grep's token filters: a log a pattern matches is never skipped, most others are, and grep prints
what a full scan prints."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from archiver.index import bloom, grepfilter
from archiver.index.compact import compact
from archiver.retrieval.query import list_sessions
from archiver.store import open_store
from tests.support import Browsers, put_session, run_cli

INSTANCE = "20261120T000000.000Z"
DAY = 86400.0
NOW = 1795780800.0  # 2026-11-27 12:00 UTC


@pytest.mark.parametrize(
    ("pattern", "fixed", "tokens"),
    [
        (" timeout after \\d+ ms ", False, [b"after", b"ms", b"timeout"]),
        ("\\bTok42\\b", False, [b"tok42"]),
        ("^boot done$", False, [b"boot", b"done"]),
        ("error code 42", True, [b"code"]),
        ("match over", False, None),  # neither end is delimited: "rematch overtime" matches it
        ("a|b", False, None),
        ("(boot) done ", False, None),
        ("x{2} tok ", False, [b"tok"]),
        ("[ab] tok ", False, [b"tok"]),
        ("\u212aelvin ", True, None),
        (" \u212aelvin ", True, [b"kelvin"]),  # KELVIN SIGN matches k case-insensitively
    ],
)
def test_a_pattern_requires_only_the_tokens_it_delimits(pattern: str, fixed: bool, tokens: list[bytes] | None) -> None:
    assert bloom.pattern_tokens(pattern, fixed=fixed) == tokens


_WORDS = ["boot", "tok42", "Tok42", "match", "over", "\u212aelvin", "kelvin", "a_b", "x1", "é", "42"]
_SEPARATORS = [" ", "/", ".", "\t", "é", ":"]


@st.composite
def _lines(draw: st.DrawFn) -> str:
    words = draw(st.lists(st.sampled_from(_WORDS), min_size=1, max_size=6))
    return "".join(w + draw(st.sampled_from(_SEPARATORS)) for w in words).rstrip()


@settings(max_examples=300, deadline=None)
@given(
    lines=st.lists(_lines(), max_size=8),
    word=st.sampled_from(_WORDS),
    form=st.sampled_from(["\\b{}\\b", " {} ", "^{}\\b", "{} ", "/{}."]),
    fixed=st.booleans(),
    ignore_case=st.booleans(),
    chunk=st.integers(1, 40),
)
def test_a_log_the_pattern_matches_always_passes_its_filter(
    lines: list[str], word: str, form: str, fixed: bool, ignore_case: bool, chunk: int
) -> None:
    pattern = form.format(re.escape(word) if not fixed else word)
    if fixed and ("\\" in form or "^" in form):
        pattern = f" {word} "
    regex = re.compile(re.escape(pattern) if fixed else pattern, re.MULTILINE | (re.IGNORECASE if ignore_case else 0))
    text = "\n".join(lines).encode()
    tokens = bloom.pattern_tokens(pattern, fixed=fixed)
    filt = bloom.build(bloom.log_tokens(text[i : i + chunk] for i in range(0, len(text), chunk)))
    if any(regex.search(line) for line in lines):
        assert tokens is None or bloom.may_contain(filt, tokens)


def test_grep_reads_only_logs_that_may_match_and_prints_what_a_full_scan_prints(tmp_path: Path) -> None:
    root = tmp_path / "archive"
    root.mkdir()
    store = open_store(root.as_uri())
    for i in range(40):
        body = "".join(f"line {n} of match {i} ok\n" for n in range(50)) + ("found tok42 here\n" if i % 20 == 7 else "")
        put_session(store, f"s{i:02d}", ended_at=NOW - 2 * DAY + i * 60, instance=INSTANCE, logs=body.encode())
    args = ["grep", "\\btok42\\b", "--since", "2026-11-24", "--format", "json"]
    before = run_cli(store, args)
    assert before.output.count('"session"') == 2
    compact(store, since=NOW - 3 * DAY, until=NOW, now=NOW, warn=print)
    after = run_cli(store, args)
    assert after.output == before.output and after.exit_code == 0
    entries = list_sessions(store, since=NOW - 3 * DAY, now=NOW)
    chosen = grepfilter.select(store, entries, "\\btok42\\b", fixed=False, since=NOW - 3 * DAY, until=NOW)
    assert chosen.note is None and {e.session_id for e in chosen.entries} >= {"s07", "s27"}
    assert len(chosen.entries) <= 4  # 1 % false positives sized: 38 logs without the token skipped, give or take
    # A pattern without a delimited literal reads every log, and says so.
    scan = run_cli(store, ["grep", "tok4", "--since", "2026-11-24"])
    assert "note: the pattern has no literal token" in scan.stderr
    assert scan.output.count("tok42") == 2


def test_the_browsers_search_uses_the_filters_and_says_when_it_reads_every_log(tmp_path: Path) -> None:
    root = tmp_path / "archive"
    root.mkdir()
    store = open_store(root.as_uri())
    for i in range(10):
        body = f"boot {i}\n" + ("warning: tok42 seen\n" if i == 4 else "")
        put_session(store, f"s{i}", ended_at=NOW - 2 * DAY + i * 60, instance=INSTANCE, logs=body.encode())
    compact(store, since=NOW - 3 * DAY, until=NOW, now=NOW, warn=print)
    browsers = Browsers()
    try:
        client = browsers.start(store, clock=lambda: NOW)
        filtered = client.get("/search", params={"q": "\\btok42\\b", "since": "3d"}).text
        assert "warning: tok42 seen" in filtered and 'id="search-note"' not in filtered
        assert "Done: searched 1 session " in filtered  # the 9 others' filters lack the token
        scan = client.get("/search", params={"q": "tok4", "since": "3d"}).text
        assert "warning: tok42 seen" in scan and "Done: searched 10 sessions" in scan
        assert 'id="search-note" class="note">Note: the pattern has no literal token' in scan
    finally:
        browsers.close()
