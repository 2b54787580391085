"""Resumable and conditional downloads (RFC 9110): an item's ETag, and which answer (200, 206, 304
or 416) and bytes a request's If-None-Match, If-Range and Range headers ask for. Pure functions."""

from __future__ import annotations

import re
from dataclasses import dataclass

#: One range of a Range header: ``first-last``, ``first-`` or ``-suffix`` (digits only).
_SPEC = re.compile(r"^(\d*)-(\d*)$")
#: Longer numbers are no byte position of any object (and would cost int() time).
_MAX_DIGITS = 19


@dataclass(frozen=True, slots=True)
class Answer:
    """The status to send and, for 200 and 206, the bytes ``first..last`` (inclusive) of the object."""

    status: int
    first: int = 0
    last: int = -1

    @property
    def length(self) -> int:
        return self.last - self.first + 1

    def content_range(self, size: int) -> str | None:
        """The Content-Range header of a 206 (``bytes first-last/size``) or a 416 (``bytes */size``)."""
        if self.status == 206:
            return f"bytes {self.first}-{self.last}/{size}"
        if self.status == 416:
            return f"bytes */{size}"
        return None


def etag(sha256: str) -> str:
    """The strong ETag of an archived item: its sha256 (the bytes never change: keys are create-once)."""
    return f'"{sha256}"'


def _tags(header: str) -> list[str]:
    """The entity tags of an If-None-Match or If-Range list, their weak ``W/`` prefix dropped."""
    return [tag.strip().removeprefix("W/") for tag in header.split(",") if tag.strip()]


def not_modified(if_none_match: str | None, tag: str | None) -> bool:
    """Whether If-None-Match names the item (weak comparison, as RFC 9110 asks for this header)."""
    if if_none_match is None or tag is None:
        return False
    return if_none_match.strip() == "*" or tag in _tags(if_none_match)


def _one_range(spec: str, size: int) -> tuple[int, int] | None:
    """``first..last`` of one range within an object of ``size`` bytes; None when unsatisfiable.
    ValueError for a malformed one (the header is then ignored)."""
    match = _SPEC.match(spec.strip())
    if not match or not any(match.groups()) or any(len(g) > _MAX_DIGITS for g in match.groups()):
        raise ValueError(f"not a byte range: {spec!r}")
    first_text, last_text = match.groups()
    if not first_text:  # -N: the last N bytes
        suffix = int(last_text)
        return (max(0, size - suffix), size - 1) if suffix and size else None
    first = int(first_text)
    if last_text and int(last_text) < first:
        raise ValueError(f"not a byte range: {spec!r}")
    last = min(int(last_text), size - 1) if last_text else size - 1
    return (first, last) if first < size else None


def answer(
    *, size: int, tag: str | None, range_header: str | None, if_range: str | None, if_none_match: str | None
) -> Answer:
    """What to send for a GET of an object of ``size`` bytes whose ETag is ``tag`` (None: unknown).

    304 when If-None-Match names it; 206 for one satisfiable byte range (when an If-Range names this
    very ETag, or there is none); 416 when that one range starts past the end; otherwise 200 and the
    whole object: no or a malformed Range header, another unit, several ranges (allowed by RFC 9110,
    and no resumable download asks for them), an If-Range that is a date or another ETag.
    """
    whole = Answer(200, 0, size - 1)
    if not_modified(if_none_match, tag):
        return Answer(304)
    if range_header is None:
        return whole
    if if_range is not None and (tag is None or if_range.strip() != tag):
        return whole  # a date, a weak tag or another version: the whole object (strong comparison)
    unit, _, specs = range_header.partition("=")
    if unit.strip().lower() != "bytes" or "," in specs:
        return whole
    try:
        found = _one_range(specs, size)
    except ValueError:
        return whole
    if found is None:
        return Answer(416)
    return Answer(206, *found)
