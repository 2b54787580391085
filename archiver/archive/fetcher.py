"""One fetch attempt: an item's body from the upstream (or its live capture) into the spool, and
its result as plain data (`Spooled`, `Finished`, `Retry`) for the fetch stage (`archive.fetch`)
to record. An attempt never touches the state DB.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from archiver.archive.live_logs import LiveLogs, capture_state
from archiver.archive.spool import Spool, SpoolFile
from archiver.archive.state import ExtraItem, ItemRow
from archiver.errors import ApiError, NotFoundError, TooLargeError
from archiver.layout import keys
from archiver.live.segment import SegmentRow, sealed_path
from archiver.logshape import NDJSON, declared, starts_like_json
from archiver.retry import FETCH_ITEM, RetryPolicy
from archiver.upstream.api import SessionHostClient
from archiver.upstream.transport import Download
from archiver.vocabulary import Outcome

fetch_log = logging.getLogger("archiver.fetch")  # the attempt's own lines (the name it had before)

#: How a gzip body begins: an artifact's content type is told by it.
GZIP_MAGIC = b"\x1f\x8b"
#: Content type of every stored log object: the key says what is inside (`.txt.gz` / `.jsonl.gz`).
LOGS_CONTENT_TYPE = "application/gzip"
#: Seconds between looks at a live capture that still follows its stream (it drains within minutes).
LIVE_RECHECK = 2.0
#: Seconds before its deadline at which a logs item no longer waits for a capture that still
#: follows (its loop is stuck, or its checkpoints keep failing): it reads after the end, and
#: archives what the capture holds as a gap if that finds nothing.
LIVE_WAIT_MARGIN = 300.0


def waits_for_capture(item: ItemRow, live: LiveLogs | None, remaining: float) -> bool:
    """A logs item whose live capture still follows its stream waits for it (unclaimed, no attempt
    counted), until `LIVE_WAIT_MARGIN` before its deadline (``remaining`` seconds away)."""
    return (
        live is not None and item.kind == "logs" and remaining > LIVE_WAIT_MARGIN and live.following(item.session_key)
    )


@dataclass(frozen=True, slots=True)
class Spooled:
    """The body is durable in the spool; commit `spooled` with these values."""

    path: Path
    size: int
    sha256: str
    content_type: str
    source: str
    key: str
    #: Bytes received from the upstream (before compression), for archiver_bytes_total{stage="fetch"}.
    received: int
    #: Logs from a live capture: how complete it is (`archiver.live.policy.Finish`); None: read after the end.
    capture: str | None = None
    #: More logs items of the session, spooled too: live captures kept beside these logs.
    extras: tuple[ExtraItem, ...] = ()


@dataclass(frozen=True, slots=True)
class Finished:
    """The item has its final outcome without a stored object (source_gone, too_large, expired)."""

    outcome: Outcome
    error: str
    source: str


@dataclass(frozen=True, slots=True)
class Retry:
    """Nothing usable this time (transient upstream failure, broken stream, spool disk error)."""

    error: str
    source: str
    #: True for a local problem (spool disk): counted as an archiver error, not an upstream one.
    local: bool = False
    #: Seconds to wait before the next attempt, when it is a wait and no failure (a live capture
    #: still following its stream): not logged as a failure.
    wait: float | None = None


FetchResult = Spooled | Finished | Retry


class Fetcher:
    """Fetches items through the upstream client into the spool (one call per attempt, thread-safe)."""

    def __init__(
        self,
        client: SessionHostClient,
        spool: Spool,
        *,
        prefix: str,
        max_artifact_size: int,
        policy: RetryPolicy,
        live: LiveLogs | None = None,
    ) -> None:
        self._client = client
        self._spool = spool
        #: Live captures of the sessions' logs (None: live capture was never on for this state dir).
        self.live = live
        self._prefix = prefix
        self._max_artifact_size = max_artifact_size
        # Downloads retry (and count) as fetch_item whatever policy the pipeline bounds them with.
        self._policy = policy.named(FETCH_ITEM.operation)

    def sync_spool(self) -> None:
        """The spool files fetched so far are durable by name too (`Spool.sync`)."""
        self._spool.sync()

    def fetch(self, item: ItemRow, *, remaining: float) -> FetchResult:
        """One attempt at `item`; `remaining` seconds to its deadline (<= 0: a last try, no retries).

        404 means the upstream no longer has it: `source_gone` inside the window, `expired` after
        (logs with a live capture: the capture, `_fetch_logs`).
        """
        last_chance = remaining <= 0
        policy = (
            self._policy.single_attempt()
            if last_chance
            else self._policy.bounded_by(max_elapsed=min(self._policy.max_elapsed, remaining))
        )
        source = item.source
        try:
            if item.kind == "logs":
                return self._fetch_logs(item, policy, remaining)
            return self._fetch_artifact(item, policy)
        except NotFoundError as exc:
            return Finished(Outcome.EXPIRED if last_chance else Outcome.SOURCE_GONE, str(exc), source)
        except ApiError as exc:
            return Retry(str(exc), source)
        except OSError as exc:
            # The spool disk (ENOSPC, EIO): the upstream still has the data until the deadline.
            return Retry(f"spool: {exc.strerror or exc}", source, local=True)

    def _fetch_artifact(self, item: ItemRow, policy: RetryPolicy) -> FetchResult:
        sid, path = item.session_id, item.path
        source = artifact_source(sid, path)
        limit = self._max_artifact_size
        with self._client.open_artifact(sid, path, policy=policy) as download:
            if download.content_length is not None and download.content_length > limit:
                return Finished(Outcome.TOO_LARGE, f"Content-Length {download.content_length} > limit {limit}", source)
            try:
                # A large artifact with a Content-Length is read past httpx's parser; a chunked one
                # goes through it (`iter_direct`). Logs keep `iter_bytes`: at ~1 MB with a length the
                # saving measured nil, and such a direct read loses the connection.
                spooled = self._spool.write(item.id, download.iter_direct(), compress=False, limit=limit)
            except TooLargeError:
                return Finished(Outcome.TOO_LARGE, f"body larger than {limit} bytes (stopped while streaming)", source)
        # The upstream labels its gzip bodies application/x-tar: the magic bytes decide.
        content_type = "application/gzip" if spooled.head[:2] == GZIP_MAGIC else download.content_type
        return Spooled(
            path=spooled.path,
            size=spooled.size,
            sha256=spooled.sha256,
            content_type=content_type or "application/octet-stream",
            source=source,
            key=keys.artifact_key(self._prefix, sid, path, item.instance or None),
            received=spooled.received,
        )

    def _fetch_logs(self, item: ItemRow, policy: RetryPolicy, remaining: float) -> FetchResult:
        """The logs read after the end, with the session's live capture where it adds something
        (`archive.live_logs`); a capture still following its stream is waited for, until
        `LIVE_WAIT_MARGIN` before the deadline."""
        live = self.live
        if live is None:
            return self._after_end(item, policy)[0]
        if waits_for_capture(item, live, remaining):
            return Retry("its live capture still follows the stream", item.source, wait=LIVE_RECHECK)
        segments = live.segments(item.session_key)
        if not segments:
            return self._after_end(item, policy)[0]
        after: Spooled | None
        try:
            after, content_type = self._after_end(item, policy)
        except NotFoundError:
            after, content_type = None, ""
        # Any other error is retried until the deadline, where the stage takes `capture_instead`.
        if after is not None and after.received == 0:
            self._spool.remove(after.path)  # an empty after-end body is nothing found: the capture is the logs
            after = None
        if after is None:
            return self._from_capture(item, segments)
        kept = live.kept(segments, after.path, content_type)
        return dataclasses.replace(after, extras=tuple(self._extra(item, row) for row in kept))

    def _after_end(self, item: ItemRow, policy: RetryPolicy) -> tuple[Spooled, str]:
        """The logs as the service answers after the end (`/query/log`, else `/logs`), spooled, and
        the content type they came with. NotFoundError when neither has them."""
        sid = item.session_id
        source = logs_source(sid)
        try:
            download: Download | None = self._client.open_query_log(sid, policy=policy)
        except NotFoundError:
            download = None  # /query/log may not exist for this account or session: try /logs
        if download is not None:
            with download:
                if _usable_log_type(download.content_type):
                    spooled = self._spool.write(item.id, download.iter_bytes(), compress=True, limit=None)
                    if spooled.received > 0:
                        return self._logs_result(item, spooled, download.content_type, source), download.content_type
                    self._spool.remove(spooled.path)
                else:
                    fetch_log.info("GET /query/log for %r answered %s; using /logs", sid, download.content_type)
        source = fallback_logs_source(sid)
        with self._client.open_logs(sid, follow=False, policy=policy) as download:
            spooled = self._spool.write(item.id, download.iter_bytes(), compress=True, limit=None)
            return self._logs_result(item, spooled, download.content_type, source), download.content_type

    def _logs_result(self, item: ItemRow, spooled: SpoolFile, content_type: str, source: str) -> Spooled:
        # JSON shapes (NDJSON entries, the legacy `{"line": {...}}` object, or a text/plain label on
        # a JSON body) go to `logs.jsonl.gz`.
        ext = "jsonl" if declared(content_type) == NDJSON or starts_like_json(spooled.head) else "txt"
        return Spooled(
            path=spooled.path,
            size=spooled.size,
            sha256=spooled.sha256,
            content_type=LOGS_CONTENT_TYPE,
            source=source,
            key=keys.logs_key(self._prefix, item.session_id, ext, item.instance or None),
            received=spooled.received,
        )

    def capture_instead(self, item: ItemRow) -> Spooled | None:
        """Logs whose read after the end kept failing until their deadline: the live capture, as if
        that read had found nothing (None: there is none)."""
        segments = self.live.segments(item.session_key) if self.live is not None else []
        return self._from_capture(item, segments) if segments else None

    def _from_capture(self, item: ItemRow, segments: list[SegmentRow]) -> Spooled:
        """The newest capture segment as the item's logs, the others beside it."""
        main = self._capture(item, segments[-1], str(item.id), None)
        return dataclasses.replace(main, extras=tuple(self._extra(item, row) for row in segments[:-1]))

    def _capture(self, item: ItemRow, row: SegmentRow, name: str, segment: int | None) -> Spooled:
        """A live capture segment spooled (gzip, like every log), as the item's logs or (with
        ``segment``) as a logs item of its own."""
        assert self.live is not None
        spooled: SpoolFile | None = None
        if row.sealed is not None:  # the capture's seal is already these very bytes (synced, or by its delay)
            with contextlib.suppress(FileNotFoundError):
                spooled = self._spool.adopt(
                    name, sealed_path(row), size=row.sealed.size, sha256=row.sealed.sha256,
                    received=row.kept.size,
                )  # fmt: skip
        if spooled is None:
            spooled = self._spool.write(name, self.live.read(row), compress=True, limit=None)
        ext = "jsonl" if row.shape == NDJSON else "txt"
        instance = item.instance or None
        key = (
            keys.logs_key(self._prefix, item.session_id, ext, instance)
            if segment is None
            else keys.live_logs_key(self._prefix, item.session_id, ext, segment, instance)
        )
        return Spooled(
            path=spooled.path,
            size=spooled.size,
            sha256=spooled.sha256,
            content_type=LOGS_CONTENT_TYPE,
            source=live_logs_source(item.session_id),
            key=key,
            received=spooled.received,
            capture=capture_state(row),
        )

    def _extra(self, item: ItemRow, row: SegmentRow) -> ExtraItem:
        spooled = self._capture(item, row, f"{item.id}.live-{row.index}", row.index)
        return ExtraItem(
            path=f"live-{row.index}",
            source=spooled.source,
            key=spooled.key,
            spool_path=str(spooled.path),
            size=spooled.size,
            sha256=spooled.sha256,
            content_type=spooled.content_type,
            capture=spooled.capture,
        )


# What an item records as its source (the manifest says it): the request that read it.
def logs_source(session_id: str) -> str:
    return f"GET /query/log?matchKey={quote(session_id, safe='')}"


def fallback_logs_source(session_id: str) -> str:
    return f"GET /logs?id={quote(session_id, safe='')}&follow=false"


def live_logs_source(session_id: str) -> str:
    """The source of logs captured live: the follow stream's request line."""
    return f"GET /logs?id={quote(session_id, safe='')}&follow=true"


def artifact_source(session_id: str, path: str) -> str:
    return f"GET /artifacts?session={quote(session_id, safe='')}&path={quote(path, safe='/')}"


def _usable_log_type(content_type: str) -> bool:
    # A 200 carrying an HTML page is a proxy's or portal's error page, not the session's log.
    return "html" not in content_type.lower()
