"""What the pages say about archived data: safe text, times, a manifest's facts, and how each outcome reads.

An item outcome is one of four kinds on a page: kept (``archived``); expected (``source_gone`` of
an artifact path: an optional path absent in that container, e.g. no crash folder in a match that
did not crash); not kept by policy (``too_large``); or evidence lost (``expired``, ``failed``,
``conflict``, logs the service no longer had). Only the last is shown as a problem.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from archiver.layout import keys
from archiver.layout.manifest import Manifest, ManifestItem
from archiver.textsafe import printable
from archiver.vocabulary import Outcome, Standing, outcome_words, standing, standings

_SAFE_NAME = re.compile(r"[^A-Za-z0-9._-]+")

#: CSS class per kind of outcome (base.html styles them): kept, expected, not kept by policy, lost.
KEPT, EXPECTED, POLICY, LOST = "ok", "absent", "warn", "bad"


def text(value: object) -> str:
    """A string from the archive as page text: terminal/bidi controls and lone surrogates escaped."""
    return printable(str(value))


def log_text(value: str) -> str:
    """A log line as page text: tabs are log layout, not hostile, so kept; everything else as `printable`."""
    return "\t".join(printable(part) for part in value.split("\t"))


def when(epoch: float | None) -> str:
    if epoch is None:
        return "-"
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def download_name(sid: str, instance: str | None, relative: str) -> str:
    """A file name for ``Content-Disposition`` from safe characters only: ``{escaped id}[.{instance}]-{name}``."""
    base = keys.escape_session_id(sid) + (f".{instance}" if instance else "")
    name = relative.rsplit("/", 1)[-1]
    return _SAFE_NAME.sub("_", f"{base}-{name}").lstrip(".") or "download"


#: How each standing (`vocabulary.standing`, the decision `ls` and `show` share) is styled.
_CSS = {Standing.KEPT: KEPT, Standing.ABSENT: EXPECTED, Standing.POLICY: POLICY, Standing.LOST: LOST}


def _kind(outcome: str, item_kind: str | None) -> str:
    return _CSS[standing(outcome, item_kind)]


@dataclass(frozen=True, slots=True)
class OutcomeView:
    """An outcome as a page shows it: its CSS class and its words."""

    css: str
    words: str


def item_outcome(item: ManifestItem) -> OutcomeView:
    """How the session page shows one item's outcome (with the archiver's error, if any)."""
    css = _kind(item.outcome, item.kind)
    words = outcome_words(item.outcome, item.kind)
    if item.error and css != KEPT:
        words += f": {item.error}"
    return OutcomeView(css, words)


@dataclass(frozen=True, slots=True)
class ItemsView:
    """The list's Items cell: ``archived/total``, its class (the worst kind present), and a note per outcome."""

    archived: int
    total: int
    css: str
    notes: tuple[OutcomeView, ...]


def items_summary(counts: Mapping[str, int]) -> ItemsView:
    """The Items cell of an index entry: lost evidence is red, an absent optional path only a grey
    note (`vocabulary.standings`, as `ls` reads them)."""
    notes = []
    worst = KEPT
    for outcome, kind, n in standings(counts):
        if kind is Standing.KEPT:
            continue
        css = _CSS[kind]
        notes.append(OutcomeView(css, f"{n} {({EXPECTED: 'not present', POLICY: 'too large'}).get(css, outcome)}"))
        worst = max(worst, css, key=[KEPT, EXPECTED, POLICY, LOST].index)
    return ItemsView(counts.get(Outcome.ARCHIVED, 0), sum(counts.values()), worst, tuple(notes))


def facts(m: Manifest) -> list[tuple[str, str]]:
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
        ("Created", when(m.created)),
        ("Last status", m.last_status or "-"),
        ("Players", f"{count}" + (f" ({players})" if players else "")),
        ("Labels", labels),
        ("Last seen active", when(m.last_seen_active)),
        ("First seen ended", when(m.first_seen_ended)),
        ("Fetch deadline", when(m.fetch_deadline)),
        ("Archived at", f"{when(m.archived_at)} (archiver {m.archiver_version})"),
    ]
