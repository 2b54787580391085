"""The browser's pages: routing a GET path to the archive reads of ``archiver.retrieve`` and rendering them.

Nothing here writes to the store or trusts what it reads: object keys are re-derived by
``retrieve.item_key``, every string from the archive reaches a page through Jinja2 with
autoescape on (after ``printable``, so control and bidi characters show as escapes); downloads
and proof bundles are the attachments of ``archiver.browse.responses``. Every link is built by
``archiver.browse.urls`` under the browser's mount (its route prefix). A query string that does not
parse is a 400 page naming the field. The HTTP server (``archiver.browse.server``) only moves bytes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any
from urllib.parse import parse_qs, unquote_to_bytes, urlsplit

import jinja2
from prometheus_client import CollectorRegistry

from archiver import __version__, logshape
from archiver.browse import params as p
from archiver.browse import views
from archiver.browse.listing import ListQuery, cursor_of, page_sessions, parse_list_query
from archiver.browse.responses import Response, download_response, proof_response
from archiver.browse.search import DEFAULT_BUDGET, SearchRun, ShownHit, parse_search_query
from archiver.browse.urls import Mount, quote_segment, with_query
from archiver.config import inputs
from archiver.config.values import MAX_COUNT
from archiver.errors import (
    ArchiveIntegrityError,
    InputError,
    LogError,
    ManifestError,
    ObjectNotFoundError,
    SessionNotArchivedError,
    StoreError,
)
from archiver.layout.manifest import IndexEntry
from archiver.metrics.process import register_process_collectors
from archiver.metrics.process import render as render_metrics
from archiver.retrieval.budget import SearchBudget

# The retrieval code this package reads: queries and safe keys, log lines, human sizes.
from archiver.retrieval.query import find_archives, load_archive, quiet
from archiver.retrieval.reading import archived_logs, logs_source, open_logs
from archiver.retrieval.render import human_size
from archiver.store.base import ObjectStore
from archiver.tlog.prove import read_locator

#: Sessions on one list page.
PAGE_SIZE = 50
#: Log lines on one log page.
LOG_PAGE_LINES = 500
#: Highest ``capture`` a log page takes (a capture's key numbers its segment up to 999).
MAX_CAPTURE = 1000
#: Log searches running at once (each holds a thread and a pool of grep workers); more wait their turn.
MAX_SEARCHES = 4
_HTML = "text/html; charset=utf-8"
_TEXT = "text/plain; charset=utf-8"
#: No script, no frames, no foreign origins: even markup that slipped through could do nothing.
_HTML_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; img-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
#: Where a streamed page's parts are cut apart (comments: they cannot come from escaped data).
_HITS_MARK, _STATUS_MARK = "<!--hits-->", "<!--status-->"
#: What a player link on a session page looks back over.
_PLAYER_SINCE = "30d"


def _page(status: int, body: bytes, content_type: str = _HTML, headers: Mapping[str, str] | None = None) -> Response:
    extra = dict(_HTML_HEADERS) if content_type == _HTML else {"X-Content-Type-Options": "nosniff"}
    extra.update(headers or {})
    return Response(status, content_type, (body,), len(body), extra)


class _Slot:
    """A streamed body holding a search slot: closing it (the server always does, sent or not) frees the slot."""

    def __init__(self, chunks: Iterator[bytes], release: Callable[[], None]) -> None:
        self._chunks = chunks
        self._release: Callable[[], None] | None = release

    def __iter__(self) -> Iterator[bytes]:
        return self

    def __next__(self) -> bytes:
        return next(self._chunks)

    def close(self) -> None:
        close = getattr(self._chunks, "close", None)
        if close is not None:
            close()
        release, self._release = self._release, None
        if release is not None:
            release()


def _encode(text: str) -> bytes:
    # "replace": a lone surrogate echoed from a query (a filter field) must not fail the page.
    return text.encode("utf-8", "replace")


class BrowseApp:
    """Routes GET paths to pages over one store; thread-safe (it keeps no per-request state)."""

    def __init__(
        self,
        store: ObjectStore,
        *,
        page_size: int = PAGE_SIZE,
        log_page_lines: int = LOG_PAGE_LINES,
        clock: Callable[[], float] = time.time,
        mount: Mount | None = None,
        max_searches: int = MAX_SEARCHES,
        registry: CollectorRegistry | None = None,
        search_budget: SearchBudget = DEFAULT_BUDGET,
    ) -> None:
        self.store = store
        #: What its /metrics serves: the process_* and python_* families (the browser has no others).
        self.registry = registry or register_process_collectors(CollectorRegistry())
        self.page_size = page_size
        self.log_page_lines = log_page_lines
        self.clock = clock
        self.mount = mount or Mount()
        self._searches = threading.BoundedSemaphore(max_searches)
        self.search_budget = search_budget
        self._env = jinja2.Environment(
            loader=jinja2.PackageLoader("archiver.browse", "templates"),
            # Every value is escaped unless a template says otherwise (none does).
            autoescape=True,
            undefined=jinja2.StrictUndefined,
            trim_blocks=True,
            lstrip_blocks=True,
        )
        self._env.filters["t"] = views.text
        self._env.filters["q"] = quote_segment
        self._env.filters["size"] = human_size
        self._env.filters["when"] = views.when
        self._env.globals["mount"] = self.mount
        self._env.globals["items_summary"] = views.items_summary
        self._env.globals["item_outcome"] = views.item_outcome
        self._env.globals["version"] = __version__

    def _text(self, template: str, **context: Any) -> str:
        return self._env.get_template(template).render(**context)

    def _render(self, template: str, status: int = 200, **context: Any) -> Response:
        return _page(status, _encode(self._text(template, **context)))

    def _error(self, status: int, title: str, message: str) -> Response:
        return self._render("error.html", status, title=title, message=message)

    def _redirect(self, location: str) -> Response:
        return _page(302, b"", _TEXT, {"Location": location})

    def handle(self, raw_path: str, headers: Mapping[str, str] | None = None) -> Response:
        """The response to ``GET raw_path`` (path and query as the client sent them; ``headers``
        the request's, looked up by their lower-case names)."""
        headers = headers or {}
        parts = urlsplit(raw_path)
        path = self.mount.strip(parts.path)
        if path is None:
            # Outside the route prefix: the bare root leads to the list, anything else is not ours.
            if parts.path == "/":
                return self._redirect(self.mount.link("/sessions"))
            return self._error(404, "Not found", f"no such page (the browser is served under {self.mount.route}/)")
        try:
            # surrogatepass: a query value may carry an id with lone surrogates (as JSON allows).
            params = parse_qs(parts.query, keep_blank_values=False, errors="surrogatepass")
        except UnicodeDecodeError:
            return self._error(400, "Bad request", "the query string is not UTF-8")
        try:
            segments = [unquote_to_bytes(s).decode("utf-8", "surrogatepass") for s in path.split("/")[1:]]
        except UnicodeDecodeError:
            return self._error(400, "Bad request", "the path is not UTF-8")
        if any(len(s) > p.MAX_VALUE for s in segments):
            return self._error(400, "Bad request", f"a path segment is too long (at most {p.MAX_VALUE} characters)")
        try:
            return self._route(segments, params, headers)
        except InputError as exc:  # an id or number out of archiver.config.inputs' bounds
            return self._error(400, "Bad request", str(exc))
        except SessionNotArchivedError as exc:
            return self._error(404, "Not archived", str(exc))
        except (ArchiveIntegrityError, ManifestError, LogError) as exc:
            return self._error(502, "Archive problem", str(exc))
        except ObjectNotFoundError as exc:
            return self._error(404, "Object missing", f"a stored object is gone: {exc}")
        except StoreError as exc:
            return self._error(503, "Store unavailable", str(exc))

    def _route(self, segments: list[str], params: Mapping[str, list[str]], headers: Mapping[str, str]) -> Response:
        try:
            instance = p.one(params, "instance") or None
            if segments[:1] == ["session"]:
                # The query form of session_path: /session[/logs|/items/N]?id=...
                segments = ["sessions", p.one(params, "id", strip=False), *segments[1:]]
        except ValueError as exc:
            return self._error(400, "Bad request", str(exc))
        if segments[:1] == ["sessions"] and len(segments) > 1 and segments[1]:
            inputs.session_id(segments[1])  # the CLI's bound: at most 4096 UTF-8 bytes
        match segments:
            case [""]:
                return self._redirect(self.mount.link("/sessions"))
            case ["healthz"] | ["-", "healthy"] | ["-", "ready"]:
                # Ready as soon as it serves: a store outage shows on the pages, it must not take
                # every replica out of the Service exactly when someone looks for evidence.
                return _page(200, b"ok\n", _TEXT)
            case ["metrics"]:
                body, content_type = render_metrics(self.registry, headers.get("accept"))
                return _page(200, body, content_type)
            case ["sessions"] | ["sessions", ""]:
                return self.sessions(params)
            case ["search"] | ["search", ""]:
                return self.search(params)
            case ["sessions", sid] if sid:
                return self.session(sid, instance)
            case ["sessions", sid, "logs"] if sid:
                return self.logs(sid, instance, params)
            case ["sessions", sid, "proof"] if sid:
                return proof_response(self.store, sid, instance)
            case ["sessions", sid, "items", number] if sid and number.isascii() and number.isdigit():
                item_number = inputs.count(number, "item number", low=0, high=MAX_COUNT)
                download = download_response(self.store, sid, instance, item_number, headers)
                if download is None:
                    return self._error(404, "Not found", "this item has no stored object")
                return download
        return self._error(404, "Not found", "no such page")

    # --- pages ------------------------------------------------------------------------------------

    def sessions(self, params: Mapping[str, list[str]]) -> Response:
        """The list: the filters of `archiver ls` (player, session id too), newest first, paged both ways.

        A session id typed in the box that is an archived id opens its page at once; any other text
        lists the ids containing it.
        """
        now = self.clock()
        try:
            query = parse_list_query(params, now)
        except ValueError as exc:
            return self._render("sessions.html", 400, page=None, query=None, form=params, error=str(exc), links={})
        if query.session and query.before is None and query.after is None and find_archives(self.store, query.session):
            return self._redirect(self.mount.session(query.session))
        page = page_sessions(self.store, query, limit=self.page_size, now=now)
        links = self._list_links(query, page.entries, newer=page.newer, older=page.older)
        return self._render("sessions.html", page=page, query=query, form=params, error=None, links=links)

    def _list_links(self, query: ListQuery, entries: list[IndexEntry], *, newer: bool, older: bool) -> dict[str, str]:
        base = query.filter_pairs()
        link = self.mount.link("/sessions")
        links = {}
        if query.before is not None or query.after is not None:
            links["newest"] = with_query(link, base)
        if newer and entries:
            at, sid, instance = cursor_of(entries[0])
            newer_pairs = [("after", repr(at)), ("after_id", sid), ("after_instance", instance)]
            links["newer"] = with_query(link, [*base, *newer_pairs])
        if older and entries:
            at, sid, instance = cursor_of(entries[-1])
            older_pairs = [("before", repr(at)), ("before_id", sid), ("before_instance", instance)]
            links["older"] = with_query(link, [*base, *older_pairs])
        return links

    def session(self, sid: str, instance: str | None) -> Response:
        """One archive of a session: the manifest's facts, its items with download links, its other archives."""
        loaded = load_archive(self.store, sid, instance, note=quiet)
        archives = find_archives(self.store, sid)
        m = loaded.manifest
        archived = archived_logs(m)
        main = archived[0] if archived else None
        logs_link = self.mount.session(sid, loaded.ref.instance, "/logs")
        # The "view" link of each archived logs item: the Nth live capture kept beside the logs has its own.
        views_of = {id(item): _capture_view(logs_link, n) for n, item in enumerate(archived)}
        log_views = {n: views_of[id(item)] for n, item in enumerate(m.items) if id(item) in views_of}
        player_links = [
            (player, with_query(self.mount.link("/sessions"), [("player", player), ("since", _PLAYER_SINCE)]))
            for player in m.players
            if player
        ]
        return self._render(
            "session.html",
            log_views=log_views,
            main_logs=main,
            m=m,
            sid=sid,
            instance=loaded.ref.instance,
            archive_name=loaded.ref.name,
            archives=[r.name for r in archives],
            facts=views.facts(m),
            items=list(enumerate(m.items)),
            player_links=player_links,
            player_since=_PLAYER_SINCE,
            logged=read_locator(self.store, sid, loaded.ref.instance),
        )

    def logs(self, sid: str, instance: str | None, params: Mapping[str, list[str]]) -> Response:
        """A page of plain log lines (stream filter, case-insensitive search), read as a stream up to that page."""
        try:
            stream = p.one(params, "stream", limit=16)
            if stream not in ("", logshape.STDOUT, logshape.STDERR):
                raise ValueError("stream: must be stdout or stderr")
            search = p.one(params, "q", strip=False)
            start = p.number(params, "start", default=0, low=0, high=p.MAX_START)
            # N: the Nth live capture kept beside the logs (`reading.logs_item`); 0 or none: the logs.
            capture = p.number(params, "capture", default=0, low=0, high=MAX_CAPTURE)
        except ValueError as exc:
            return self._error(400, "Bad request", str(exc))
        loaded = load_archive(self.store, sid, instance, note=quiet)
        opened = open_logs(self.store, loaded, capture=capture)
        lines = logshape.read_lines(opened.chunks, opened.shape)
        needle = search.casefold()
        shown: list[tuple[int, str, str]] = []
        matched = 0
        more = False
        unsplit = False
        for number, line in enumerate(lines, 1):
            if stream and line.stream != stream:
                if line.stream is not None:
                    continue
                unsplit = True  # as `archiver logs`: lines of unknown stream are shown, with a note
            if needle and needle not in line.text.casefold():
                continue
            matched += 1
            if matched <= start:
                continue
            if len(shown) >= self.log_page_lines:
                more = True
                break
            shown.append((number, line.stream or "", views.log_text(line.text)))
        if start and not shown:
            what = "matching lines" if stream or search else "lines"
            return self._error(400, "Bad request", f"start: past the end (these logs have {matched} {what})")
        tampered = opened.tampered
        base = [
            ("stream", stream), ("q", search), ("capture", str(capture) if capture else ""),
            ("instance", loaded.ref.instance or ""),
        ]  # fmt: skip

        def link(offset: int) -> str:
            path = self.mount.session(sid, suffix="/logs")
            return with_query(path, [*base, ("start", str(offset) if offset else "")])

        return self._render(
            "logs.html",
            sid=sid,
            instance=loaded.ref.instance,
            archive_name=loaded.ref.name,
            capture=logs_source(capture) if capture else None,
            capture_state=opened.item.capture,
            lines=shown,
            stream=stream,
            search=search,
            start=start,
            unsplit=unsplit,
            tampered=tampered,
            verified=opened.hashing.complete and not tampered,
            next_url=link(start + self.log_page_lines) if more else None,
            prev_url=link(max(0, start - self.log_page_lines)) if start > 0 else None,
        )

    def search(self, params: Mapping[str, list[str]]) -> Response:
        """Search the logs of the sessions of a time range (`archiver grep`), streamed: "searching…", hits, a status."""
        now = self.clock()
        try:
            query = parse_search_query(params, now)
        except ValueError as exc:
            return self._render("search.html", 400, query=None, form=params, error=str(exc))
        if query is None:
            return self._render("search.html", query=None, form=params, error=None)
        if not self._searches.acquire(blocking=False):
            busy = self._error(503, "Busy", "other log searches are running; try again in a moment")
            busy.headers["Retry-After"] = "10"
            return busy
        page = self._text("search.html", query=query, form=params, error=None)
        head, rest = page.split(_HITS_MARK, 1)
        middle, tail = rest.split(_STATUS_MARK, 1)
        run = SearchRun(self.store, query, now=now, budget=self.search_budget)
        parts: Any = self._env.get_template("search_parts.html").module

        def body() -> Iterator[bytes]:
            yield _encode(head)
            last: tuple[str, str | None] | None = None
            batches = run.batches()
            try:
                for hits in batches:
                    if not hits:
                        yield b"<!-- searching -->\n"  # keeps proxies waiting; a reader gone is noticed
                        continue
                    shown = []
                    for hit in hits:
                        archive = (hit.session_id, hit.instance)
                        shown.append(self._hit_row(hit, first=archive != last))
                        last = archive
                    yield _encode(str(parts.rows(shown)))
            finally:
                batches.close()  # stops the search when the reader left
            summary = run.summary
            links = {}
            if summary.start > 0:
                links["prev"] = with_query(
                    self.mount.link("/search"), query.page_pairs(max(0, summary.start - query.limit))
                )
            if summary.more:
                links["next"] = with_query(self.mount.link("/search"), query.page_pairs(summary.start + query.limit))
            yield _encode(middle + str(parts.status(summary, query, links)) + tail)

        return Response(200, _HTML, _Slot(body(), self._searches.release), None, dict(_HTML_HEADERS))

    def _hit_row(self, hit: ShownHit, *, first: bool) -> dict[str, Any]:
        """A row of the results: the session link on its first hit, the link to the line on its log page."""
        logs = _capture_view(self.mount.session(hit.session_id, hit.archive, "/logs"), hit.capture)
        line_url = logs
        if hit.number is not None:
            start = (hit.number - 1) // self.log_page_lines * self.log_page_lines
            line_url = with_query(logs, [("start", str(start) if start else "")]) + f"#L{hit.number}"
        return {
            "hit": hit,
            "text": views.log_text(hit.text),
            "session_url": self.mount.session(hit.session_id, hit.archive) if first else None,
            "line_url": line_url,
        }


def _capture_view(logs_link: str, capture: int) -> str:
    """The log view of an archive's logs item ``capture`` (0: the logs; N: the Nth live capture kept beside them)."""
    return with_query(logs_link, [("capture", str(capture) if capture else "")])
