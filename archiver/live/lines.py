"""Cutting a follow stream's body into complete lines: a line counts only once its newline arrived."""

from __future__ import annotations

#: A "line" that grows past this without a newline is cut here (memory stays bounded whatever the
#: upstream sends); the capture then holds it as several lines, which the archive step sees as a
#: difference from the after-end body and keeps both.
MAX_LINE = 1024 * 1024


def is_blank(line: bytes) -> bool:
    """Keep-alive lines (empty or whitespace only) carry nothing: they are never kept. In plain text
    a program's own empty line looks the same, so it is dropped too (the comparison with the
    after-end body ignores blank lines for that reason)."""
    return not line.strip()


class LineSplitter:
    """The complete, non-blank lines of a body fed in pieces as the network cuts it.

    The unfinished tail is held back: a stream cut mid-line gives it up (`discard`), and only a body
    that ended properly makes it a line (`finish`). Lines are the raw bytes without their ``\\n``.
    """

    __slots__ = ("_pending",)

    def __init__(self) -> None:
        self._pending = b""

    def feed(self, data: bytes) -> list[bytes]:
        """The lines completed by ``data``, in order."""
        if b"\n" not in data:
            self._pending += data
            return self._overlong([]) if len(self._pending) > MAX_LINE else []
        *lines, self._pending = (self._pending + data).split(b"\n")
        out = [line for line in lines if not is_blank(line)]
        if any(len(line) > MAX_LINE for line in out):
            out = [line[i : i + MAX_LINE] for line in out for i in range(0, len(line), MAX_LINE)]
        return self._overlong(out) if len(self._pending) > MAX_LINE else out

    def _overlong(self, out: list[bytes]) -> list[bytes]:
        while len(self._pending) > MAX_LINE:
            out.append(self._pending[:MAX_LINE])
            self._pending = self._pending[MAX_LINE:]
        return out

    def finish(self) -> list[bytes]:
        """At a proper end of the body: the last line, if it lacked its newline."""
        pending, self._pending = self._pending, b""
        return [] if is_blank(pending) else [pending]

    def discard(self) -> int:
        """At a cut: forget the unfinished tail (the next replay sends it whole); its length."""
        dropped, self._pending = len(self._pending), b""
        return dropped
