"""Secrets the archiver holds: the upstream API token, which never shows itself in a repr, log line or
traceback, and follows its file when the file is replaced (a rotated Kubernetes Secret)."""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

log = logging.getLogger(__name__)


def _checked(value: str) -> str:
    value = value.strip()
    if not value:
        raise ValueError("the API token is empty")
    if any(c.isspace() or ord(c) < 32 for c in value):
        raise ValueError("the API token contains whitespace or control characters")
    return value


def _signature(path: Path) -> tuple[int, int, int, int]:
    # stat() follows symlinks: a Kubernetes Secret swaps its `..data` symlink to a new directory,
    # so the file behind the path changes inode even when its size and mtime happen to match.
    st = os.stat(path)
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


class Token:
    """The API token: a string that never shows itself in a repr, str, log line or traceback.

    A token read from a file (`Token.from_file`) is re-read when the file changes (one stat per
    use: device, inode, size, mtime) and on demand (`reload`, after a 401), so a rotated Secret takes
    effect without a restart. A file that cannot be read or holds no valid token keeps the previous
    value (with a warning naming the file, never the value): a Secret is briefly absent mid-swap.
    """

    __slots__ = ("_lock", "_path", "_problem", "_signature", "_value", "_values")

    def __init__(self, value: str) -> None:
        self._value = _checked(value)
        self._path: Path | None = None
        self._signature: tuple[int, int, int, int] | None = None
        self._lock = threading.Lock()
        self._problem: str | None = None
        #: Every value this token has held, for the log redactor (an old one may still be echoed).
        self._values: tuple[str, ...] = (self._value,)

    @classmethod
    def from_file(cls, path: Path) -> Token:
        """The token in `path` (OSError if unreadable, ValueError if empty or malformed)."""
        signature = _signature(path)
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            # Not str(exc): it would quote a byte of the token.
            raise ValueError("the API token file is not UTF-8") from None
        token = cls(text)
        token._path = path
        token._signature = signature
        return token

    def reveal(self) -> str:
        if self._path is not None:
            self._refresh(force=False)
        return self._value

    def reload(self) -> bool:
        """Re-read the file now (the upstream said 401); True when the value changed."""
        if self._path is None:
            return False
        return self._refresh(force=True)

    def known_values(self) -> tuple[str, ...]:
        """Every value held so far, current last: what the log redactor must hide."""
        return self._values

    def _refresh(self, *, force: bool) -> bool:
        assert self._path is not None
        with self._lock:
            signature = None
            try:
                signature = _signature(self._path)
                if signature == self._signature and not force:
                    return False
                value = _checked(self._path.read_text(encoding="utf-8"))
            except UnicodeDecodeError:
                return self._cannot_reread(signature, "not UTF-8")
            except OSError as exc:
                return self._cannot_reread(signature, exc.strerror or type(exc).__name__)
            except ValueError as exc:  # _checked's messages never carry the value
                return self._cannot_reread(signature, str(exc))
            self._signature = signature
            self._problem = None
            if value == self._value:
                return False
            self._value = value
            if value not in self._values:
                self._values = (*self._values, value)
            log.info("API token file %s changed: using the new token", self._path)
            return True

    def _cannot_reread(self, signature: tuple[int, int, int, int] | None, reason: str) -> bool:
        # Remembered, so a file that stays broken is read and reported once, not on every request.
        if signature is not None:
            self._signature = signature
        if reason != self._problem:
            self._problem = reason
            log.warning("API token file %s cannot be re-read (%s); keeping the previous token", self._path, reason)
        return False

    def __repr__(self) -> str:
        return "Token('***')"

    __str__ = __repr__
