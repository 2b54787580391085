"""The bounds of what a user hands the archiver at an edge (an argument, a flag, a browse query):
one pure checker per kind of value, returning it or raising ``InputError`` (a ``ValueError``) with
a one-line reason.

The CLI (`archiver.cli.params`) turns it into a usage error (exit 2), the browser into a 400 page,
the upstream client into an ``ApiRequestError``; the README lists the limits.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Final

from archiver.errors import InputError
from archiver.textsafe import printable, valid_utf8

#: Longest session or player id, in UTF-8 bytes. Any 500-character id (at most 2,000 bytes) fits
#: twice over; percent-encoded (3 characters a byte) it stays within 12 KiB of URL, under the 16 KiB
#: request line HTTP front ends commonly accept and far under httpx's 64 KiB (whose `InvalidURL`
#: used to escape as a traceback). Store keys need no bound: past 150 characters the key form of an
#: id is shortened with a hash (`archiver.layout.keys`).
MAX_ID_BYTES: Final = 4096
#: Longest artifact path inside a container, in UTF-8 bytes (Linux's PATH_MAX less its NUL).
MAX_ARTIFACT_PATH_BYTES: Final = 4095
#: Longest local path (a --state-dir, a file:// store, --out, --checkpoint), in bytes, and longest
#: single name in it: Linux's PATH_MAX (less its NUL) and NAME_MAX.
MAX_PATH_BYTES: Final = 4095
MAX_NAME_BYTES: Final = 255
#: What `--instance` calls an archive in the layout written before instances existed.
LEGACY_INSTANCE: Final = "legacy"
#: Longest instance name: a creation time and the largest re-open revision.
MAX_INSTANCE_CHARS: Final = len("20261122T060305.123Z-r999999")
#: How much of a rejected value an error message shows.
_SHOWN = 60


def shown(text: str, limit: int = _SHOWN) -> str:
    """A rejected value for an error message: printable, cut to ``limit`` characters with its size."""
    if len(text) <= limit:
        return repr(printable(text))
    return f"{printable(text[:limit])!r}… ({len(text)} characters)"


def _utf8_size(text: str) -> int:
    # surrogatepass: an archived id may hold a lone surrogate (JSON allows one); it counts its 3 bytes.
    return len(text.encode("utf-8", "surrogatepass"))


def session_id(text: str, what: str = "session id") -> str:
    """A session (or player) id to look up in the store: not empty, at most ``MAX_ID_BYTES`` bytes.

    Anything else goes: control characters, ``/``, ``..``, ``%`` and lone surrogates are all made
    key-safe by ``keys.escape_session_id`` (archives of such ids exist and must stay reachable).
    """
    if not text:
        raise InputError(f"{what} must not be empty")
    size = _utf8_size(text)
    if size > MAX_ID_BYTES:
        raise InputError(f"{what} too long: {size} bytes, at most {MAX_ID_BYTES} (UTF-8): {shown(text)}")
    return text


def sendable_id(text: str, what: str = "session id") -> str:
    """A session id to send to the upstream in a URL: a ``session_id`` that is also valid UTF-8.

    A lone surrogate (what Python makes of a command-line byte that is not UTF-8) has no
    percent-encoding; the upstream never lists such an id (its list parser quarantines it).
    """
    session_id(text, what)
    if not valid_utf8(text):
        raise InputError(f"{what} {shown(text)} is not valid UTF-8 (an undecodable byte or a lone surrogate)")
    return text


def instance(text: str) -> str:
    """An ``--instance`` value: at most ``MAX_INSTANCE_CHARS``, the longest instance name. Whether it
    names an archive (an instance name like ``20261122T060305.123Z`` or ``legacy``) is for the
    lookup to say: its error lists the archives there are."""
    if len(text) > MAX_INSTANCE_CHARS:
        raise InputError(
            f"not an instance name (like 20261122T060305.123Z) or {LEGACY_INSTANCE}: {shown(text)}, "
            f"longer than {MAX_INSTANCE_CHARS} characters"
        )
    return text


def artifact_path(text: str) -> str:
    """A configured artifact path: absolute, no NUL, and a ``sendable_path``."""
    if not text.startswith("/"):
        raise InputError(f"artifact paths are absolute paths inside the container, got {shown(text)}")
    if "\x00" in text:
        raise InputError(f"artifact path {shown(text)} holds a NUL character")
    return sendable_path(text)


def sendable_path(text: str) -> str:
    """An artifact path to send to the upstream in a URL: valid UTF-8, at most ``MAX_ARTIFACT_PATH_BYTES``."""
    if not valid_utf8(text):
        raise InputError(f"artifact path {shown(text)} is not valid UTF-8")
    size = _utf8_size(text)
    if size > MAX_ARTIFACT_PATH_BYTES:
        raise InputError(f"artifact path too long: {size} bytes, at most {MAX_ARTIFACT_PATH_BYTES}: {shown(text)}")
    return text


def local_path(path: str | os.PathLike[str], what: str = "path", *, text: bool = False) -> Path:
    """A local file or directory path the OS can take: not empty (an unset variable, not the current
    directory), no NUL, at most ``MAX_PATH_BYTES`` bytes, no name in it over ``MAX_NAME_BYTES`` (what
    the filesystem would refuse later, mid-command); with ``text``, also valid UTF-8."""
    name = os.fspath(path)
    if not name:
        raise InputError(f"{what} must not be empty (use . for the current directory)")
    if "\x00" in name:
        raise InputError(f"{what} {shown(name)} holds a NUL character")
    if text and not valid_utf8(name):
        raise InputError(f"{what} {shown(name)} is not valid UTF-8 (an undecodable byte)")
    try:
        raw = os.fsencode(name)
    except UnicodeEncodeError:
        raise InputError(f"{what} {shown(name)} cannot be a file name (it holds a lone surrogate)") from None
    if len(raw) > MAX_PATH_BYTES:
        raise InputError(f"{what} too long: {len(raw)} bytes, at most {MAX_PATH_BYTES}: {shown(name)}")
    longest = max(len(part) for part in raw.split(b"/"))
    if longest > MAX_NAME_BYTES:
        raise InputError(f"{what} has a name of {longest} bytes, at most {MAX_NAME_BYTES}: {shown(name)}")
    return Path(name)


def count(text: str, what: str, *, low: int, high: int) -> int:
    """A plain decimal count within ``low..high``: ASCII digits only (``int`` would also take signs,
    ``_``, other scripts' digits, and thousands of digits slowly)."""
    digits = text.strip()
    if not (digits.isascii() and digits.isdigit()) or len(digits.lstrip("0")) > len(str(high)):
        raise InputError(f"{what}: not a count: {shown(text)}")
    number = int(digits.lstrip("0") or "0")
    if not low <= number <= high:
        raise InputError(f"{what} must be between {low} and {high}, got {number}")
    return number
