"""The archive step's use of live captures (`archiver.live`): which captures of an ended session to keep.

The rules (README, "Live log capture"): the logs read after the end are archived as before; a
capture segment is kept beside them only when it is not a line prefix of them (the service lost
or changed lines the stream saw), and when the after-end read finds nothing (404, or an empty
body), or fails otherwise until the deadline, the capture is the logs. Lines are compared as
`logshape` reads them (the text of each NDJSON entry or plain line), blank lines left
out on both sides: the capture never keeps one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from archiver import logshape
from archiver.live.policy import Finish
from archiver.live.segment import FOLLOWING, SegmentRow
from archiver.live.store import CaptureStore
from archiver.store.gzipstream import gunzip

#: Bytes read at a time from a spool file or a capture.
_BLOCK = 256 * 1024
#: Bytes of a body looked at to tell its shape.
_HEAD = 64


def is_line_prefix(capture: Iterable[str], body: Iterable[str]) -> bool:
    """Whether every line of ``capture`` is, in order, the next line of ``body`` (blank lines
    skipped on both sides): the body holds everything the capture saw (pure, streaming)."""
    rest = (line for line in body if line.strip())
    for line in capture:
        if not line.strip():
            continue
        if next(rest, None) != line:
            return False
    return True


def texts(chunks: Iterable[bytes], shape: str | None, content_type: str = "") -> Iterator[str]:
    """The line texts of a log body of ``shape`` (sniffed from its first bytes when None)."""
    iterator = iter(chunks)
    head = b""
    if shape is None:
        for chunk in iterator:
            head += chunk
            if len(head.lstrip()) >= _HEAD:
                break
        shape = logshape.sniff(head, content_type)

    def replay() -> Iterator[bytes]:
        if head:
            yield head
        yield from iterator

    return (line.text for line in logshape.read_lines(replay(), shape))


def spooled_texts(path: Path, content_type: str) -> Iterator[str]:
    """The line texts of a spooled (gzip-compressed) log body."""

    def blocks() -> Iterator[bytes]:
        with path.open("rb") as f:
            while block := f.read(_BLOCK):
                yield block

    return texts(gunzip(blocks(), path.name), None, content_type)


def capture_state(row: SegmentRow) -> str:
    """How complete an archived segment is: its own final state, and `gap` for one still marked as
    followed while nothing follows it (the daemon stopped following, or died, before the end)."""
    return Finish.GAP if row.state == FOLLOWING else row.state


class LiveLogs:
    """The captures of one state dir as the fetch stage sees them (thread-safe)."""

    def __init__(self, captures: CaptureStore, following: Callable[[str], bool] = lambda key: False) -> None:
        self.captures = captures
        self._following = following

    def following(self, key: str) -> bool:
        """A capture of this instance may still grow: its follow has not seen the stream's end yet."""
        return self._following(key)

    def segments(self, key: str) -> list[SegmentRow]:
        """The instance's capture segments that hold lines, oldest first."""
        return [row for row in self.captures.segments(key) if row.kept.lines > 0]

    def read(self, row: SegmentRow) -> Iterator[bytes]:
        return self.captures.read(row)

    def kept(self, segments: list[SegmentRow], after_end: Path, content_type: str) -> list[SegmentRow]:
        """The segments to archive beside the logs read after the end: those that are no line
        prefix of them."""
        return [
            row
            for row in segments
            if not is_line_prefix(texts(self.read(row), row.shape), spooled_texts(after_end, content_type))
        ]

    def forget(self, key: str) -> None:
        """The instance's logs are in the spool: its captures are no longer needed (kept while a
        follow still appends, e.g. after the session was listed again)."""
        if not self.following(key):
            self.captures.remove(key)
