"""Making untrusted text (caller-chosen ids, upstream strings) safe to print on a terminal or in a log line."""

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
    out: list[str] = []
    for ch in text:
        if ch == "\\":
            out.append("\\\\")
        elif unicodedata.category(ch) in _ESCAPED_CATEGORIES:
            code = ord(ch)
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")
        else:
            out.append(ch)
    return "".join(out)
