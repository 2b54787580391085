"""The entry points of `archiver ls/show/logs/get/verify/grep/index-players`, gathered for ``archiver.cli``.

The work lives in the rooms beside this one: ``query`` (filters, the index, manifests, item keys),
``render`` (what reaches a terminal), ``reading`` (gunzip, hashing, `logs`), ``download`` (`get`),
``verify``, ``grep`` and ``reindex`` (`index-players`). Everything reads the store only through
the ObjectStore protocol and never trusts what it reads: keys named in a manifest are re-derived
from the session id (so a tampered manifest cannot point a download anywhere), every downloaded
byte is hashed against the manifest, and every string that reaches a terminal (ids, labels, log
lines on a tty) has its control characters escaped. Functions take the store and explicit
parameters, write to the stream they are given and return data or counts.
"""

from __future__ import annotations

from archiver.retrieval.budget import SearchBudget
from archiver.retrieval.download import DownloadResult, download_session, download_size, render_download
from archiver.retrieval.grep import GrepReport, Matcher, grep_sessions
from archiver.retrieval.proof import Problem
from archiver.retrieval.query import (
    DEFAULT_SINCE,
    DEFAULT_WORKERS,
    LEGACY,
    ArchiveRef,
    LoadedArchive,
    compile_grep,
    find_archives,
    list_sessions,
    load_archive,
    parse_label,
    parse_time,
    parse_time_range,
)
from archiver.retrieval.reading import print_logs
from archiver.retrieval.reindex import ReindexReport, index_players
from archiver.retrieval.render import human_size, render_sessions, show_session
from archiver.retrieval.verify import VerifyReport, render_verify, verify, verify_failed
from archiver.textsafe import printable

__all__ = [
    "DEFAULT_SINCE",
    "DEFAULT_WORKERS",
    "LEGACY",
    "ArchiveRef",
    "DownloadResult",
    "GrepReport",
    "LoadedArchive",
    "Matcher",
    "Problem",
    "ReindexReport",
    "SearchBudget",
    "VerifyReport",
    "compile_grep",
    "download_session",
    "download_size",
    "find_archives",
    "grep_sessions",
    "human_size",
    "index_players",
    "list_sessions",
    "load_archive",
    "parse_label",
    "parse_time",
    "parse_time_range",
    "print_logs",
    "printable",
    "render_download",
    "render_sessions",
    "render_verify",
    "show_session",
    "verify",
    "verify_failed",
]
