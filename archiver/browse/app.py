"""The browser's pages: routing a GET path to the archive reads of ``archiver.retrieve`` and rendering them.

Nothing here writes to the store or trusts what it reads: object keys are re-derived by
``retrieve.item_key``, every string from the archive reaches a page through Jinja2 with
autoescape on (after ``printable``, so control and bidi characters show as escapes), and
downloads stream the stored bytes chunk by chunk under a ``Content-Disposition`` name built only
from safe characters. The HTTP server (``archiver.browse.server``) only moves bytes.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qs, quote, unquote_to_bytes, urlencode, urlsplit

import jinja2

from archiver import __version__, inputs
from archiver.errors import (
    ArchiveIntegrityError,
    InputError,
    ManifestError,
    ObjectNotFoundError,
    SessionNotArchivedError,
    StoreError,
)
from archiver.layout import keys
from archiver.layout.manifest import IndexEntry, Manifest, ManifestItem
from archiver.retrieval import logformat

# The retrieval code this package reads: queries and safe keys, log lines, human sizes.
from archiver.retrieval.query import (
    find_archives,
    item_key,
    list_sessions,
    load_archive,
    parse_label,
    parse_time_range,
)
from archiver.retrieval.reading import open_logs
from archiver.retrieval.render import human_size
from archiver.store.base import ObjectStore
from archiver.textsafe import printable
from archiver.values import MAX_COUNT

#: Sessions on one list page.
PAGE_SIZE = 50
#: Log lines on one log page.
LOG_PAGE_LINES = 500
#: The first list window (one index hour partition); each further window doubles, so a page of
#: recent sessions reads one or two partitions while a rare filter still reaches back quickly.
_FIRST_WINDOW = 3600.0
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
_SAFE_NAME = re.compile(r"[^A-Za-z0-9._-]+")


def _no_note(_message: str) -> None:
    """The page lists every archive of a reused id itself; the CLI's one-line note is not needed."""


@dataclass
class Response:
    """What to send: status, headers, and the body as chunks (``length`` known up front or ``None``)."""

    status: int
    content_type: str
    body: Iterable[bytes]
    length: int | None
    headers: dict[str, str] = field(default_factory=dict)


def _page(status: int, body: bytes, content_type: str = _HTML, headers: Mapping[str, str] | None = None) -> Response:
    extra = dict(_HTML_HEADERS) if content_type == _HTML else {"X-Content-Type-Options": "nosniff"}
    extra.update(headers or {})
    return Response(status, content_type, (body,), len(body), extra)


# --- text and URLs --------------------------------------------------------------------------------


def _text(value: object) -> str:
    """A string from the archive as page text: terminal/bidi controls and lone surrogates escaped."""
    return printable(str(value))


def _log_text(value: str) -> str:
    # Tabs are log layout, not hostile: kept; everything else as `printable`.
    return "\t".join(printable(part) for part in value.split("\t"))


def quote_segment(value: str) -> str:
    """One URL path segment or query value for any id (``/``, ``%``, lone surrogates included)."""
    return quote(value.encode("utf-8", "surrogatepass"), safe="")


def session_path(sid: str, instance: str | None = None, suffix: str = "") -> str:
    """The stable URL of a session's page (``/sessions/{id}``), optionally of one archive.

    The ids ``.`` and ``..`` cannot be a path segment (browsers and clients resolve them, even as
    ``%2E``): those two get the query form ``/session?id=..`` instead, which is served the same.
    """
    if sid.strip(".") == "":
        path = f"/session{suffix}?id={quote_segment(sid)}"
        return f"{path}&instance={quote_segment(instance)}" if instance else path
    path = f"/sessions/{quote_segment(sid)}{suffix}"
    return f"{path}?instance={quote_segment(instance)}" if instance else path


def _when(epoch: float | None) -> str:
    if epoch is None:
        return "-"
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def download_name(sid: str, instance: str | None, relative: str) -> str:
    """A file name for ``Content-Disposition`` from safe characters only: ``{escaped id}[.{instance}]-{name}``."""
    base = keys.escape_session_id(sid) + (f".{instance}" if instance else "")
    name = relative.rsplit("/", 1)[-1]
    return _SAFE_NAME.sub("_", f"{base}-{name}").lstrip(".") or "download"


# --- the list -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ListQuery:
    """The list filters as typed (kept for the form and the next-page link) and as parsed."""

    since_text: str
    until_text: str
    image: str | None
    location: str | None
    label_texts: tuple[str, ...]
    since: float
    until: float | None
    labels: Mapping[str, str]
    #: Keyset cursor: the last entry of the previous page, ``(ended_at, session_id, instance)``.
    before: tuple[float, str, str] | None = None


def parse_list_query(params: Mapping[str, Sequence[str]], now: float) -> ListQuery:
    """The list's query string; ``ValueError`` naming the bad field."""

    def one(name: str) -> str:
        values = params.get(name) or [""]
        return values[-1].strip()

    since_text, until_text = one("since"), one("until")
    since, until = parse_time_range(since_text or None, until_text or None, now)
    label_texts = tuple(v.strip() for v in params.get("label", []) if v.strip())
    labels = dict(parse_label(v) for v in label_texts)
    before: tuple[float, str, str] | None = None
    if one("before"):
        try:
            at = float(one("before"))
        except ValueError:
            raise ValueError(f"before: not a time: {one('before')!r}") from None
        if not math.isfinite(at):
            raise ValueError("before: not a time")
        before_id, before_instance = ((params.get(name) or [""])[-1] for name in ("before_id", "before_instance"))
        before = (
            at,
            inputs.session_id(before_id, "before_id") if before_id else "",
            inputs.instance(before_instance) if before_instance else "",
        )
    return ListQuery(
        since_text, until_text, one("image") or None, one("location") or None, label_texts, since, until, labels, before
    )


def _order(entry: IndexEntry) -> tuple[float, str, str]:
    # The list order: newest end first, then id, then instance (a reused id may end twice at once).
    return (-entry.ended_at, entry.session_id, entry.instance or "")


def page_sessions(store: ObjectStore, query: ListQuery, *, limit: int, now: float) -> tuple[list[IndexEntry], bool]:
    """Up to ``limit`` sessions of the query, newest first, after the cursor; and whether more follow.

    ``retrieve.list_sessions`` over growing windows walking back from the newest end: the first
    page of a busy archive reads only the latest index hour or two, and a filter matching little
    widens quickly. Windows are disjoint, so pages never repeat or skip an entry.
    """
    want = limit + 1
    found: list[IndexEntry] = []
    top = query.until if query.until is not None else max(now, query.since)
    if query.before is not None:
        top = min(top, query.before[0])
    cursor = None if query.before is None else (-query.before[0], query.before[1], query.before[2])
    upper: float | None = query.until if query.before is None else top
    start = max(query.since, math.floor(top / _FIRST_WINDOW) * _FIRST_WINDOW)
    first = True
    width = _FIRST_WINDOW
    while True:
        # With a cursor, the ties at the cursor's time must all be seen to skip the shown ones, so
        # the first window has no limit; later windows hold only older entries.
        batch = list_sessions(
            store,
            since=start,
            until=upper,
            image=query.image,
            location=query.location,
            labels=query.labels,
            limit=None if cursor is not None and first else want - len(found),
            now=now,
        )
        found.extend(e for e in batch if cursor is None or _order(e) > cursor)
        if len(found) >= want or start <= query.since:
            break
        # `until` is inclusive: the largest float below this window's start makes the next window
        # disjoint from it, so a limit is never spent on an entry already taken.
        upper = math.nextafter(start, -math.inf)
        first = False
        width *= 2
        start = max(query.since, start - width)
    found.sort(key=_order)
    return found[:limit], len(found) > limit


# --- the app --------------------------------------------------------------------------------------


class BrowseApp:
    """Routes GET paths to pages over one store; thread-safe (it keeps no per-request state)."""

    def __init__(
        self,
        store: ObjectStore,
        *,
        page_size: int = PAGE_SIZE,
        log_page_lines: int = LOG_PAGE_LINES,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.page_size = page_size
        self.log_page_lines = log_page_lines
        self.clock = clock
        self._env = jinja2.Environment(
            loader=jinja2.PackageLoader("archiver.browse", "templates"),
            # Every value is escaped unless a template says otherwise (none does).
            autoescape=True,
            undefined=jinja2.StrictUndefined,
            trim_blocks=True,
            lstrip_blocks=True,
        )
        self._env.filters["t"] = _text
        self._env.filters["q"] = quote_segment
        self._env.filters["size"] = human_size
        self._env.filters["when"] = _when
        self._env.globals["session_path"] = session_path
        self._env.globals["version"] = __version__

    def _render(self, template: str, status: int = 200, **context: Any) -> Response:
        # "replace": a lone surrogate echoed from a query (a filter field) must not fail the page.
        body = self._env.get_template(template).render(**context).encode("utf-8", "replace")
        return _page(status, body)

    def _error(self, status: int, title: str, message: str) -> Response:
        return self._render("error.html", status, title=title, message=message)

    def handle(self, raw_path: str) -> Response:
        """The response to ``GET raw_path`` (path and query as the client sent them)."""
        parts = urlsplit(raw_path)
        try:
            # surrogatepass: a query value may carry an id with lone surrogates (as JSON allows).
            params = parse_qs(parts.query, keep_blank_values=False, errors="surrogatepass")
        except UnicodeDecodeError:
            return self._error(400, "Bad request", "the query string is not UTF-8")
        try:
            segments = [unquote_to_bytes(s).decode("utf-8", "surrogatepass") for s in parts.path.split("/")[1:]]
        except UnicodeDecodeError:
            return self._error(400, "Bad request", "the path is not UTF-8")
        try:
            return self._route(segments, params)
        except InputError as exc:  # an id, instance or number out of archiver.inputs' bounds
            return self._error(400, "Bad request", str(exc))
        except SessionNotArchivedError as exc:
            return self._error(404, "Not archived", str(exc))
        except (ArchiveIntegrityError, ManifestError) as exc:
            return self._error(502, "Archive problem", str(exc))
        except ObjectNotFoundError as exc:
            return self._error(404, "Object missing", f"a stored object is gone: {exc}")
        except StoreError as exc:
            return self._error(503, "Store unavailable", str(exc))

    def _route(self, segments: list[str], params: Mapping[str, list[str]]) -> Response:
        instance = (params.get("instance") or [""])[-1] or None
        if instance is not None:
            inputs.instance(instance)
        if segments[:1] == ["session"]:
            # The query form of session_path: /session[/logs|/items/N]?id=...
            segments = ["sessions", (params.get("id") or [""])[-1], *segments[1:]]
        if segments[:1] == ["sessions"] and len(segments) > 1 and segments[1]:
            inputs.session_id(segments[1])
        match segments:
            case [""]:
                return _page(302, b"", _TEXT, {"Location": "/sessions"})
            case ["healthz"]:
                return _page(200, b"ok\n", _TEXT)
            case ["sessions"] | ["sessions", ""]:
                return self.sessions(params)
            case ["sessions", sid] if sid:
                return self.session(sid, instance)
            case ["sessions", sid, "logs"] if sid:
                return self.logs(sid, instance, params)
            case ["sessions", sid, "items", number] if sid and number.isdigit():
                return self.download(sid, instance, inputs.count(number, "item number", low=0, high=MAX_COUNT))
        return self._error(404, "Not found", "no such page")

    # --- pages ------------------------------------------------------------------------------------

    def sessions(self, params: Mapping[str, Sequence[str]]) -> Response:
        """The list: the filters of `archiver ls`, newest first, paged by a keyset cursor."""
        now = self.clock()
        try:
            query = parse_list_query(params, now)
        except ValueError as exc:
            return self._render(
                "sessions.html", 400, entries=[], query=None, form=params, error=str(exc), next_url=None
            )
        entries, more = page_sessions(self.store, query, limit=self.page_size, now=now)
        next_url = None
        if more and entries:
            last = entries[-1]
            next_params: list[tuple[str, str]] = [
                (k, v)
                for k, v in (
                    ("since", query.since_text),
                    ("until", query.until_text),
                    ("image", query.image or ""),
                    ("location", query.location or ""),
                )
                if v
            ]
            next_params += [("label", text) for text in query.label_texts]
            next_params += [("before", repr(last.ended_at)), ("before_id", last.session_id)]
            if last.instance:
                next_params.append(("before_instance", last.instance))
            next_url = "/sessions?" + urlencode(
                [(k, v.encode("utf-8", "surrogatepass")) for k, v in next_params], quote_via=quote
            )
        return self._render("sessions.html", entries=entries, query=query, form=params, error=None, next_url=next_url)

    def session(self, sid: str, instance: str | None) -> Response:
        """One archive of a session: the manifest's facts, its items with download links, its other archives."""
        loaded = load_archive(self.store, sid, instance, note=_no_note)
        archives = find_archives(self.store, sid)
        m = loaded.manifest
        return self._render(
            "session.html",
            m=m,
            sid=sid,
            instance=loaded.ref.instance,
            archive_name=loaded.ref.name,
            archives=[r.name for r in archives],
            facts=_facts(m),
            items=list(enumerate(m.items)),
            has_logs=any(i.kind == "logs" and i.outcome == "archived" for i in m.items),
        )

    def logs(self, sid: str, instance: str | None, params: Mapping[str, Sequence[str]]) -> Response:
        """A page of plain log lines (stream filter, case-insensitive search), read as a stream up to that page."""
        stream = (params.get("stream") or [""])[-1]
        if stream not in ("", logformat.STDOUT, logformat.STDERR):
            return self._error(400, "Bad request", "stream must be stdout or stderr")
        search = (params.get("q") or [""])[-1]
        start = inputs.count((params.get("start") or ["0"])[-1], "start", low=0, high=MAX_COUNT)
        loaded = load_archive(self.store, sid, instance, note=_no_note)
        opened = open_logs(self.store, loaded)
        lines = logformat.read_lines(opened.chunks, opened.shape)
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
            shown.append((number, line.stream or "", _log_text(line.text)))
        tampered = opened.tampered
        base = [("stream", stream), ("q", search)]
        if loaded.ref.instance:
            base.append(("instance", loaded.ref.instance))

        def link(offset: int) -> str:
            pairs = [(k, v) for k, v in base if v] + ([("start", str(offset))] if offset else [])
            query = urlencode([(k, v.encode("utf-8", "surrogatepass")) for k, v in pairs], quote_via=quote)
            path = session_path(sid, suffix="/logs")
            return path + ("&" if "?" in path else "?") + query if query else path

        return self._render(
            "logs.html",
            sid=sid,
            instance=loaded.ref.instance,
            archive_name=loaded.ref.name,
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

    def download(self, sid: str, instance: str | None, number: int) -> Response:
        """The stored object of item ``number``, streamed as is (gzip bytes: its sha256 is the manifest's)."""
        loaded = load_archive(self.store, sid, instance, note=_no_note)
        items = loaded.manifest.items
        if number >= len(items) or items[number].outcome != "archived":
            return self._error(404, "Not found", "this item has no stored object")
        item: ManifestItem = items[number]
        key, relative = item_key(self.store, sid, item, loaded.ref.instance)
        info = self.store.head(key)
        if info is None:
            raise ObjectNotFoundError(key)
        name = download_name(sid, loaded.ref.instance, relative)
        headers = {
            "Content-Disposition": f"attachment; filename=\"{name}\"; filename*=UTF-8''{quote(name)}",
            "X-Content-Type-Options": "nosniff",
            "Cache-Control": "private, max-age=3600",
        }
        if item.sha256:
            headers["X-Archive-Sha256"] = item.sha256
        # application/octet-stream whatever the manifest says: a browser must never render stored bytes.
        return Response(200, "application/octet-stream", _stream(self.store, key), info.size, headers)


def _stream(store: ObjectStore, key: str) -> Iterator[bytes]:
    # Opened only when the server starts sending (a HEAD never opens it); closing this generator,
    # as the server does when the client leaves, closes the store's file or HTTP stream.
    chunks = store.iter_bytes(key)
    try:
        yield from chunks
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            close()


def _facts(m: Manifest) -> list[tuple[str, str]]:
    """The rows of `archiver show` (same facts, same order), as text for the page."""
    count = m.player_count if m.player_count is not None else len(m.players)
    players = ", ".join(m.players)
    labels = ", ".join(f"{k}={v}" for k, v in sorted(m.labels.items())) or "-"
    return [
        ("Session", m.session_id),
        *([("Instance", m.instance)] if m.instance is not None else []),
        ("Image", f"{m.image}:{m.tag}"),
        ("Location", m.location),
        ("Host", m.host or "-"),
        ("Created", _when(m.created)),
        ("Last status", m.last_status or "-"),
        ("Players", f"{count}" + (f" ({players})" if players else "")),
        ("Labels", labels),
        ("Last seen active", _when(m.last_seen_active)),
        ("First seen ended", _when(m.first_seen_ended)),
        ("Fetch deadline", _when(m.fetch_deadline)),
        ("Archived at", f"{_when(m.archived_at)} (archiver {m.archiver_version})"),
    ]
