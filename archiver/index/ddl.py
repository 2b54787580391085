"""DDL declaring the index's tables for other engines, generated from the one schema (pure).

Every dialect reads closed days' parts, ``{location}dt=YYYY-MM-DD/{table}/*.parquet`` (hourly
parts of the current day are for `archiver` itself). Athena uses partition projection (no
crawler, no partition to add); Trino registers one partition per day; Spark and ClickHouse read
the files by a glob; DuckDB reads them with hive partitioning and counts each entry once.
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


def athena(t: Table, location: str) -> str:
    """Athena: an external Parquet table with partition projection on ``dt``."""
    loc = _location(location)
    return (
        f"CREATE EXTERNAL TABLE IF NOT EXISTS {t.name} (\n{_cols(t, _HIVE, '`')}\n)\n"
        "PARTITIONED BY (dt string)\nSTORED AS PARQUET\n"
        f"LOCATION '{loc}'\nTBLPROPERTIES (\n"
        "  'projection.enabled' = 'true',\n  'projection.dt.type' = 'date',\n"
        "  'projection.dt.format' = 'yyyy-MM-dd',\n  'projection.dt.range' = '2020-01-01,NOW',\n"
        "  'projection.dt.interval' = '1',\n  'projection.dt.interval.unit' = 'DAYS',\n"
        f"  'storage.location.template' = '{loc}dt=${{dt}}/{t.name}/',\n"
        f"  'archiver.index_schema' = '{INDEX_SCHEMA_VERSION}'\n);\n"
    )


def trino(t: Table, location: str) -> str:
    """Trino (Hive connector): a table partitioned by ``dt``; each day registered with its directory."""
    loc = _location(location)
    return (
        f"CREATE TABLE IF NOT EXISTS {t.name} (\n{_cols(t, _TRINO)},\n  dt varchar\n)\n"
        f"WITH (format = 'PARQUET', partitioned_by = ARRAY['dt'], external_location = '{loc}');\n"
        f"-- each day: CALL system.register_partition(CURRENT_SCHEMA, '{t.name}', ARRAY['dt'], "
        f"ARRAY['2026-01-01'], '{loc}dt=2026-01-01/{t.name}/');\n"
    )


def spark(t: Table, location: str) -> str:
    """Spark SQL: a view over the closed days' parts by glob."""
    loc = _location(location)
    return (
        f"CREATE OR REPLACE TEMPORARY VIEW {t.name} (\n"
        + ",\n".join(f"  {c.name}" for c in t.columns)
        + f"\n)\nUSING parquet\nOPTIONS (path '{loc}dt=*/{t.name}/*.parquet', mergeSchema 'true');\n"
    )


def _ch_type(c: Column) -> str:
    base = _CLICKHOUSE[c.kind]
    return base if c.required or c.kind.endswith(("_map", "_list")) else f"Nullable({base})"


def clickhouse(t: Table, location: str) -> str:
    """ClickHouse: a view over the ``s3()`` table function with the schema spelled out."""
    loc = _location(location)
    structure = ", ".join(f"{c.name} {_ch_type(c)}" for c in t.columns)
    url = loc.replace("s3://", "https://", 1) if loc.startswith("s3://") else loc
    return (
        f"CREATE VIEW IF NOT EXISTS {t.name} AS\nSELECT * FROM s3(\n  '{url}dt=*/{t.name}/*.parquet',\n"
        f"  'Parquet',\n  '{structure}'\n);\n"
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
