"""Search patterns (archiver/retrieval/pattern.py): RE2 in linear time, what it refuses and how it says so,
and the search budget's decision (archiver/retrieval/budget.py)."""

from __future__ import annotations

import re

import pytest

from archiver.errors import InputError, PatternError
from archiver.retrieval.budget import STOPPED, SearchBudget, SearchMeter, over_budget
from archiver.retrieval.pattern import MAX_PROGRAM, compile_pattern


@pytest.mark.parametrize(
    ("pattern", "construct"),
    [
        (r"(a)\1", r"a backreference \1"),
        (r"(?P<x>a)(?P=x)", "a named backreference (?P=name)"),
        (r"\g<1>", r"a backreference \g<…>"),
        (r"error(?=: fatal)", "a lookahead (?=…)"),
        (r"error(?!: ok)", "a negative lookahead (?!…)"),
        (r"(?<=player )p-1", "a lookbehind (?<=…)"),
        (r"(?<!\d)42", "a negative lookbehind (?<!…)"),
        (r"a*+b", "a possessive quantifier *+"),
        (r"a{2}+b", "a possessive quantifier {2}+"),
        (r"(?>ab|a)c", "an atomic group (?>…)"),
        (r"(a)?(?(1)b|c)", "a conditional (?(…)…)"),
        (r"end\Z", r"\Z (write \z for the end of the text)"),
        (r"(?x) a b", "the flag group (?x…"),
    ],
)
def test_what_re2_cannot_run_is_refused_in_one_line_naming_the_construct(pattern: str, construct: str) -> None:
    with pytest.raises(PatternError) as raised:
        compile_pattern(pattern)
    message = str(raised.value)
    assert message.startswith(f"pattern not supported: {pattern!r} uses {construct}")
    assert "linear-time search (RE2)" in message and "\n" not in message
    assert isinstance(raised.value, InputError | ValueError)  # exit 2 in the CLI, 400 in the browser


@pytest.mark.parametrize(
    ("pattern", "says"),
    [
        ("(unclosed", "missing ): (unclosed"),  # our multi-line prefix is not shown as the user's text
        ("a**", "bad repetition operator: **"),
        ("[z-a]", "invalid character class range: z-a"),
        ("a{1001}", "a repetition count above 1000"),
    ],
)
def test_an_invalid_pattern_says_what_is_wrong(pattern: str, says: str) -> None:
    with pytest.raises(PatternError, match="is not a valid regular expression") as raised:
        compile_pattern(pattern)
    assert says in str(raised.value)


def test_a_pattern_whose_program_is_too_large_is_refused_as_too_complex() -> None:
    """RE2 is linear with a factor of its program's size: nested counted repetitions are refused."""
    with pytest.raises(PatternError, match=rf"too complex \(\d+ RE2 instructions, at most {MAX_PROGRAM}\)"):
        compile_pattern(r"(?:(?:\w+\s*){30}){30}QQ")
    with pytest.raises(PatternError, match=r"^pattern not supported: .* is too complex \(too large for RE2\)"):
        compile_pattern(r"\pL{1000}")
    with pytest.raises(PatternError, match=r"a repetition count above 1000, alone or nested \(\{100\}\)"):
        compile_pattern(r"(\pL{100}){100}")
    compile_pattern(r"(?:\w+\s*){30}QQ")  # one level of the same is fine


def test_catastrophic_backtracking_patterns_match_like_re_in_linear_time() -> None:
    """Patterns that make Python's ``re`` run for ever on a long non-matching line give RE2's answer at once."""
    line = "word " * 20_000  # 100 KB; ``re`` would take longer than the age of the universe on this
    for pattern in (r"^(\S+\s*)*QQQ$", r"(.*)*error", r"(a|aa)+$"):
        compiled = compile_pattern(pattern)
        assert not compiled.matches(line)
        assert compiled.matches("a b QQQ" if "QQQ" in pattern else "an error" if "error" in pattern else "aaa")


def test_find_reads_utf8_bytes_with_multiline_anchors_and_fixed_and_caseless_modes() -> None:
    data = "boot\nspeedhack détecté\nSPEEDHACK\n".encode()
    assert compile_pattern(r"^speedhack").find(data) == (5, 14)
    assert compile_pattern(r"détecté$").find(data) == (data.index("d\xe9".encode()), data.index(b"\nSPEED"))
    assert compile_pattern(r"^SPEEDHACK$").find(data, 0, 14) is None  # the end bounds the search
    fixed = compile_pattern("a.b", fixed=True)
    assert fixed.matches("xa.by") and not fixed.matches("axb")
    caseless = compile_pattern("SPEEDHACK DÉTECTÉ", fixed=True, ignore_case=True)
    assert caseless.matches("speedhack détecté") and caseless.find(data) == (5, data.index(b"\nSPEED"))
    assert (
        compile_pattern(r"\Aboot").whole_text_anchors and not compile_pattern(r"\Aboot", fixed=True).whole_text_anchors
    )


@pytest.mark.parametrize(
    "pattern", [r"speedhack\s+detected", r"^\[\d+\] tick", r"players=1[0-6]$", r"é+|x{2,3}", r"\bp-\d{4}\b"]
)
def test_patterns_common_to_both_syntaxes_find_the_lines_re_finds(pattern: str) -> None:
    lines = ["[1] tick 5 players=12", "speedhack  detected", "p-4711 joined", "xxé", "[x] tick", "ap-1234", "x"]
    compiled = compile_pattern(pattern)
    assert [line for line in lines if compiled.matches(line)] == [line for line in lines if re.search(pattern, line)]


def test_the_budget_stops_at_either_limit_and_says_how_far_it_went() -> None:
    budget = SearchBudget(seconds=10, bytes=50_000_000)
    assert over_budget(budget, 9.9, 49_999_999) is None
    assert over_budget(budget, 10.2, 1_000) == f"{STOPPED}: 10 s / 0.0 MB read"
    assert over_budget(budget, 3, 50_000_000) == f"{STOPPED}: 3 s / 50 MB read"
    assert over_budget(SearchBudget(), 1e9, 10**15) is None  # 0: no limit


def test_the_meter_turns_spent_once_its_budget_is_passed_or_it_is_stopped() -> None:
    now = [100.0]
    meter = SearchMeter(SearchBudget(seconds=5, bytes=1000), clock=lambda: now[0])
    meter.add(999)
    assert not meter.spent()
    now[0] = 105.0
    assert meter.spent() and meter.reason is not None and meter.reason.startswith(f"{STOPPED}: 5 s")
    stopped = SearchMeter(SearchBudget(bytes=10))
    stopped.stop()
    assert stopped.spent() and stopped.reason is None  # the reader left: not the budget
    bytes_meter = SearchMeter(SearchBudget(bytes=10))
    bytes_meter.add(10)
    assert bytes_meter.spent() and "0.0 MB read" in (bytes_meter.reason or "")
