"""The index's one schema: its three tables, their columns in order, and the schema version (pure).

Migration rule: a new column is appended at the end of its table, is nullable, and bumps
``INDEX_SCHEMA_VERSION``; parts written before it lack it, and every reader (``union_by_name``
here, a missing column read as NULL by Athena, Trino, Spark and ClickHouse) tolerates that. A
column is never renamed, retyped or removed: that would be a new table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

#: Written into every part's Parquet key-value metadata (``archiver.index_schema``).
INDEX_SCHEMA_VERSION: Final = 1


@dataclass(frozen=True, slots=True)
class Column:
    """One column: its name, its type in the engine-neutral vocabulary below, and what it holds."""

    name: str
    #: ``text``, ``int``, ``double``, ``text_list`` or ``text_map`` / ``int_map`` (string keys).
    kind: str
    doc: str
    #: Always a value (never NULL) in parts written by this version.
    required: bool = False


@dataclass(frozen=True, slots=True)
class Table:
    """One table of the index: its name, what one row is, its columns in order, and its sort order."""

    name: str
    doc: str
    columns: tuple[Column, ...]
    order_by: tuple[str, ...]

    @property
    def names(self) -> tuple[str, ...]:
        """The column names in order."""
        return tuple(c.name for c in self.columns)


#: The types of the vocabulary as DuckDB spells them (the writer's types).
DUCKDB_TYPES: Final = {
    "text": "VARCHAR",
    "int": "BIGINT",
    "double": "DOUBLE",
    "text_list": "VARCHAR[]",
    "text_map": "MAP(VARCHAR, VARCHAR)",
    "int_map": "MAP(VARCHAR, BIGINT)",
}

_ARCHIVE = (
    Column("session_id", "text", "The session id as the upstream gave it.", required=True),
    Column("instance", "text", "The instance name (creation time, YYYYMMDDTHHMMSS.mmmZ[-rN]); NULL: legacy layout."),
)

SESSIONS: Final = Table(
    "sessions",
    "One row per archive (session id + instance), from its index entry and its manifest.",
    (
        *_ARCHIVE,
        Column("ended_at", "double", "When the end was first seen, epoch seconds (UTC).", required=True),
        Column("archived_at", "double", "When the manifest was written, epoch seconds.", required=True),
        Column("created", "double", "Upstream creation time, epoch seconds (NULL when unknown)."),
        Column("image", "text", "Image name.", required=True),
        Column("tag", "text", "Image tag.", required=True),
        Column("location", "text", "Location (region).", required=True),
        Column("host", "text", "Host the session ran on (from the manifest)."),
        Column("labels", "text_map", "The session's own labels (never labels.env).", required=True),
        Column("players", "text_list", "Player ids (from the manifest)."),
        Column("player_count", "int", "Players reported by the upstream."),
        Column("last_status", "text", "Last status seen before the end."),
        Column("counts", "int_map", "Items per outcome (archived, source_gone, ...).", required=True),
        Column("total_bytes", "int", "Bytes stored for the archive's archived items.", required=True),
        Column("manifest_key", "text", "Key of the manifest (the archive's commit marker).", required=True),
        Column("manifest_sha256", "text", "sha256 of the manifest's stored bytes (NULL: unreadable)."),
        Column("entry_schema_version", "int", "schema_version of the JSON index entry.", required=True),
        Column("entry_key", "text", "The JSON index entry this row compacts, below the store prefix.", required=True),
    ),
    ("ended_at", "session_id", "instance"),
)

PLAYERS: Final = Table(
    "players",
    "One row per player of an archive, sorted by player.",
    (
        Column("player", "text", "Player id.", required=True),
        *_ARCHIVE,
        Column("ended_at", "double", "The archive's end time, epoch seconds.", required=True),
    ),
    ("player", "ended_at", "session_id", "instance"),
)

ITEMS: Final = Table(
    "items",
    "One row per manifest item (logs or artifact) of an archive.",
    (
        *_ARCHIVE,
        Column("ended_at", "double", "The archive's end time, epoch seconds.", required=True),
        Column("kind", "text", "logs or artifact.", required=True),
        Column("path", "text", "Artifact path (NULL for logs)."),
        Column("key", "text", "Object key (NULL when nothing was stored)."),
        Column("size", "int", "Object size in bytes."),
        Column("sha256", "text", "sha256 of the stored object."),
        Column("outcome", "text", "archived, source_gone, too_large, expired, conflict or failed.", required=True),
        Column("capture", "text", "Live capture completeness of a logs item (complete, gap, diverged)."),
        Column("checksum_sha256", "text", "The checksum the store verified on arrival (S3)."),
        Column("error", "text", "Why the item was not archived."),
        Column("tokens_bloom", "text", "A text log's token Bloom filter (base64; archiver grep's pre-filter)."),
    ),
    ("session_id", "instance", "kind", "path"),
)

#: Every table, in the order documents list them.
TABLES: Final = (SESSIONS, PLAYERS, ITEMS)
TABLE_NAMES: Final = tuple(t.name for t in TABLES)


def table(name: str) -> Table:
    """The table called ``name`` (``KeyError`` for any other name)."""
    for t in TABLES:
        if t.name == name:
            return t
    raise KeyError(name)


def duckdb_columns(t: Table) -> dict[str, str]:
    """``{column: DuckDB type}`` in order: the ``columns=`` of a ``read_json`` and a ``CREATE TABLE``."""
    return {c.name: DUCKDB_TYPES[c.kind] for c in t.columns}


def markdown(t: Table) -> str:
    """The table documented as a Markdown table (docs/columnar-index.md's schema section is generated from it)."""
    rows = [f"| `{c.name}` | {DUCKDB_TYPES[c.kind]} | {c.doc} |" for c in t.columns]
    return "\n".join(["| column | type | what |", "| --- | --- | --- |", *rows])
