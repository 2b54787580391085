"""The commands of the columnar index: compact (entries into Parquet parts) and sql (queries over it)."""

from __future__ import annotations

import sys
import time
from typing import Any

import click

from archiver.cli.base import _TIME_HELP, friendly_errors, main, resolve, settings_options, store_for
from archiver.config.options import STORE_SCOPES


def _range(since: str | None, until: str | None, now: float) -> tuple[float | None, float]:
    from archiver.retrieval import retrieve

    try:
        start = retrieve.parse_time(since, now) if since else None
        end = retrieve.parse_time(until, now) if until else now
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    if start is not None and start > end:
        raise click.UsageError("--since is after --until")
    return start, end


@main.command("compact")
@click.option("--since", metavar="TIME", help=f"Compact days from TIME on: {_TIME_HELP}. [default: the first entry]")
@click.option("--until", metavar="TIME", help="Up to TIME (same forms). [default: now]")
@click.option("--progress/--no-progress", default=None, help="Progress bar on stderr. [default: when a terminal]")
@settings_options(STORE_SCOPES)
@friendly_errors
def compact_command(since: str | None, until: str | None, progress: bool | None, **kwargs: Any) -> None:
    """Compact closed hours' and days' index entries into the columnar index; resumable, safe to run again."""
    from archiver.index.compact import compact, earliest_entry
    from archiver.retrieval.query import stderr_warn

    now = time.time()
    start, end = _range(since, until, now)
    store = store_for(resolve(kwargs))
    try:
        first = start if start is not None else earliest_entry(store)
        if first is None:
            click.echo("note: nothing to compact: the store has no index entries", err=True)
            return
        from archiver.index.parts import days

        total = len(days(first, min(end, now)))
        if sys.stderr.isatty() if progress is None else progress:
            with click.progressbar(length=total, label="compacting days", file=sys.stderr) as bar:
                report = compact(store, since=first, until=end, now=now, warn=stderr_warn, progress=bar.update)
        else:
            report = compact(store, since=first, until=end, now=now, warn=stderr_warn)
    finally:
        store.close()
    click.echo(report.line())


@main.command("sql")
@click.argument("query", required=False)
@click.option(
    "--since", metavar="TIME", help=f"Tables hold archives that ended since TIME: {_TIME_HELP}. [default: all]"
)
@click.option("--until", metavar="TIME", help="Up to TIME (same forms). [default: now]")
@click.option(
    "--format", "fmt", type=click.Choice(["table", "csv", "json"]), default="table", show_default=True,
    help="Output: aligned columns, CSV with a header, or one JSON array of objects.",
)  # fmt: skip
@click.option(
    "--ddl", metavar="ENGINE", default=None,
    help="Print the DDL declaring the index's tables for ENGINE (athena, trino, spark, clickhouse, duckdb) instead: "
    "the parts as TABLE_parts, and each table a view over them counting each archive once.",
)  # fmt: skip
@click.option(
    "--index-url",
    "ddl_location",
    metavar="URL",
    default=None,
    help="With --ddl: where the index is (s3://bucket/prefix/index/).",
)
@settings_options(STORE_SCOPES)
@friendly_errors
def sql_command(
    query: str | None, since: str | None, until: str | None, fmt: str, ddl: str | None, ddl_location: str | None,
    **kwargs: Any,
) -> None:  # fmt: skip
    """Run a SQL query (DuckDB dialect) over the index tables sessions, players and items."""
    from archiver.index import ddl as ddl_module
    from archiver.index.compact import earliest_entry
    from archiver.index.sql import render, run_sql
    from archiver.retrieval.query import stderr_warn

    if ddl is not None:
        try:
            click.echo(ddl_module.ddl(ddl, ddl_location or "s3://BUCKET/PREFIX/index/"), nl=False)
        except ValueError as exc:
            raise click.UsageError(str(exc)) from None
        return
    if not query:
        raise click.UsageError("give a QUERY (or --ddl ENGINE)")
    now = time.time()
    start, end = _range(since, until, now)
    store = store_for(resolve(kwargs))
    try:
        first = start if start is not None else earliest_entry(store)
        result = run_sql(store, query, since=now if first is None else first, until=end, now=now, warn=stderr_warn)
    finally:
        store.close()
    render(result, sys.stdout, fmt)
