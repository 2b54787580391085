"""A user's search pattern compiled for RE2 (linear time in the text, whatever the pattern), or refused in one line.

Every place a user's pattern meets archived data (`archiver grep`, `archiver logs --grep`, the
browser's `/search`) compiles it here. RE2 (google-re2) runs in time linear in the text searched
and releases the GIL while it matches, so a pattern such as ``^(\\S+\\s*)*QQQ$``, which makes
Python's backtracking ``re`` run for ever, costs what any other pattern costs. What RE2 cannot run
(backreferences, lookaround, possessive quantifiers, atomic groups, conditionals) is refused with a
message naming the construct; a pattern whose compiled program is larger than `MAX_PROGRAM`
instructions is refused as too complex, because RE2's linear time is linear with a factor of the
program's size once its DFA gives up.

Matching is done on UTF-8 bytes: a ``str`` handed to google-re2 is re-encoded whole on every
call, which would make searching a chunk hit by hit quadratic.
"""

from __future__ import annotations

from typing import Any

import re2

from archiver.errors import PatternError

#: Largest compiled program accepted (RE2 instructions). Measured: at about 2,000 the slowest
#: patterns found still search 0.2 MB/s or more when the DFA gives up; at 8,000, 0.05 MB/s.
MAX_PROGRAM = 2000
#: RE2's memory for one compiled pattern and its DFA caches (its default, 8 MiB).
MAX_MEMORY = 8 << 20
#: The flag every regular expression is compiled with (see `Pattern.find`).
_MULTILINE = "(?m)"
#: Where the README explains what RE2 accepts.
_SEE = 'see "Search patterns" in the README'

#: RE2 error fragments (``invalid perl operator: (?=``) → the construct named to the user.
_PERL_OPERATORS = {
    "(?=": "a lookahead (?=…)",
    "(?!": "a negative lookahead (?!…)",
    "(?<=": "a lookbehind (?<=…)",
    "(?<!": "a negative lookbehind (?<!…)",
    "(?>": "an atomic group (?>…)",
    "(?(": "a conditional (?(…)…)",
    "(?P": "a named backreference (?P=name)",
    "(?#": "a comment (?#…)",
}
_ESCAPES = {
    "\\g": "a backreference \\g<…>",
    "\\k": "a backreference \\k<…>",
    "\\Z": "\\Z (write \\z for the end of the text)",
    "\\G": "\\G",
    "\\R": "\\R",
}


def refusal(pattern: str, message: str) -> str:
    """The one line a user reads for a pattern RE2 refused with ``message`` (its error text)."""
    what, _, fragment = message.partition(": ")
    fragment = fragment.removeprefix(_MULTILINE)  # our own prefix, not the user's text
    message = f"{what}: {fragment}" if fragment else what
    construct: str | None = None
    if what == "invalid perl operator":
        construct = next((name for op, name in _PERL_OPERATORS.items() if fragment.startswith(op)), None)
        if construct is None and fragment.startswith("(?"):
            construct = f"the flag group {fragment}… (RE2 takes the flags i, m, s and U)"
    elif what == "invalid escape sequence":
        construct = f"a backreference {fragment}" if fragment[1:2].isdigit() else _ESCAPES.get(fragment[:2])
    elif what == "bad repetition operator" and fragment.endswith("+") and len(fragment) > 1:
        construct = f"a possessive quantifier {fragment}"
    if construct is not None:
        return f"pattern not supported: {pattern!r} uses {construct}, which linear-time search (RE2) cannot run; {_SEE}"
    if what == "invalid repetition size":
        count = f"a repetition count above 1000, alone or nested ({fragment})"
        return f"{pattern!r} is not a valid regular expression: {count}"
    if what.startswith("pattern too large"):
        return f"pattern not supported: {pattern!r} is too complex (too large for RE2); {_SEE}"
    return f"{pattern!r} is not a valid regular expression: {message}"


class Pattern:
    """A compiled search pattern: ``find`` over UTF-8 bytes, ``matches`` for one line of text."""

    __slots__ = ("_regex", "fixed", "ignore_case", "source", "whole_text_anchors")

    def __init__(self, source: str, regex: Any, *, fixed: bool, ignore_case: bool) -> None:
        self.source = source
        self.fixed = fixed
        self.ignore_case = ignore_case
        self._regex = regex
        #: ``\\A`` or ``\\z`` mean the whole text, which a chunk of many lines is not: search line by line.
        self.whole_text_anchors = not fixed and ("\\A" in source or "\\z" in source)

    def find(self, data: bytes, pos: int = 0, end: int | None = None) -> tuple[int, int] | None:
        """``(start, end)`` byte offsets of the leftmost match in ``data[pos:end]``, or ``None``.

        ``^`` and ``$`` match at each line's start and end (the pattern is multi-line), so a buffer
        of whole lines can be searched in one call.
        """
        found = self._regex.search(data, pos, len(data) if end is None else end)
        if found is None:
            return None
        start, stop = found.span()
        return int(start), int(stop)

    def matches(self, text: str) -> bool:
        """Whether the pattern matches anywhere in ``text`` (one line)."""
        return self._regex.search(text.encode("utf-8", "surrogatepass")) is not None


def compile_pattern(pattern: str, *, fixed: bool = False, ignore_case: bool = False) -> Pattern:
    """``pattern`` compiled for RE2: a regular expression (RE2 syntax, multi-line ``^``/``$``) or,
    with ``fixed``, a plain string; ``PatternError`` (one line) for one it cannot or will not run."""
    options = re2.Options()
    options.log_errors = False  # RE2 would print its error on stderr: ours is the one line raised
    options.never_capture = True  # only where a match is matters: no submatch bookkeeping
    options.max_mem = MAX_MEMORY
    options.case_sensitive = not ignore_case
    options.literal = fixed
    try:
        encoded = pattern.encode("utf-8")
    except UnicodeEncodeError:
        raise PatternError(f"{pattern!r} is not a valid pattern: it is not valid Unicode") from None
    # (?m): in a buffer of many lines ^ and $ are a line's start and end, as they are for one line.
    source = encoded if fixed else _MULTILINE.encode() + encoded
    try:
        regex = re2.compile(source, options)
    except re2.error as exc:
        detail = exc.args[0] if exc.args else b""
        message = detail.decode("utf-8", "replace") if isinstance(detail, bytes) else str(detail)
        raise PatternError(refusal(pattern, message)) from None
    if regex.programsize > MAX_PROGRAM:
        raise PatternError(
            f"pattern not supported: {pattern!r} is too complex ({regex.programsize} RE2 instructions, at most "
            f"{MAX_PROGRAM}); use fewer or smaller counted repetitions ({{n}}), {_SEE}"
        )
    return Pattern(pattern, regex, fixed=fixed, ignore_case=ignore_case)
