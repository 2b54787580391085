"""Reading a page's query string: one value per name, bounded lengths and numbers, ``ValueError`` saying which.

Every value a page takes from the URL passes through here, so a hostile or mistyped query (an
over-long value, a page number that is not one) becomes a 400 page naming the field, never a
traceback or an unbounded amount of work.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from archiver.config import inputs

#: Longest value of any field: the longest session id (``inputs.MAX_ID_BYTES`` UTF-8 bytes) fits.
MAX_VALUE = inputs.MAX_ID_BYTES
#: Most repeated values of one field (``label``).
MAX_REPEATS = 20
#: Largest line or hit offset a page may start at.
MAX_START = 10_000_000

Params = Mapping[str, Sequence[str]]


def _checked(name: str, value: str, limit: int) -> str:
    if len(value) > limit:
        raise ValueError(f"{name}: too long ({len(value)} characters; at most {limit})")
    return value


def one(params: Params, name: str, *, limit: int = MAX_VALUE, strip: bool = True) -> str:
    """The field's last value (``""`` when absent), stripped unless told otherwise."""
    values = params.get(name) or [""]
    value = _checked(name, values[-1], limit)
    return value.strip() if strip else value


def many(params: Params, name: str) -> tuple[str, ...]:
    """Every non-blank value of a repeatable field, stripped."""
    values = [v.strip() for v in params.get(name, []) if v.strip()]
    if len(values) > MAX_REPEATS:
        raise ValueError(f"{name}: at most {MAX_REPEATS} values")
    return tuple(_checked(name, v, MAX_VALUE) for v in values)


def number(params: Params, name: str, *, default: int, low: int, high: int) -> int:
    """A whole number field in ``[low, high]`` (``default`` when absent or blank)."""
    text = one(params, name, limit=32)
    if not text:
        return default
    if not text.isascii() or not text.isdigit():
        raise ValueError(f"{name}: not a whole number: {text!r}")
    value = int(text)
    if not low <= value <= high:
        raise ValueError(f"{name}: out of range ({value}; from {low} to {high})")
    return value


def flag(params: Params, name: str) -> bool:
    """A checkbox: present with ``1``, ``on`` or ``true``."""
    return one(params, name, limit=8).lower() in ("1", "on", "true", "yes")
