"""The embedded engine (DuckDB): Parquet parts written from rows, read back with SQL, and the
local copies of an S3 store's parts it reads (no extension is ever downloaded)."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import duckdb

from archiver.errors import StoreError
from archiver.index.rows import Row
from archiver.index.schema import INDEX_SCHEMA_VERSION, TABLES, Table, duckdb_columns
from archiver.store.base import ObjectStore
from archiver.store.file import FileStore

#: Parquet compression of every part (zstd: the smallest at a cost the compaction budget allows).
COMPRESSION = "zstd"
#: DuckDB's memory limit when writing parts (compaction stays within its RSS budget).
WRITER_MEMORY = "64MB"
#: Parquet key-value metadata naming the schema version a part was written with.
SCHEMA_KEY = "archiver.index_schema"


def connect() -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB that never installs or loads an extension at run time (offline)."""
    return duckdb.connect(
        ":memory:",
        config={
            "autoinstall_known_extensions": False,
            "autoload_known_extensions": False,
            "preserve_insertion_order": True,
        },
    )


def sql_list(paths: Sequence[Path]) -> str:
    """A DuckDB list literal of file paths (quotes doubled)."""
    return "[" + ", ".join("'" + str(p).replace("'", "''") + "'" for p in paths) + "]"


def _sort_columns(t: Table) -> list[str]:
    scalar = [c.name for c in t.columns if not c.kind.endswith(("_map", "_list")) and c.name not in t.order_by]
    return [*t.order_by, *scalar]


class Staging:
    """Rows of a part on their way to it: one JSON-lines file per table, written as rows come (memory
    stays flat in the number of archives)."""

    def __init__(self, work: Path) -> None:
        self._paths = {t.name: work / f"{t.name}.jsonl" for t in TABLES}
        self._files = {name: path.open("w", encoding="utf-8") for name, path in self._paths.items()}
        self._counts = dict.fromkeys(self._paths, 0)

    def add(self, table: str, rows: Sequence[Row]) -> None:
        """Stage ``rows`` of ``table``."""
        fh = self._files[table]
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False, allow_nan=False) + "\n")
        self._counts[table] += len(rows)

    def close(self) -> dict[str, Path | None]:
        """The staged file of each table (``None`` when it has no row)."""
        for fh in self._files.values():
            fh.close()
        return {name: path if self._counts[name] else None for name, path in self._paths.items()}


def write_table(con: duckdb.DuckDBPyConnection, t: Table, staged: Path | None, bases: Sequence[Path], out: Path) -> int:
    """Write the staged rows plus every row of the parts ``bases`` to the Parquet file ``out``, repeats
    removed, sorted by the table's order (deterministic bytes for the same rows); how many rows."""
    columns = duckdb_columns(t)
    names = ", ".join(f'"{n}"' for n in columns)
    sources = []
    if staged is not None:
        spec = "{" + ", ".join(f"'{n}': '{ty}'" for n, ty in columns.items()) + "}"
        sources.append(
            f"SELECT {names} FROM read_json({sql_list([staged])}, format='newline_delimited', columns={spec})"
        )
    if bases:
        sources.append(f"SELECT {names} FROM read_parquet({sql_list(bases)}, union_by_name=true)")
    if not sources:
        empty = ", ".join(f'NULL::{ty} AS "{n}"' for n, ty in columns.items())
        sources.append(f"SELECT {empty} WHERE false")
    order = ", ".join(f'"{n}" NULLS FIRST' for n in _sort_columns(t))
    query = f"SELECT DISTINCT * FROM ({' UNION ALL '.join(sources)}) ORDER BY {order}"
    meta = f"{{'{SCHEMA_KEY}': '{INDEX_SCHEMA_VERSION}'}}"
    target = "'" + str(out).replace("'", "''") + "'"
    con.execute(
        f"COPY ({query}) TO {target} (FORMAT parquet, COMPRESSION {COMPRESSION}, ROW_GROUP_SIZE 122880, "
        f"KV_METADATA {meta})"
    )
    result = con.execute(f"SELECT count(*) FROM read_parquet({target})").fetchone()
    return int(result[0]) if result else 0


def write_part(
    con: duckdb.DuckDBPyConnection,
    staged: Mapping[str, Path | None],
    bases: Mapping[str, Sequence[Path]],
    work: Path,
) -> dict[str, Path]:
    """Every table's file of one part, under ``work``: ``{table: path}`` (``con`` from :func:`writer`)."""
    out = {}
    for t in TABLES:
        path = work / f"{t.name}.parquet"
        write_table(con, t, staged.get(t.name), bases.get(t.name, ()), path)
        out[t.name] = path
    return out


def writer() -> duckdb.DuckDBPyConnection:
    """A connection for :func:`write_part`: one thread, so one row order and one set of bytes, and a
    memory limit (a sort that needs more spills to a temporary directory)."""
    con = connect()
    con.execute("SET threads = 1")
    con.execute(f"SET memory_limit = '{WRITER_MEMORY}'")
    return con


def default_cache_dir() -> Path:
    """Where parts read from an S3 store are kept: ``$XDG_CACHE_HOME/session-archiver/index``."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "session-archiver" / "index"


class PartFiles:
    """Local files of a store's parts: a directory store's own files, else copies in a cache.

    Parts are create-once and their names are digests of what they cover, so a cached copy never
    goes stale; each copy is checked to be a whole Parquet file before it is used.
    """

    def __init__(self, store: ObjectStore, cache_dir: Path | None = None) -> None:
        self._store = store
        self._direct = store.root if isinstance(store, FileStore) else None
        tag = hashlib.sha256(store.url.encode()).hexdigest()[:16]
        self._cache = (cache_dir or default_cache_dir()) / tag
        self._lock = threading.Lock()

    def path(self, key: str) -> Path:
        """A local path holding the part at ``key`` (downloaded once for an S3 store)."""
        if self._direct is not None:
            return self._direct / key
        local = self._cache / key
        if local.is_file():
            return local
        local.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=local.parent, suffix=".partial")
        try:
            with os.fdopen(fd, "wb") as fh:
                for chunk in self._store.iter_bytes(key):
                    fh.write(chunk)
            os.replace(tmp, local)
        except (OSError, StoreError):
            Path(tmp).unlink(missing_ok=True)
            raise
        return local


def fetch_rows(con: duckdb.DuckDBPyConnection, query: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
    """The rows of a query as dicts."""
    cursor = con.execute(query, list(params))
    names = [d[0] for d in cursor.description or ()]
    return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
