"""What retrieval shows on a terminal: escaped text, sizes and times, the `ls` table or JSON, a manifest for `show`."""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, TextIO

from archiver.layout.codec import iso_utc
from archiver.layout.manifest import IndexEntry, Manifest
from archiver.retrieval.query import Warn, load_manifest, stderr_note
from archiver.store.base import ObjectStore
from archiver.textsafe import printable
from archiver.vocabulary import Outcome, Standing, standing, standings


def escape_line(text: str) -> str:
    """A log line for a terminal: control characters escaped, tabs kept (logs use them for layout)."""
    if text.isprintable() or all(ch == "\t" or ch.isprintable() for ch in text):
        return text
    return "\t".join(printable(part) for part in text.split("\t"))


def _width(text: str) -> int:
    """Terminal columns of a (printable) string: wide East Asian characters take two, combining marks none."""
    if text.isascii():
        return len(text)
    return sum(0 if unicodedata.combining(ch) else 2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in text)


def human_size(size: int | None) -> str:
    """``0 B``, ``512 B``, ``1.5 KiB``, ``12.0 MiB``; ``-`` for unknown."""
    if size is None:
        return "-"
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def _when(epoch: float | None, suffix: str = "") -> str:
    if epoch is None:
        return "-"
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%d %H:%M:%S") + suffix


# --- ls ---------------------------------------------------------------------------------------


def _items_cell(entry: IndexEntry) -> str:
    """``archived/total``, then ``!`` and the outcomes that lost evidence or were not kept by policy,
    then how many configured paths were simply not in the container (no ``!``: nothing was lost).
    The decision is `vocabulary.standings`', the browser's list's too: the index entry does not say
    an item's kind, so a source_gone there reads as an absent path (`show` tells lost logs apart)."""
    parts = standings(entry.counts)
    flagged = dict.fromkeys(o for o, kind, _ in parts if kind in (Standing.LOST, Standing.POLICY))
    absent = sum(n for _, kind, n in parts if kind is Standing.ABSENT)
    cell = f"{entry.counts.get(Outcome.ARCHIVED, 0)}/{sum(entry.counts.values())}"
    if flagged:
        cell += f" !{','.join(flagged)}"
    return f"{cell} ({absent} not present)" if absent else cell


def _standing_total(entry: IndexEntry, kind: Standing) -> int:
    return sum(n for _, each, n in standings(entry.counts) if each is kind)


def _labels_cell(labels: Mapping[str, str]) -> str:
    return ",".join(f"{printable(k)}={printable(v)}" for k, v in sorted(labels.items())) or "-"


#: Columns wider than this do not widen the whole table; the long cell is printed in full anyway
#: (a truncated session id could not be pasted into `archiver show`).
_MAX_COLUMN = 48


def render_table(rows: Sequence[Sequence[str]], header: Sequence[str], out: TextIO) -> None:
    """Left-aligned columns separated by two spaces; the last column is never padded."""
    widths = [min(_MAX_COLUMN, max([_width(h)] + [_width(r[i]) for r in rows])) for i, h in enumerate(header)]
    for row in [list(header), *rows]:
        cells = [cell + " " * max(0, widths[i] - _width(cell)) for i, cell in enumerate(row[:-1])]
        out.write("  ".join([*cells, row[-1]]).rstrip() + "\n")


def entry_row(entry: IndexEntry) -> list[str]:
    """One `ls` table row (every cell already safe for a terminal)."""
    return [
        _when(entry.ended_at),
        printable(entry.session_id),
        printable(f"{entry.image}:{entry.tag}"),
        printable(entry.location),
        _items_cell(entry),
        human_size(entry.total_bytes),
        _labels_cell(entry.labels),
    ]


LS_HEADER = ("ENDED (UTC)", "SESSION", "IMAGE:TAG", "LOCATION", "ITEMS", "SIZE", "LABELS")


def entry_json(entry: IndexEntry) -> dict[str, Any]:
    """The stable JSON shape of one listed session (field names are a contract for scripts)."""
    counts = dict(entry.counts)
    return {
        "session_id": entry.session_id,
        "ended_at": entry.ended_at,
        "ended_at_iso": iso_utc(entry.ended_at),
        "archived_at": entry.archived_at,
        "archived_at_iso": iso_utc(entry.archived_at),
        "image": entry.image,
        "tag": entry.tag,
        "location": entry.location,
        "labels": dict(entry.labels),
        "items_archived": counts.get(Outcome.ARCHIVED, 0),
        "items_total": sum(counts.values()),
        # Lost evidence apart from configured paths that were not in the container (`vocabulary.standing`).
        "items_lost": _standing_total(entry, Standing.LOST),
        "items_not_present": _standing_total(entry, Standing.ABSENT),
        "counts": counts,
        "total_bytes": entry.total_bytes,
        "manifest_key": entry.manifest_key,
        "instance": entry.instance,
    }


def write_json(doc: Any, out: TextIO) -> None:
    # ensure_ascii: ids may hold lone surrogates, which no UTF-8 stream can carry; \u escapes can.
    out.write(json.dumps(doc, indent=2, ensure_ascii=True, sort_keys=False) + "\n")


def render_sessions(entries: Sequence[IndexEntry], out: TextIO, *, fmt: str = "table") -> None:
    """`ls` output: an aligned table (``table``) or one JSON array (``json``)."""
    if fmt == "json":
        write_json([entry_json(e) for e in entries], out)
        return
    if fmt != "table":
        raise ValueError(f"unknown format {fmt!r} (table or json)")
    if not entries:
        out.write("no archived sessions match\n")
        return
    render_table([entry_row(e) for e in entries], LS_HEADER, out)


# --- show -------------------------------------------------------------------------------------


#: What an item's outcome means for the evidence (`show`'s "meaning" line; none for a kept item).
_MEANING: Mapping[Standing, str | None] = {
    Standing.KEPT: None,
    Standing.ABSENT: "not present in this container: an optional path, no evidence lost",
    Standing.POLICY: "not kept by policy (larger than --max-artifact-size)",
    Standing.LOST: "evidence lost",
}


def render_manifest(m: Manifest, out: TextIO) -> None:
    """The manifest for people: metadata, when the end was seen, and each item with its outcome."""
    players = ", ".join(printable(p) for p in m.players)
    count = m.player_count if m.player_count is not None else len(m.players)
    rows = [
        ("Session", printable(m.session_id)),
        *([("Instance", m.instance)] if m.instance is not None else []),
        ("Image", printable(f"{m.image}:{m.tag}")),
        ("Location", printable(m.location)),
        ("Host", printable(m.host) or "-"),
        ("Created", _when(m.created, " UTC")),
        ("Last status", printable(m.last_status) or "-"),
        ("Players", f"{count}" + (f" ({players})" if players else "")),
        ("Labels", _labels_cell(m.labels)),
        ("Last seen active", _when(m.last_seen_active, " UTC")),
        ("First seen ended", _when(m.first_seen_ended, " UTC")),
        ("Fetch deadline", _when(m.fetch_deadline, " UTC")),
        ("Archived at", f"{_when(m.archived_at, ' UTC')} (archiver {printable(m.archiver_version)})"),
        *([("Evidence", _labels_cell(m.evidence))] if m.evidence else []),
    ]
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        out.write(f"{name:<{width}}  {value}\n")
    archived = [i for i in m.items if i.outcome == Outcome.ARCHIVED]
    out.write(f"\nItems: {len(archived)} archived of {len(m.items)}, {human_size(m.total_bytes)} stored\n")
    for item in m.items:
        if item.kind == "artifact" and item.path:
            what = printable(item.path)
        else:
            what = "(session logs)" if item.capture is None else f"(session logs, live capture, {item.capture})"
        out.write(f"  {item.kind:<9} {item.outcome:<12} {human_size(item.size):>10}  {what}\n")
        details: list[tuple[str, str | None]] = [
            ("key", item.key),
            ("sha256", item.sha256),
            ("checksum", item.checksum_sha256),
            ("type", item.content_type),
            ("source", item.source),
            ("error", item.error),
            ("meaning", _MEANING[standing(item.outcome, item.kind)]),
        ]
        for label, detail in details:
            if detail:
                out.write(f"  {'':<9} {label:<12} {printable(detail)}\n")


def show_session(
    store: ObjectStore,
    sid: str,
    out: TextIO,
    *,
    fmt: str = "text",
    instance: str | None = None,
    note: Warn = stderr_note,
) -> Manifest:
    """`archiver show`: the readable manifest (``text``) or the stored manifest JSON as is (``json``).

    Of the newest archive of ``sid``, or the one named ``instance`` (see :func:`load_archive`).
    """
    manifest, data = load_manifest(store, sid, instance, note=note)
    if fmt == "json":
        # The stored bytes (canonical ASCII JSON): what `verify` hashes and scripts can trust.
        out.write(data.decode("utf-8", "replace"))
    elif fmt == "text":
        render_manifest(manifest, out)
    else:
        raise ValueError(f"unknown format {fmt!r} (text or json)")
    return manifest


# --- item keys (never trusted from the manifest) ------------------------------------------------
