"""Making untrusted text (caller-chosen ids, upstream strings) safe to print on a terminal or in a log line,
and telling whether it encodes as UTF-8 at all (the lowest floor's text primitive)."""

from __future__ import annotations

import unicodedata

#: Control, format, surrogate and line/paragraph-separator characters: what can drive a terminal,
#: hide itself, or fail to encode as UTF-8.
_ESCAPED_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})


def printable(text: str) -> str:
    r"""``text`` with every character that could control a terminal or hide itself escaped.

    Control characters (ESC, CR, BEL, C1), format characters (bidi overrides, zero-width joiners:
    two ids that look the same must not print the same), line/paragraph separators and lone
    surrogates become ``\xNN``/``\uNNNN``; a backslash is doubled so the escaping is unambiguous.
    The result always encodes as UTF-8 (a lone ``\ud800`` shows as the six characters ``\ud800``).
    """
    if text.isprintable() and "\\" not in text:
        return text  # fast path: the common case is a plain UUID (surrogates are not printable)
    return "".join("\\\\" if ch == "\\" else _escaped(ch) for ch in text)


def one_line(text: str) -> str:
    """A message made one printable line: what ``printable`` escapes (line breaks, terminal controls,
    lone surrogates) escaped the same way, backslashes left alone (messages quote values already
    shown with ``repr`` or ``printable``); an error message stays one line whatever path it names."""
    return text if text.isprintable() else "".join(_escaped(ch) for ch in text)


def valid_utf8(text: str) -> bool:
    """Whether `text` encodes as UTF-8, i.e. holds no lone surrogate (JSON's "\\ud800" decodes to one,
    and it would fail later, in SQLite, the store or the exposition)."""
    if text.isascii():
        return True  # the common case, and far cheaper than encoding
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _escaped(ch: str) -> str:
    if unicodedata.category(ch) not in _ESCAPED_CATEGORIES:
        return ch
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"
