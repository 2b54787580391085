"""`archiver sql`: a query over the index's three tables (parts plus the entries no part covers yet),
run by the embedded engine, and its result written as a table, CSV or JSON."""

from __future__ import annotations

import csv
import json
import tempfile
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import duckdb

from archiver.errors import InputError
from archiver.index import reader
from archiver.index.compact import WORKERS, list_entries, read_archive_rows
from archiver.index.engine import PartFiles, connect, sql_list
from archiver.index.schema import TABLES, duckdb_columns
from archiver.store.base import ObjectStore
from archiver.textsafe import one_line, printable

FORMATS = ("table", "csv", "json")


class SqlError(InputError):
    """The query given to `archiver sql` does not parse, bind or run (a user mistake: exit 2)."""


@dataclass(frozen=True, slots=True)
class Result:
    """A query's column names and rows."""

    columns: list[str]
    rows: list[tuple[Any, ...]]


def open_tables(
    store: ObjectStore, since: float, until: float, work: Path, warn: Callable[[str], None], *, now: float
) -> duckdb.DuckDBPyConnection:
    """A connection with the views ``sessions``, ``players`` and ``items`` over ``[since, until]``."""
    plan = reader.plan(store, since, until, now=now)
    files = PartFiles(store)
    staged: dict[str, list[dict[str, Any]]] = {t.name: [] for t in TABLES}
    in_parts = plan.in_parts(files, store.prefix)
    entry_keys = [k for partition, _ in plan.json_hours for k in list_entries(store, partition) if k not in in_parts]
    with ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="sql") as pool:
        for rows in pool.map(lambda k: read_archive_rows(store, k, warn), entry_keys):
            if rows is not None:
                staged["sessions"].append(rows.session)
                staged["players"] += rows.players
                staged["items"] += rows.items
    con = connect()
    for t in TABLES:
        columns = duckdb_columns(t)
        names = ", ".join(f'"{n}"' for n in columns)
        sources = []
        part_files = plan.files(files, t.name)
        if part_files:
            sources.append(f"SELECT {names} FROM read_parquet({sql_list(part_files)}, union_by_name=true)")
        if staged[t.name]:
            path = work / f"{t.name}.jsonl"
            path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in staged[t.name]), "utf-8")
            spec = "{" + ", ".join(f"'{n}': '{ty}'" for n, ty in columns.items()) + "}"
            sources.append(
                f"SELECT {names} FROM read_json({sql_list([path])}, format='newline_delimited', columns={spec})"
            )
        if not sources:
            sources.append("SELECT " + ", ".join(f'NULL::{ty} AS "{n}"' for n, ty in columns.items()) + " WHERE false")
        union = " UNION ALL ".join(sources)
        # Each JSON entry once (replicas' late parts may repeat one); players and items rows are
        # a function of the entry, so repeats are whole-row repeats.
        # ``dt``: the entry's day partition, as engines reading the parts with hive partitioning see it
        # (every table has it there); the UTC day of the end for rows without an entry key.
        dt = (
            "CAST(substr(entry_key, 10, 10) AS DATE)"
            if t.name == "sessions"
            else "DATE '1970-01-01' + CAST(floor(ended_at / 86400) AS INTEGER)"
        )
        union = f"SELECT *, {dt} AS dt FROM ({union})"
        body = (
            f"SELECT * FROM ({union}) QUALIFY row_number() OVER (PARTITION BY entry_key ORDER BY archived_at) = 1"
            if t.name == "sessions"
            else f"SELECT DISTINCT * FROM ({union})"
        )
        con.execute(f"CREATE VIEW {t.name} AS {body}")
    return con


def run_sql(
    store: ObjectStore, query: str, *, since: float, until: float, now: float, warn: Callable[[str], None]
) -> Result:
    """The result of ``query`` over the index tables of ``[since, until]``; ``SqlError`` for a bad query."""
    with tempfile.TemporaryDirectory(prefix="archiver-sql-") as tmp:
        con = open_tables(store, since, until, Path(tmp), warn, now=now)
        try:
            cursor = con.execute(query)
            columns = [d[0] for d in cursor.description or ()]
            return Result(columns, cursor.fetchall())
        except duckdb.Error as exc:
            first = (str(exc).splitlines() or [type(exc).__name__])[0]
            raise SqlError(f"sql: {one_line(first)}") from None
        finally:
            con.close()


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, dict | list):
        return json.dumps(value, ensure_ascii=False, default=str)
    return str(value)


def render(result: Result, out: TextIO, fmt: str) -> None:
    """Write ``result`` as ``table`` (aligned columns), ``csv`` (RFC 4180, header) or ``json`` (one array)."""
    if fmt == "json":
        json.dump(
            [dict(zip(result.columns, r, strict=True)) for r in result.rows], out, default=str, ensure_ascii=False
        )
        out.write("\n")
        return
    cells: Sequence[Sequence[str]] = [[_text(v) for v in r] for r in result.rows]
    if fmt == "csv":
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(result.columns)
        writer.writerows(cells)
        return
    shown = [[printable(c) for c in row] for row in cells]
    widths = [max([len(name), *(len(row[i]) for row in shown)]) for i, name in enumerate(result.columns)]
    out.write("  ".join(n.ljust(w) for n, w in zip(result.columns, widths, strict=True)).rstrip() + "\n")
    for row in shown:
        out.write("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() + "\n")
