"""`archiver grep`: the archived logs of many sessions searched at once, in parallel and in bounded memory.

Sessions come from the index (`ls`'s filters); each one's logs are streamed from the store (every
archived logs item: the logs and any live capture kept beside them, each hit naming its item then),
decompressed a megabyte at a time and searched by a bounded pool of threads (ISA-L's inflate,
the store's I/O and RE2's matching release the GIL). The pattern is RE2's (`retrieval/pattern.py`:
linear time whatever the pattern). Plain-text logs are searched a window of whole lines at a time
(`WINDOW` bytes) with one RE2 call per hit, not per line; a hit is then confirmed on its own line,
so the result is exactly that of searching line by line. A search stops at its budget (time and
bytes read, `retrieval/budget.py`) or when its reader leaves, checked between windows and chunks.
Hits are printed in the order of the sessions (newest first), each session's hits together; a
session's hits wait in a small bounded queue until its turn, so memory does not grow with the
number of sessions nor with the hits.
"""

from __future__ import annotations

import json
import os
import queue
import re
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TextIO

from archiver import logshape
from archiver.errors import ArchiverError
from archiver.layout.manifest import IndexEntry
from archiver.retrieval.budget import UNLIMITED, SearchBudget, SearchMeter
from archiver.retrieval.pattern import compile_pattern
from archiver.retrieval.query import Warn, load_listed_archive, stderr_warn
from archiver.retrieval.reading import archived_logs, logs_source, open_logs_item
from archiver.retrieval.render import escape_line
from archiver.store.base import ObjectStore
from archiver.textsafe import printable

#: Sessions searched at once (each holds a decompressor and about two megabytes of text).
DEFAULT_GREP_WORKERS = 4
#: A line longer than this (no newline in sight) is searched in pieces of this size.
MAX_LINE = 1024 * 1024
#: Hits handed from a search thread to the printer at once, and batches a session may hold back.
_BATCH = 256
_QUEUED_BATCHES = 16
#: Bytes of whole lines searched by one RE2 call: the work between two checks of the budget
#: stays small (a line longer than this is searched whole, up to MAX_LINE).
WINDOW = 64 * 1024
#: Regex metacharacters: a pattern without any is a plain string.
_META = frozenset(".^$*+?{}[]\\|()")
#: What a JSON encoder writes as itself: a plain string of these is found verbatim in NDJSON.
_JSON_VERBATIM = frozenset(chr(c) for c in range(0x20, 0x7F)) - frozenset('"\\/')
_CR_RE = re.compile(rb"\r+\n")


class Matcher:
    """The pattern of one grep: an RE2 regular expression (``grep -E`` style) or a fixed string, compiled
    once; ``PatternError`` (one line) for an invalid one or one RE2 cannot run."""

    def __init__(self, pattern: str, *, fixed: bool = False, ignore_case: bool = False) -> None:
        self.pattern = compile_pattern(pattern, fixed=fixed, ignore_case=ignore_case)
        plain = fixed or not _META & set(pattern)
        #: Whole chunks of plain text may be searched at once.
        self.chunkable = not self.pattern.whole_text_anchors
        #: Whole chunks of NDJSON may be searched at once: a match in an entry's text is a match in its raw line.
        self.json_chunkable = plain and bool(pattern) and set(pattern) <= _JSON_VERBATIM

    def matches(self, line: str) -> bool:
        return self.pattern.matches(line)


@dataclass(frozen=True, slots=True)
class Hit:
    """One matching line: which archive, which stream (``None`` when the logs do not tell), the line,
    and which of the archive's logs items (`reading.logs_source`; ``None`` when it has only one)."""

    session_id: str
    instance: str | None
    stream: str | None
    text: str
    source: str | None = None


@dataclass(slots=True)
class GrepReport:
    """What a grep went through: sessions searched, decompressed bytes, hits, sessions without logs,
    problems, and ``stopped`` (`budget.over_budget`'s line) when it stopped at its budget."""

    sessions: int = 0
    bytes: int = 0
    hits: int = 0
    without_logs: int = 0
    problems: list[str] = field(default_factory=list)
    stopped: str | None = None


@dataclass(frozen=True, slots=True)
class _Searched:
    bytes: int
    has_logs: bool = True
    problems: tuple[str, ...] = ()


class _Cancelled(Exception):
    """The printer stopped (the reader left, or an interrupt) or the budget is spent: a search thread ends early."""


# --- searching one session's text ---------------------------------------------------------------


#: ``(data, start, end)``: ``data[start:end]`` is whole lines of log bytes, each ending with a newline.
_Piece = tuple[bytes, int, int]


def _whole_chars(data: bytes) -> int:
    """How many leading bytes of ``data`` are whole UTF-8 characters (a sequence cut at its end is left out)."""
    end = len(data)
    for back in range(1, min(4, end) + 1):
        byte = data[end - back]
        if byte < 0x80:
            return end
        if byte >= 0xC0:  # the lead byte of the last sequence: complete, or cut by the end
            need = 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
            return end if back >= need else end - back
    return end


def _text_pieces(chunks: Iterable[bytes], counted: list[int]) -> Iterator[_Piece]:
    """Log bytes in pieces of whole lines; bytes counted in ``counted[0]``.

    A chunk is searched where it lies (no copy of a megabyte per chunk): only the line cut by the
    chunk's end is carried over and joined to the start of the next one. A newline byte is never
    inside a UTF-8 sequence, so a piece of whole lines decodes as it would in the whole stream.
    """
    carry = b""
    for raw in chunks:
        counted[0] += len(raw)
        first = raw.find(b"\n") + 1
        if not first:
            carry += raw
            if len(carry) > MAX_LINE:  # a line without end in sight: searched in pieces, memory stays bounded
                whole = _whole_chars(carry)  # never a character cut in two
                yield carry[:whole] + b"\n", 0, whole + 1
                carry = carry[whole:]
            continue
        start = 0
        if carry:
            head = carry + raw[:first]
            yield head, 0, len(head)
            start = first
        last = raw.rfind(b"\n") + 1
        if last > start:
            yield raw, start, last
        carry = raw[last:]
    if carry:
        yield carry + b"\n", 0, len(carry) + 1


def _window_end(data: bytes, pos: int, end: int) -> int:
    """Where the window of whole lines from ``pos`` ends: at most `WINDOW` bytes on, or after its one long line."""
    if end - pos <= WINDOW:
        return end
    cut = data.rfind(b"\n", pos, pos + WINDOW) + 1
    if cut > pos:
        return cut
    cut = data.find(b"\n", pos + WINDOW, end) + 1
    return cut if cut > 0 else end


def _piece_hits(piece: _Piece, matcher: Matcher, meter: SearchMeter | None = None) -> Iterator[str]:
    """The lines of a piece that match, found with one RE2 search per hit (not one per line), a
    window at a time; ``_Cancelled`` between windows once ``meter`` says stop."""
    raw, pos, end = piece
    data = raw[pos:end] if pos or end != len(raw) else raw
    if b"\r" in data:
        data = _CR_RE.sub(b"\n", data)  # lines lose their CRs as `archiver logs` prints them
    if not data.isascii():  # searched as shown: an invalid byte is U+FFFD (ASCII, most logs, needs no copy)
        data = data.decode("utf-8", "replace").encode("utf-8")
    pos, end = 0, len(data)
    find = matcher.pattern.find
    while pos < end:
        if meter is not None and meter.spent():
            raise _Cancelled
        window = _window_end(data, pos, end)
        found = find(data, pos, window)
        if found is None or found[0] >= window:
            pos = window  # an empty match at the window's end is the next window's (or no line at the end)
            continue
        at = found[0]
        start = max(pos, data.rfind(b"\n", pos, at) + 1)
        stop = data.find(b"\n", at, window)
        if stop < 0:
            stop = window
        # A match may span lines (`a\sb`): the line alone decides.
        if find(data, start, stop) is not None:
            yield data[start:stop].decode("utf-8").rstrip("\r")
        pos = stop + 1


def _search_text(
    chunks: Iterable[bytes], matcher: Matcher, counted: list[int], meter: SearchMeter | None
) -> Iterator[tuple[str | None, str]]:
    for piece in _text_pieces(chunks, counted):
        for line in _piece_hits(piece, matcher, meter):
            yield None, line


def _search_ndjson(
    chunks: Iterable[bytes], matcher: Matcher, counted: list[int], meter: SearchMeter | None
) -> Iterator[tuple[str | None, str]]:
    # Candidate raw lines first (the plain string is there verbatim), then only those are parsed.
    for piece in _text_pieces(chunks, counted):
        for raw in _piece_hits(piece, matcher, meter):
            entry = logshape.ndjson_line(raw)
            if entry is not None and matcher.matches(entry.text):
                yield entry.stream, entry.text


def _search_lines(
    chunks: Iterable[bytes], shape: str, matcher: Matcher, counted: list[int]
) -> Iterator[tuple[str | None, str]]:
    def counting() -> Iterator[bytes]:
        for chunk in chunks:
            counted[0] += len(chunk)
            yield chunk

    for line in logshape.read_lines(counting(), shape):
        if matcher.matches(line.text):
            yield line.stream, line.text


def _metered(chunks: Iterable[bytes], meter: SearchMeter) -> Iterator[bytes]:
    for chunk in chunks:
        if meter.spent():
            raise _Cancelled
        meter.add(len(chunk))
        yield chunk


def search_chunks(
    chunks: Iterable[bytes], shape: str, matcher: Matcher, counted: list[int], meter: SearchMeter | None = None
) -> Iterator[tuple[str | None, str]]:
    """``(stream, line)`` of every matching line of decompressed log chunks of ``shape``; bytes into
    ``counted[0]``; with a ``meter``, bytes charged to it and ``_Cancelled`` once it says stop."""
    if meter is not None:
        chunks = _metered(chunks, meter)
    if shape == logshape.TEXT and matcher.chunkable:
        return _search_text(chunks, matcher, counted, meter)
    if shape == logshape.NDJSON and matcher.json_chunkable:
        return _search_ndjson(chunks, matcher, counted, meter)
    return _search_lines(chunks, shape, matcher, counted)


# --- many sessions --------------------------------------------------------------------------------


def lower_priority(nice: int) -> None:
    """Make the calling thread's nice value the process's plus ``nice`` (Linux: ``setpriority`` on a
    thread id is that thread's alone; a thread made by it inherits it); nothing where the system
    cannot (another OS, a limit): a priority is a preference, never a reason to fail a search."""
    if nice <= 0:
        return
    try:
        tid = threading.get_native_id()
        wanted = min(19, os.getpriority(os.PRIO_PROCESS, os.getpid()) + nice)
        if os.getpriority(os.PRIO_PROCESS, tid) < wanted:
            os.setpriority(os.PRIO_PROCESS, tid, wanted)
    except (AttributeError, OSError):
        pass


class _Outbox:
    """One session's hits on their way to the printer: batches in a bounded queue, ``None`` at the end."""

    def __init__(self, meter: SearchMeter) -> None:
        self._queue: queue.Queue[list[Hit] | None] = queue.Queue(maxsize=_QUEUED_BATCHES)
        self._meter = meter
        self._batch: list[Hit] = []

    def add(self, hit: Hit) -> None:
        self._batch.append(hit)
        if len(self._batch) >= _BATCH:
            self.flush()

    def flush(self) -> None:
        if self._meter.spent():
            raise _Cancelled
        if self._batch:
            self._queue.put(self._batch)  # blocks while the printer is on earlier sessions
            self._batch = []

    def keep(self) -> None:
        """Hand over the hits found before the budget ran out (the printer still takes them)."""
        if self._batch:
            self._queue.put(self._batch)
            self._batch = []

    def close(self) -> None:
        self._queue.put(None)

    def batches(self) -> Iterator[list[Hit]]:
        while (batch := self._queue.get()) is not None:
            yield batch


def _search_session(
    store: ObjectStore, entry: IndexEntry, matcher: Matcher, outbox: _Outbox, meter: SearchMeter
) -> _Searched:
    counted = [0]
    problems: list[str] = []
    name = printable(entry.session_id)
    try:
        loaded = load_listed_archive(store, entry)
        items = archived_logs(loaded.manifest)
        if not items:
            return _Searched(0, has_logs=False)  # its logs expired or were gone: nothing to search
        for n, item in enumerate(items):
            source = logs_source(n) if len(items) > 1 else None
            where = name if source is None else f"{name} ({source})"
            try:  # each item on its own: a damaged capture must not hide the hits of the logs
                opened = open_logs_item(store, loaded, item)
                for stream, text in search_chunks(opened.chunks, opened.shape, matcher, counted, meter):
                    outbox.add(Hit(entry.session_id, entry.instance, stream, text, source))
                opened.check()
            except ArchiverError as exc:  # corrupt, truncated or altered: what was found before still shows
                problems.append(f"{where}: {exc}")
            outbox.flush()
    except ArchiverError as exc:  # one unreadable archive must not end the search of the others
        problems.append(f"{name}: {exc}")
    except _Cancelled:
        if meter.reason is not None:  # the budget, not the reader: what was found is still printed
            outbox.keep()
    finally:
        outbox.close()
    return _Searched(counted[0], problems=tuple(problems))


def format_hit(hit: Hit, fmt: str, *, escape: bool) -> str:
    """One output line: ``session  stream  line`` (``-`` for an unknown stream), or a JSON object;
    ``session  source  stream  line`` (a ``source`` field) for a hit of an archive with several logs items."""
    if fmt == "json":
        document = {"session": hit.session_id, "instance": hit.instance, "stream": hit.stream, "line": hit.text}
        if hit.source is not None:
            document["source"] = hit.source
        # ASCII only: safe on any terminal, and a lone surrogate of an id stays encodable.
        return json.dumps(document, ensure_ascii=True)
    text = escape_line(hit.text) if escape else hit.text
    source = "" if hit.source is None else f"{hit.source}  "
    return f"{printable(hit.session_id)}  {source}{hit.stream or '-'}  {text}"


def grep_sessions(
    store: ObjectStore,
    entries: Sequence[IndexEntry],
    matcher: Matcher,
    out: TextIO,
    *,
    fmt: str = "table",
    escape: bool = False,
    workers: int = DEFAULT_GREP_WORKERS,
    progress: Callable[[int], None] | None = None,
    warn: Warn = stderr_warn,
    budget: SearchBudget = UNLIMITED,
    cancel: threading.Event | None = None,
    nice: int = 0,
) -> GrepReport:
    """Search the logs of ``entries`` (in this order) and write every matching line to ``out``.

    ``workers`` sessions are searched at once, at most twice as many are under way; each
    session's hits are written together, in the order of ``entries`` (those of its logs, then of each
    live capture kept beside them, each hit naming its item). A session without archived
    logs is counted and skipped; one whose logs cannot be read or do not match their manifest is
    reported through ``warn`` (its hits, printed already, are suspect) and counted as a problem.
    ``progress(1)`` after each session. ``BrokenPipeError`` from ``out`` ends the search at once
    and propagates. Once ``budget`` is spent the search stops: what was found is written (the
    sessions under way may have been searched in part) and ``report.stopped`` says so. Setting
    ``cancel`` (the caller's reader left) stops every search thread within a window of text.
    ``nice`` > 0 lowers the search threads' CPU priority (Linux: per thread), so that a server's
    request threads are scheduled before them.
    """
    report = GrepReport()
    meter = SearchMeter(budget, cancel=cancel)
    pending: deque[tuple[_Outbox, Future[_Searched]]] = deque()
    todo = deque(entries)
    with ThreadPoolExecutor(
        max_workers=max(1, workers), thread_name_prefix="grep", initializer=lower_priority, initargs=(nice,)
    ) as pool:

        def submit_next() -> None:
            # Asked only while sessions remain: a search that read everything was not stopped.
            if todo and not meter.spent():
                entry = todo.popleft()
                outbox = _Outbox(meter)
                pending.append((outbox, pool.submit(_search_session, store, entry, matcher, outbox, meter)))

        for _ in range(2 * max(1, workers)):
            submit_next()
        try:
            while pending:
                outbox, future = pending[0]
                for batch in outbox.batches():
                    out.write("".join(format_hit(hit, fmt, escape=escape) + "\n" for hit in batch))
                    report.hits += len(batch)
                searched = future.result()
                pending.popleft()
                report.sessions += 1
                report.bytes += searched.bytes
                report.without_logs += 0 if searched.has_logs else 1
                for problem in searched.problems:
                    report.problems.append(problem)
                    warn(problem)
                if progress is not None:
                    progress(1)
                submit_next()
        except BaseException:
            # The reader left or an interrupt: stop the searches and unblock those waiting on a full queue.
            meter.stop()
            for outbox, future in pending:
                if not future.cancel() and not future.done():
                    for _batch in outbox.batches():
                        pass
            raise
    report.stopped = meter.reason
    return report
