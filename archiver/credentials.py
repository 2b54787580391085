"""Secrets the archiver holds: the upstream API token, which never shows itself in a repr, log line or traceback."""

from __future__ import annotations


class Token:
    """The API token: a string that never shows itself in a repr, str, log line or traceback."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        value = value.strip()
        if not value:
            raise ValueError("the API token is empty")
        if any(c.isspace() or ord(c) < 32 for c in value):
            raise ValueError("the API token contains whitespace or control characters")
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Token('***')"

    __str__ = __repr__
