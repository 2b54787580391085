"""The index's rows of one archive, from its index entry and its manifest (pure, JSON-ready dicts).

A row depends only on the entry's and the manifest's bytes, so the same archive compacted twice
gives the same rows (parts stay deterministic and ``SELECT DISTINCT`` removes repeats).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from archiver.layout.manifest import IndexEntry, Manifest

Row = dict[str, Any]


@dataclass(frozen=True, slots=True)
class ArchiveRows:
    """One archive's rows: its ``sessions`` row, its ``players`` and ``items`` rows."""

    session: Row
    players: list[Row]
    items: list[Row]


def archive_rows(
    entry: IndexEntry,
    entry_key: str,
    manifest: Manifest | None,
    manifest_data: bytes | None,
    blooms: Mapping[str, str] | None = None,
) -> ArchiveRows:
    """The rows of the archive ``entry`` (stored at ``entry_key``, below the prefix) lists.

    ``manifest`` is the archive's parsed manifest (``None`` when it could not be read: the
    manifest-only columns are then NULL and it has no player or item rows). ``blooms``: the token
    filters of its text logs by item key.
    """
    ok = manifest is not None and manifest.session_id == entry.session_id and manifest.instance == entry.instance
    m = manifest if ok else None
    session: Row = {
        "session_id": entry.session_id,
        "instance": entry.instance,
        "ended_at": entry.ended_at,
        "archived_at": entry.archived_at,
        "created": None if m is None else m.created,
        "image": entry.image,
        "tag": entry.tag,
        "location": entry.location,
        "host": None if m is None else m.host,
        "labels": dict(entry.labels),
        "players": None if m is None else list(m.players),
        "player_count": None if m is None else m.player_count,
        "last_status": None if m is None else m.last_status,
        "counts": dict(entry.counts),
        "total_bytes": entry.total_bytes,
        "manifest_key": entry.manifest_key,
        "manifest_sha256": None if m is None or manifest_data is None else hashlib.sha256(manifest_data).hexdigest(),
        "entry_schema_version": entry.schema_version,
        "entry_key": entry_key,
    }
    players: list[Row] = []
    items: list[Row] = []
    if m is not None:
        players = [
            {"player": p, "session_id": entry.session_id, "instance": entry.instance, "ended_at": entry.ended_at}
            for p in dict.fromkeys(m.players)
        ]
        items = [
            {
                "session_id": entry.session_id,
                "instance": entry.instance,
                "ended_at": entry.ended_at,
                "kind": i.kind,
                "path": i.path,
                "key": i.key,
                "size": i.size,
                "sha256": i.sha256,
                "outcome": i.outcome,
                "capture": i.capture,
                "checksum_sha256": i.checksum_sha256,
                "error": i.error,
                "tokens_bloom": (blooms or {}).get(i.key or ""),
            }
            for i in m.items
        ]
    return ArchiveRows(session, players, items)


def entry_from_row(row: Row) -> IndexEntry:
    """The index entry a ``sessions`` row compacts (``ValueError`` when the row is not a valid entry)."""
    return IndexEntry(
        session_id=row["session_id"],
        ended_at=row["ended_at"],
        archived_at=row["archived_at"],
        image=row["image"],
        tag=row["tag"],
        location=row["location"],
        labels=dict(sorted(row["labels"].items())),
        counts=dict(sorted(row["counts"].items())),
        total_bytes=row["total_bytes"],
        manifest_key=row["manifest_key"],
        schema_version=row["entry_schema_version"],
        instance=row["instance"],
    )
