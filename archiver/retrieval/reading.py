"""Reading archived objects back: gunzip with hashing, log format sniffing, and `archiver logs`."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TextIO

from archiver import logshape
from archiver.errors import (
    ArchiveIntegrityError,
    SessionNotArchivedError,
)
from archiver.layout.manifest import (
    Manifest,
    ManifestItem,
)
from archiver.retrieval.pattern import Pattern
from archiver.retrieval.query import (
    SNIFF_BYTES,
    LoadedArchive,
    Warn,
    item_key,
    load_archive,
    stderr_note,
    stderr_warn,
)
from archiver.retrieval.render import escape_line
from archiver.store.base import ObjectStore
from archiver.store.gzipstream import Hashing, gunzip
from archiver.textsafe import printable
from archiver.vocabulary import Outcome


def _sniffed(chunks: Iterable[bytes], content_type: str) -> tuple[str, Iterator[bytes]]:
    """The log shape from the first decompressed bytes, and the chunks again from the start."""
    iterator = iter(chunks)
    head = b""
    for chunk in iterator:
        head += chunk
        if len(head.lstrip()) >= SNIFF_BYTES:
            break

    def replay() -> Iterator[bytes]:
        if head:
            yield head
        yield from iterator

    return logshape.sniff(head, content_type), replay()


def archived_logs(m: Manifest) -> list[ManifestItem]:
    """The manifest's archived logs items, in its order: the logs (the first: read after the end, or
    the live capture when nothing was), then each live capture kept beside them because it differs."""
    return [i for i in m.items if i.kind == "logs" and i.outcome == Outcome.ARCHIVED]


def logs_source(capture: int) -> str:
    """How a hit names archived logs item ``capture`` (its index in `archived_logs`): ``logs`` for the
    logs, ``capture`` for the live capture kept beside them, ``capture-N`` for the Nth when several are."""
    return "logs" if capture == 0 else "capture" if capture == 1 else f"capture-{capture}"


def logs_index(source: str | None) -> int:
    """The index in `archived_logs` that a `logs_source` name stands for (``None``: the only item, 0)."""
    if source is None or source == "logs":
        return 0
    return 1 if source == "capture" else int(source.removeprefix("capture-"))


def logs_item(m: Manifest, *, capture: int = 0) -> ManifestItem:
    """The manifest's archived logs item (the first: the logs read after the end, or the live capture
    when nothing was); with ``capture`` N, the Nth live capture kept beside them (they differ).
    ``SessionNotArchivedError`` saying why when there is none."""
    archived = archived_logs(m)
    if capture:
        if capture < len(archived):
            return archived[capture]
        sid = printable(m.session_id)
        if len(archived) <= 1:
            why = " (its logs are the live capture)" if archived and archived[0].capture is not None else ""
            raise SessionNotArchivedError(f"the archive of session {sid} keeps no live capture beside its logs{why}")
        raise SessionNotArchivedError(
            f"the archive of session {sid} keeps {len(archived) - 1} live captures beside its logs, not {capture}"
        )
    if archived:
        return archived[0]
    items = [i for i in m.items if i.kind == "logs"]
    if not items:
        raise SessionNotArchivedError(f"session {printable(m.session_id)} has no logs in its archive")
    item = items[0]
    why = f": {item.error}" if item.error else ""
    raise SessionNotArchivedError(
        f"the logs of session {printable(m.session_id)} were not archived ({item.outcome}{printable(why)})"
    )


@dataclass(frozen=True, slots=True)
class OpenedLogs:
    """The archived logs of one archive, opened: their shape, the decompressed chunks, the stored bytes' hasher."""

    session_id: str
    item: ManifestItem
    shape: str
    chunks: Iterator[bytes]
    hashing: Hashing

    @property
    def tampered(self) -> bool:
        """Read to the end, and the stored bytes are not the ones the manifest describes."""
        digest = self.hashing.digest.hexdigest()
        return self.hashing.complete and (self.hashing.size != self.item.size or digest != self.item.sha256)

    def check(self) -> None:
        """After the last chunk: the stored bytes must be the manifest's (``ArchiveIntegrityError`` otherwise)."""
        if self.tampered:
            raise ArchiveIntegrityError(
                f"the stored logs of {printable(self.session_id)} do not match the manifest (stored: sha256 "
                f"{self.hashing.digest.hexdigest()}, {self.hashing.size} bytes; manifest: sha256 "
                f"{self.item.sha256}, {self.item.size} bytes): the lines above may have been altered"
            )


def open_logs(store: ObjectStore, loaded: LoadedArchive, *, capture: int = 0) -> OpenedLogs:
    """Start streaming the archived logs of a loaded archive (``SessionNotArchivedError`` when it has
    none); ``capture`` N: the Nth live capture kept beside them (see `logs_item`)."""
    return open_logs_item(store, loaded, logs_item(loaded.manifest, capture=capture))


def open_logs_item(store: ObjectStore, loaded: LoadedArchive, item: ManifestItem) -> OpenedLogs:
    """Start streaming one archived logs item of a loaded archive (one of `archived_logs`)."""
    sid = loaded.manifest.session_id
    key, relative = item_key(store, sid, item, loaded.ref.instance)
    hashing = Hashing(store.iter_bytes(key))
    # The extension is the archiver's own verdict on the upstream shape; sniff still decides.
    hint = "application/x-ndjson" if relative.endswith(".jsonl.gz") else "text/plain"
    shape, chunks = _sniffed(gunzip(hashing, key), hint)
    return OpenedLogs(sid, item, shape, chunks, hashing)


def iter_log_lines(
    store: ObjectStore, sid: str, instance: str | None = None, *, note: Warn = stderr_note, capture: int = 0
) -> tuple[Iterator[logshape.LogLine], OpenedLogs]:
    """Plain lines of the archived logs (newest archive, or ``instance``), streamed; the opened logs to check after."""
    opened = open_logs(store, load_archive(store, sid, instance, note=note), capture=capture)
    return logshape.read_lines(opened.chunks, opened.shape), opened


def print_logs(
    store: ObjectStore,
    sid: str,
    out: TextIO,
    *,
    stream: str | None = None,
    grep: Pattern | None = None,
    escape: bool | None = None,
    warn: Warn = stderr_warn,
    instance: str | None = None,
    note: Warn = stderr_note,
    capture: int = 0,
) -> int:
    """`archiver logs`: the archived log lines as plain text, whatever shape the upstream sent; lines printed.

    Of the newest archive of ``sid``, or the one named ``instance`` (see :func:`load_archive`);
    ``capture`` N: the Nth live capture kept beside the logs read after the end (`logs_item`).

    ``stream`` (``stdout``/``stderr``) keeps the lines of that stream. Where the source does not
    say which stream a line came from (plain-text bodies), such lines are printed anyway and
    ``warn`` says so once: hiding lines from an investigation is worse than showing extra ones.
    ``grep`` keeps lines the pattern matches anywhere (``compile_grep``). Control characters are
    escaped when ``escape`` (default: when ``out`` is a terminal); piped output stays verbatim.

    Streams: decompresses chunk by chunk (only the legacy one-document shape is read whole).
    After the last line the stored bytes are checked against the manifest's sha256;
    a mismatch raises ``ArchiveIntegrityError`` (the lines were printed: say they are suspect).
    ``BrokenPipeError`` from ``out`` propagates untouched for the CLI to end quietly.
    """
    if stream not in (None, logshape.STDOUT, logshape.STDERR):
        raise ValueError(f"stream must be stdout or stderr, got {stream!r}")
    if escape is None:
        escape = _isatty(out)
    lines, opened = iter_log_lines(store, sid, instance, note=note, capture=capture)
    printed = 0
    warned = False
    for line in lines:
        if stream is not None and line.stream != stream:
            if line.stream is not None:
                continue
            if not warned:
                warn(f"these logs do not tell stdout from stderr; printing every line, not only {stream}")
                warned = True
        if grep is not None and not grep.matches(line.text):
            continue
        out.write((escape_line(line.text) if escape else line.text) + "\n")
        printed += 1
    opened.check()
    return printed


def _isatty(out: TextIO) -> bool:
    try:
        return out.isatty()
    except (AttributeError, ValueError):
        return False


# --- get --------------------------------------------------------------------------------------
