"""Searching archived logs from the browser: `archiver grep` on a thread, its hits numbered and handed out as they come.

The search runs ``archiver.retrieval.grep.grep_sessions`` (parallel, bounded memory, each log's
sha256 checked) on a thread of its own, over the sessions ``list_sessions`` finds for the filters.
Its JSON hits are taken from the output it writes; hits before the page's ``start`` are only
counted, the page's ``limit`` (plus one, to know whether more follow) are handed to the page, and
then the output refuses more (``BrokenPipeError``, grep's own signal to stop). Each shown hit gets
the number of its line as the log viewer counts it, by reading that session's log lines up to the
hit, so a hit links to ``/sessions/{id}/logs?start=…#L{n}`` (with ``capture=N`` for a hit in the
Nth live capture kept beside the logs). The page's reader leaving stops the search the same way.
"""

from __future__ import annotations

import json
import logging
import math
import queue
import threading
from collections.abc import Generator, Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any, TextIO, cast

from archiver import logshape
from archiver.browse import params as p
from archiver.browse.listing import ListQuery, parse_list_query
from archiver.config.command_options import BROWSE_OPTIONS
from archiver.errors import ArchiverError
from archiver.index import grepfilter
from archiver.layout.codec import iso_utc
from archiver.retrieval.budget import SearchBudget, SearchMeter
from archiver.retrieval.grep import GrepReport, Matcher, grep_sessions, lower_priority
from archiver.retrieval.query import LEGACY, list_sessions, load_archive, quiet
from archiver.retrieval.reading import logs_index, open_logs
from archiver.store.base import ObjectStore

log = logging.getLogger("archiver.browse")

#: Hits on one results page unless the query asks for another number, and the most it may ask.
DEFAULT_LIMIT = 100
MAX_LIMIT = 1000
#: Sessions one search reads at once. One: four searches at a time must leave the request threads
#: the GIL (each worker takes it back after every window of text); RE2 reads ~200 MB/s on one core.
SEARCH_WORKERS = 1
#: How much lower than the request threads' the CPU priority of a search's threads is (nice).
SEARCH_NICE = 10
#: Longest pattern accepted (a regular expression is compiled once per search).
MAX_PATTERN = 1000
#: Seconds without a hit after which the page is sent a few bytes: a proxy keeps the response
#: open, and a reader who left is noticed (the write fails) and the search stopped within a
#: couple of these (the first write after the reader left may still succeed).
HEARTBEAT = 1.0
_OPTION_DEFAULTS = {opt.key: opt.converted_default for opt in BROWSE_OPTIONS}
#: A search's budget unless the browser is given another: the defaults of `--search.max-seconds`
#: and `--search.max-bytes`.
DEFAULT_BUDGET = SearchBudget(_OPTION_DEFAULTS["search_max_seconds"], _OPTION_DEFAULTS["search_max_bytes"])


@dataclass(frozen=True)
class SearchQuery:
    """A log search as typed: the pattern, how it matches, the sessions' filters, the page of hits."""

    pattern: str
    fixed: bool
    ignore_case: bool
    filters: ListQuery
    limit: int
    start: int

    def matcher(self) -> Matcher:
        """The compiled pattern; ``ValueError`` (with the regex error) for an invalid one."""
        return Matcher(self.pattern, fixed=self.fixed, ignore_case=self.ignore_case)

    def page_pairs(self, start: int) -> list[tuple[str, str]]:
        """The query of the page of hits from ``start``: the same search over the same, absolute, time range."""
        f = self.filters
        pairs = [("q", self.pattern), ("fixed", "1" if self.fixed else ""), ("icase", "1" if self.ignore_case else "")]
        pairs += [("since", iso_utc(f.since) or ""), ("until", iso_utc(f.until) or "")]
        pairs += [(k, v) for k, v in f.filter_pairs() if k not in ("since", "until")]
        return [*pairs, ("limit", str(self.limit) if self.limit != DEFAULT_LIMIT else ""), ("start", str(start))]


def parse_search_query(params: p.Params, now: float) -> SearchQuery | None:
    """The search page's query (``None`` without a pattern: only the form); ``ValueError`` naming the bad field.

    The time range is taken in whole seconds, open ends closed at ``now``: every page of one search
    carries it as absolute times, so the hits are counted over the same sessions on each page.
    """
    pattern = p.one(params, "q", limit=MAX_PATTERN, strip=False)
    filters = parse_list_query(params, now)
    if not pattern:
        return None
    until = float(math.ceil(filters.until if filters.until is not None else max(now, filters.since)))
    pinned = replace(filters, since=float(math.floor(filters.since)), until=until)
    query = SearchQuery(
        pattern,
        p.flag(params, "fixed"),
        p.flag(params, "icase"),
        pinned,
        p.number(params, "limit", default=DEFAULT_LIMIT, low=1, high=MAX_LIMIT),
        p.number(params, "start", default=0, low=0, high=p.MAX_START),
    )
    query.matcher()  # a bad pattern is the page's 400, not the search thread's problem
    return query


@dataclass(frozen=True, slots=True)
class ShownHit:
    """A hit on the page: its archive, stream and line, the line's number in the log viewer (if found),
    and which logs item of the archive it is in (`grep.Hit.source`: ``None`` when it has only one)."""

    session_id: str
    instance: str | None
    stream: str | None
    text: str
    number: int | None
    source: str | None = None

    @property
    def archive(self) -> str:
        """The ``instance`` query value naming this hit's archive."""
        return self.instance if self.instance is not None else LEGACY

    @property
    def capture(self) -> int:
        """The ``capture`` query value of the log view holding this hit (0: the logs)."""
        return logs_index(self.source)


@dataclass
class SearchSummary:
    """How a search went, for the page's last line."""

    sessions: int = 0
    searched: int = 0
    #: Hits shown on this page, and the offset of the first.
    shown: int = 0
    start: int = 0
    #: More hits follow this page (the search was stopped at the page's limit).
    more: bool = False
    #: The whole search ran (``report`` is set): no limit hit, no failure.
    report: GrepReport | None = None
    problems: list[str] = field(default_factory=list)
    failed: str | None = None
    #: Why every log is read (the pattern has no literal token for the index's filters), or None.
    note: str | None = None


class _HitSink:
    """grep's output: counts hits up to the page, hands the page's to the queue, then refuses more."""

    def __init__(self, events: queue.Queue[tuple[str, Any]], stop: threading.Event, start: int, wanted: int):
        self._events = events
        self._stop = stop
        self._start = start
        self._wanted = wanted
        self._count = 0
        self._current: tuple[str, str | None, str | None] | None = None
        self._nth = 0

    def write(self, text: str) -> int:
        for line in text.splitlines():
            if self._stop.is_set() or self._count >= self._wanted:
                break
            doc = json.loads(line)
            archive = (doc["session"], doc["instance"], doc.get("source"))
            self._nth = self._nth + 1 if archive == self._current else 0
            self._current = archive
            if self._count >= self._start:
                self._events.put(("hit", (doc, self._nth)))
            self._count += 1
        self.check()
        return len(text)

    def check(self) -> None:
        """``BrokenPipeError`` once the page has its hits or its reader left: grep's signal to stop every search."""
        if self._stop.is_set() or self._count >= self._wanted:
            raise BrokenPipeError

    def flush(self) -> None:
        """Nothing is buffered here."""


class _Numberer:
    """Finds the log viewer's number of each hit's line, reading each logs item's lines once, up to its last hit.

    It reads on the page's request thread, line by line: ``meter`` (the search's budget, its reader
    leaving) bounds it too; past it a hit is shown without its line number.
    """

    def __init__(self, store: ObjectStore, matcher: Matcher, meter: SearchMeter | None = None) -> None:
        self._store = store
        self._matcher = matcher
        self._meter = meter or SearchMeter()
        self._archive: tuple[str, str | None, int] | None = None
        self._lines: Iterator[tuple[int, str]] = iter(())
        self._seen = 0

    def _matching(self, sid: str, instance: str | None, capture: int) -> Iterator[tuple[int, str]]:
        loaded = load_archive(self._store, sid, instance or LEGACY, note=quiet)
        opened = open_logs(self._store, loaded, capture=capture)
        for number, line in enumerate(logshape.read_lines(self._metered(opened.chunks), opened.shape), 1):
            if self._matcher.matches(line.text):
                yield number, line.text

    def _metered(self, chunks: Iterable[bytes]) -> Iterator[bytes]:
        for chunk in chunks:
            if self._meter.spent():
                return  # the lines after here go unnumbered
            self._meter.add(len(chunk))
            yield chunk

    def number(self, sid: str, instance: str | None, capture: int, nth: int, text: str) -> int | None:
        """The number of the ``nth`` (from 0) matching line of the archive's logs item ``capture``
        (`reading.logs_item`), when its text is the hit's."""
        if (sid, instance, capture) != self._archive:
            self._archive = (sid, instance, capture)
            self._lines, self._seen = self._matching(sid, instance, capture), 0
        try:
            found: tuple[int, str] | None = None
            while self._seen <= nth:
                found = next(self._lines, None)
                if found is None:
                    return None
                self._seen += 1
        except ArchiverError as exc:  # unreadable now: the hit is shown without its line number
            log.warning("browse search: numbering the lines of %r: %s", sid, exc)
            self._lines = iter(())
            return None
        return found[0] if found is not None and found[1] == text else None


class SearchRun:
    """One search on its own thread; ``batches()`` yields the page's hits as they come, then ``summary`` is final."""

    def __init__(
        self,
        store: ObjectStore,
        query: SearchQuery,
        *,
        now: float,
        workers: int = SEARCH_WORKERS,
        budget: SearchBudget = DEFAULT_BUDGET,
    ):
        self.query = query
        self._budget = budget
        self.summary = SearchSummary(start=query.start)
        self._store = store
        self._now = now
        self._workers = workers
        self._events: queue.Queue[tuple[str, Any]] = queue.Queue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="browse-search", daemon=True)

    def _run(self) -> None:
        q, f = self.query, self.query.filters
        lower_priority(SEARCH_NICE)  # the request threads first, whatever the search costs
        try:
            entries = list_sessions(
                self._store, since=f.since, until=f.until, image=f.image, location=f.location, labels=f.labels,
                now=self._now, player=f.player, warn=log.warning,
            )  # fmt: skip
            entries = f.with_session(entries)
            last = max(self._now, f.since) if f.until is None else f.until
            selection = grepfilter.select(self._store, entries, q.pattern, fixed=q.fixed, since=f.since, until=last)
            entries, self.summary.note = selection.entries, selection.note
            self.summary.sessions = len(entries)
            sink = _HitSink(self._events, self._stop, q.start, q.start + q.limit + 1)

            def searched(n: int) -> None:
                self.summary.searched += n
                sink.check()  # between sessions too: a search finding nothing stops when its reader leaves

            report = grep_sessions(
                self._store, entries, q.matcher(), cast(TextIO, sink), fmt="json", workers=self._workers,
                progress=searched, warn=lambda problem: self._events.put(("problem", problem)),
                budget=self._budget, cancel=self._stop, nice=SEARCH_NICE,
            )  # fmt: skip
            self._events.put(("done", report))
        except BrokenPipeError:
            self._events.put(("done", None))  # the page's limit, or its reader left
        except ArchiverError as exc:
            self._events.put(("failed", str(exc)))
        except Exception:  # the request edge of a thread: one bad search must not vanish silently
            log.exception("browse search for %r failed", q.pattern)
            self._events.put(("failed", "internal error (see the browser's log)"))

    def batches(self) -> Generator[list[ShownHit], None, None]:
        """Lists of hits as they arrive (an empty one after ``HEARTBEAT`` s without any); closing stops the search."""
        # Its own bytes, the search's deadline (both start now) and the search's stop.
        numberer = _Numberer(self._store, self.query.matcher(), SearchMeter(self._budget, cancel=self._stop))
        self._thread.start()
        try:
            while True:
                try:
                    events = [self._events.get(timeout=HEARTBEAT)]
                except queue.Empty:
                    yield []
                    continue
                while True:
                    try:
                        events.append(self._events.get_nowait())
                    except queue.Empty:
                        break
                hits, finished = self._take(events, numberer)
                if hits:
                    yield hits
                if finished:
                    return
        finally:
            self._stop.set()  # the reader left early (or the page is complete): no more hits are wanted

    def _take(self, events: list[tuple[str, Any]], numberer: _Numberer) -> tuple[list[ShownHit], bool]:
        hits: list[ShownHit] = []
        finished = False
        for kind, value in events:
            if kind == "hit":
                doc, nth = value
                if self.summary.shown >= self.query.limit:
                    self.summary.more = True  # the one hit past the page: it is not shown
                    continue
                sid, instance, text, source = doc["session"], doc["instance"], doc["line"], doc.get("source")
                number = numberer.number(sid, instance, logs_index(source), nth, text)
                hits.append(ShownHit(sid, instance, doc["stream"], text, number, source))
                self.summary.shown += 1
            elif kind == "problem":
                self.summary.problems.append(str(value))
            elif kind == "done":
                self.summary.report = value if isinstance(value, GrepReport) else None
                finished = True
            elif kind == "failed":
                self.summary.failed = str(value)
                finished = True
        return hits, finished
