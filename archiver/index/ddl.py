"""DDL declaring the index's tables for other engines, generated from the one schema (pure).

Every dialect reads closed days' parts, ``{location}dt=YYYY-MM-DD/{table}/*.parquet`` (hourly
parts of the current day are for `archiver` itself). Athena uses partition projection (no
crawler, no partition to add); Trino registers one partition per day; Spark and ClickHouse read
the files by a glob. Two replicas racing on different late entries may write overlapping
``late`` parts, so each engine gets the parts as ``{table}_parts`` and, under the table's own
name, a view counting each archive once: the first row of each ``entry_key`` in ``sessions``
(``row_number()``; ClickHouse ``LIMIT 1 BY``), distinct rows in ``players`` and ``items`` (a
function of the archive's entry, so a repeat is a whole-row repeat). DuckDB reads the files in
one view that does the same.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from archiver.index.schema import DUCKDB_TYPES, INDEX_SCHEMA_VERSION, TABLES, Column, Table

ENGINES: Final = ("athena", "trino", "spark", "clickhouse", "duckdb")

_HIVE = {
    "text": "string",
    "int": "bigint",
    "double": "double",
    "text_list": "array<string>",
    "text_map": "map<string,string>",
    "int_map": "map<string,bigint>",
}
_TRINO = {
    "text": "varchar",
    "int": "bigint",
    "double": "double",
    "text_list": "array(varchar)",
    "text_map": "map(varchar, varchar)",
    "int_map": "map(varchar, bigint)",
}
_CLICKHOUSE = {
    "text": "String",
    "int": "Int64",
    "double": "Float64",
    "text_list": "Array(String)",
    "text_map": "Map(String, String)",
    "int_map": "Map(String, Int64)",
}


def _cols(t: Table, types: dict[str, str], quote: str = "") -> str:
    return ",\n".join(f"  {quote}{c.name}{quote} {types[c.kind]}" for c in t.columns)


def _location(location: str) -> str:
    return location if location.endswith("/") else location + "/"


#: The view's row number of an archive's copies (1: the one counted).
COPY = "archive_copy"


def raw_name(t: Table) -> str:
    """The name of the table (or view) declaring ``t``'s parts as they are, repeats included."""
    return f"{t.name}_parts"


def once(t: Table, *, partition: bool = True, clickhouse: bool = False) -> str:
    """A view named ``t.name`` over ``raw_name(t)`` that counts each archive once (see the module)."""
    cols = ", ".join([*t.names, *(["dt"] if partition else [])])
    source = raw_name(t)
    if t.name != "sessions":
        body = f"SELECT DISTINCT {cols}\nFROM {source}"
    elif clickhouse:
        body = f"SELECT {cols}\nFROM {source}\nORDER BY entry_key, archived_at\nLIMIT 1 BY entry_key"
    else:
        body = (
            f"SELECT {cols}\nFROM (\n  SELECT *, row_number() OVER (PARTITION BY entry_key ORDER BY archived_at) "
            f"AS {COPY}\n  FROM {source}\n) AS copies\nWHERE {COPY} = 1"
        )
    verb = "CREATE VIEW IF NOT EXISTS" if clickhouse else "CREATE OR REPLACE VIEW"
    return f"{verb} {t.name} AS\n{body};\n"


def athena(t: Table, location: str) -> str:
    """Athena: an external Parquet table with partition projection on ``dt``, and its view."""
    loc = _location(location)
    return (
        f"CREATE EXTERNAL TABLE IF NOT EXISTS {raw_name(t)} (\n{_cols(t, _HIVE, '`')}\n)\n"
        "PARTITIONED BY (dt string)\nSTORED AS PARQUET\n"
        f"LOCATION '{loc}'\nTBLPROPERTIES (\n"
        "  'projection.enabled' = 'true',\n  'projection.dt.type' = 'date',\n"
        "  'projection.dt.format' = 'yyyy-MM-dd',\n  'projection.dt.range' = '2020-01-01,NOW',\n"
        "  'projection.dt.interval' = '1',\n  'projection.dt.interval.unit' = 'DAYS',\n"
        f"  'storage.location.template' = '{loc}dt=${{dt}}/{t.name}/',\n"
        f"  'archiver.index_schema' = '{INDEX_SCHEMA_VERSION}'\n);\n" + once(t)
    )


def trino(t: Table, location: str) -> str:
    """Trino (Hive connector): a table partitioned by ``dt``, each day registered with its directory; its view."""
    loc = _location(location)
    return (
        f"CREATE TABLE IF NOT EXISTS {raw_name(t)} (\n{_cols(t, _TRINO)},\n  dt varchar\n)\n"
        f"WITH (format = 'PARQUET', partitioned_by = ARRAY['dt'], external_location = '{loc}');\n"
        f"-- each day: CALL system.register_partition(CURRENT_SCHEMA, '{raw_name(t)}', ARRAY['dt'], "
        f"ARRAY['2026-01-01'], '{loc}dt=2026-01-01/{t.name}/');\n" + once(t)
    )


def spark(t: Table, location: str) -> str:
    """Spark SQL: a view over the closed days' parts by glob, and its view."""
    loc = _location(location)
    return (
        f"CREATE OR REPLACE TEMPORARY VIEW {raw_name(t)} (\n"
        + ",\n".join(f"  {c.name}" for c in t.columns)
        + f"\n)\nUSING parquet\nOPTIONS (path '{loc}dt=*/{t.name}/*.parquet', mergeSchema 'true');\n"
        + once(t, partition=False).replace("CREATE OR REPLACE VIEW", "CREATE OR REPLACE TEMPORARY VIEW")
    )


def _ch_type(c: Column) -> str:
    base = _CLICKHOUSE[c.kind]
    return base if c.required or c.kind.endswith(("_map", "_list")) else f"Nullable({base})"


def clickhouse_url(location: str) -> str:
    """The URL ClickHouse's ``s3()`` reads ``location`` at: ``s3://B/P`` as the virtual-hosted AWS URL
    ``https://B.s3.amazonaws.com/P`` (every ClickHouse release takes it; ``https://B/P`` would make
    the bucket a host); an ``http(s)://`` endpoint URL (another region, an S3-compatible store) as is."""
    if not location.startswith("s3://"):
        return location
    bucket, _, key = location.removeprefix("s3://").partition("/")
    return f"https://{bucket}.s3.amazonaws.com/{key}"


def clickhouse(t: Table, location: str) -> str:
    """ClickHouse: a view over the ``s3()`` table function with the schema spelled out, and its view."""
    loc = _location(location)
    structure = ", ".join(f"{c.name} {_ch_type(c)}" for c in t.columns)
    url = clickhouse_url(loc)
    return (
        f"CREATE VIEW IF NOT EXISTS {raw_name(t)} AS\nSELECT * FROM s3(\n  '{url}dt=*/{t.name}/*.parquet',\n"
        f"  'Parquet',\n  '{structure}'\n);\n" + once(t, partition=False, clickhouse=True)
    )


def duckdb(t: Table, location: str) -> str:
    """DuckDB: a view reading the parts with hive partitioning; each JSON entry once."""
    loc = _location(location)
    cols = ", ".join(f"{c.name}::{DUCKDB_TYPES[c.kind]} AS {c.name}" for c in t.columns)
    source = f"read_parquet('{loc}dt=*/{t.name}/*.parquet', hive_partitioning = true, union_by_name = true)"
    dedupe = (
        "QUALIFY row_number() OVER (PARTITION BY entry_key ORDER BY archived_at) = 1" if t.name == "sessions" else ""
    )
    distinct = "" if t.name == "sessions" else "DISTINCT "
    return f"CREATE OR REPLACE VIEW {t.name} AS\nSELECT {distinct}{cols}, dt\nFROM {source}\n{dedupe}".rstrip() + ";\n"


_DIALECTS: Final[dict[str, Callable[[Table, str], str]]] = {
    "athena": athena,
    "trino": trino,
    "spark": spark,
    "clickhouse": clickhouse,
    "duckdb": duckdb,
}


def ddl(engine: str, location: str) -> str:
    """The DDL of every table for ``engine`` (one of ``ENGINES``); ``ValueError`` for another engine."""
    make = _DIALECTS.get(engine.lower())
    if make is None:
        raise ValueError(f"--ddl: unknown engine {engine!r}; one of {', '.join(ENGINES)}")
    header = f"-- session-archiver index, schema version {INDEX_SCHEMA_VERSION}, generated by `archiver sql --ddl`\n"
    return header + "\n".join(make(t, location) for t in TABLES)
