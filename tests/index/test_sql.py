"""`archiver sql`, the DDL of every engine and the queries of docs/columnar-index.md: DuckDB runs them over a test
archive, pyarrow (an engine no one here wrote) gives the same answers, the other dialects parse."""

from __future__ import annotations

import re
from pathlib import Path

import duckdb
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pytest
import sqlglot
from sqlglot import exp

from archiver.index.compact import compact
from archiver.index.ddl import COPY, ENGINES, ddl, raw_name
from archiver.index.schema import TABLES, markdown, table
from archiver.layout.manifest import ManifestItem
from archiver.retrieval.query import list_sessions
from archiver.store import open_store
from archiver.store.base import ObjectStore
from tests.support import put_session, run_cli

README = Path(__file__).resolve().parents[2] / "docs" / "columnar-index.md"
INSTANCE = "20261120T000000.000Z"
#: 2026-11-18 12:00 UTC, inside the docs page's "last week" (2026-11-16 .. 2026-11-22).
MID_WEEK = 1795003200.0
NOW = MID_WEEK + 10 * 86400


def _examples() -> dict[tuple[str, str], str]:
    """``{(dialect, question): query}`` of docs/columnar-index.md's ``-- dialect: question`` blocks."""
    found: dict[tuple[str, str], str] = {}
    for block in re.findall(r"```sql\n(.*?)```", README.read_text(encoding="utf-8"), re.S):
        for head, body in re.findall(r"^-- (\w+: \w+)\n(.*?)(?=^-- |\Z)", block, re.S | re.M):
            dialect, question = head.split(": ")
            found[(dialect, question)] = body.strip()
    return found


def _seed(store: ObjectStore, sessions: int = 40, until: float = NOW) -> None:
    dump = ManifestItem(
        kind="artifact", source="GET /artifacts?path=/srv/crash", outcome="archived", path="/srv/crash/core.42",
        key="x", size=60_000_000, sha256="0" * 64, content_type="application/gzip",
    )  # fmt: skip
    small = ManifestItem(
        kind="artifact", source="GET /artifacts?path=/srv/crash", outcome="archived", path="/srv/crash/core.1",
        key="y", size=1_000, sha256="1" * 64, content_type="application/gzip",
    )  # fmt: skip
    for i in range(sessions):
        ended = MID_WEEK + (i - 20) * 7200.0  # 2026-11-16 .. 2026-11-20
        put_session(
            store, f"s{i:02d}", ended_at=ended, instance=INSTANCE,
            tag="1.4.2" if i % 2 else "1.4.1", location="eu-west-1" if i % 3 else "us-east-1",
            last_status="dead" if i % 4 == 1 else "exited",
            labels={"tournament": "cup-7"} if i % 10 == 3 else {"mode": "duel"},
            extra_items=[dump if i % 8 == 5 else small],
            players=(f"p{i % 5}", f"p{(i + 1) % 5}"),
        )  # fmt: skip
    put_session(store, "early", ended_at=MID_WEEK - 4 * 86400, instance=INSTANCE, last_status="dead", tag="1.4.2")
    assert compact(store, since=MID_WEEK - 5 * 86400, until=until, now=NOW, warn=print).entries == sessions + 1


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> ObjectStore:
    """A compacted directory store, shared by the tests that only read it."""
    root = tmp_path_factory.mktemp("index-sql") / "archive"
    root.mkdir()
    store = open_store(root.as_uri())
    _seed(store)
    return store


def _ids(rows: list[tuple[object, ...]]) -> list[str]:
    return sorted(str(r[0]) for r in rows)


def _pyarrow_answers(index: Path) -> dict[str, list[str]]:
    def dataset(name: str) -> ds.Dataset:
        files = sorted(str(p) for p in index.glob(f"dt=*/{name}/*.parquet"))
        return ds.dataset(files, format="parquet", partitioning="hive", partition_base_dir=str(index))

    sessions = dataset("sessions").to_table()
    crashed = sessions.filter(
        (pc.field("image") == "demo-game") & (pc.field("tag") == "1.4.2") & (pc.field("location") == "eu-west-1")
        & (pc.field("last_status") == "dead") & (pc.field("dt") >= "2026-11-16") & (pc.field("dt") <= "2026-11-22")
    )  # fmt: skip
    labels = sessions.column("labels").to_pylist()
    tournament = [
        sid for sid, pairs in zip(sessions.column("session_id").to_pylist(), labels, strict=True)
        if dict(pairs).get("tournament") == "cup-7"
    ]  # fmt: skip
    items = dataset("items").to_table().filter(
        (pc.field("kind") == "artifact") & (pc.field("outcome") == "archived")
        & pc.match_substring(pc.field("path"), "crash") & (pc.field("size") > 50_000_000)
    )  # fmt: skip
    return {
        "crashed": sorted(crashed.column("session_id").to_pylist()),
        "tournament": sorted(tournament),
        "dumps": sorted(items.column("session_id").to_pylist()),
    }


def test_duckdb_ddl_and_the_readme_queries_agree_with_pyarrow(archive: ObjectStore) -> None:
    index = Path(archive.url.removeprefix("file://")) / "index"
    con = duckdb.connect()
    con.execute(ddl("duckdb", str(index)))
    answers = {q: _ids(con.execute(sql).fetchall()) for (d, q), sql in _examples().items() if d == "duckdb"}
    assert set(answers) == {"crashed", "tournament", "dumps"}
    assert answers == _pyarrow_answers(index)
    assert answers["crashed"] == ["s01", "s05", "s13", "s17", "s25", "s29", "s37"]
    assert answers["tournament"] == ["s03", "s13", "s23", "s33"] and answers["dumps"] == [
        "s05",
        "s13",
        "s21",
        "s29",
        "s37",
    ]
    # The docs page's DuckDB queries run in `archiver sql` too, with the same answers.
    for (dialect, question), sql in _examples().items():
        if dialect == "duckdb":
            result = run_cli(archive, ["sql", sql, "--format", "csv"])
            assert result.exit_code == 0, result.output
            assert sorted(line.split(",")[0] for line in result.output.splitlines()[1:]) == answers[question]


def test_sql_tables_have_the_dt_partition_of_the_engines_ddl(archive: ObjectStore) -> None:
    index = Path(archive.url.removeprefix("file://")) / "index"
    con = duckdb.connect()
    con.execute(ddl("duckdb", str(index)))
    for t in TABLES:
        query = f"SELECT dt, count(*) AS n FROM {t.name} GROUP BY dt ORDER BY dt"
        expected = "dt,n\n" + "".join(f"{dt},{n}\n" for dt, n in con.execute(query).fetchall())
        result = run_cli(archive, ["sql", query, "--format", "csv"])
        assert result.exit_code == 0, result.output
        assert result.output == expected and expected.count("\n") > 2, t.name


def test_sql_counts_by_day_in_every_format(archive: ObjectStore) -> None:
    query = "SELECT dt, count(*) AS n FROM sessions WHERE dt >= DATE '2026-11-16' GROUP BY dt ORDER BY dt"
    csv_out = run_cli(archive, ["sql", query, "--format", "csv"]).output
    assert csv_out.splitlines() == [
        "dt,n",
        "2026-11-16,2",
        "2026-11-17,12",
        "2026-11-18,12",
        "2026-11-19,12",
        "2026-11-20,2",
    ]
    json_out = run_cli(archive, ["sql", query, "--format", "json"]).output
    assert json_out.startswith('[{"dt": "2026-11-16", "n": 2}')
    table_out = run_cli(archive, ["sql", query]).output.splitlines()
    assert table_out[0].split() == ["dt", "n"] and table_out[1].split() == ["2026-11-16", "2"]


def _name(statement: exp.Create) -> str:
    return statement.this.name if isinstance(statement.this, exp.Table) else statement.this.this.name


@pytest.mark.parametrize("engine", [e for e in ENGINES if e != "duckdb"])
def test_other_dialects_parse_and_name_only_existing_columns(engine: str) -> None:
    text = ddl(engine, "s3://bucket/prefix/index/")
    statements = [s for s in sqlglot.parse(text, read=engine) if isinstance(s, exp.Create)]
    assert [_name(s) for s in statements] == [n for t in TABLES for n in (raw_name(t), t.name)]
    for t in TABLES:
        raw, view = (next(s for s in statements if _name(s) == n) for n in (raw_name(t), t.name))
        declared = [c.name for c in raw.find_all(exp.ColumnDef)]
        if engine == "clickhouse":  # the s3() structure is a string literal
            structure = next(lit.this for lit in raw.find_all(exp.Literal) if " String" in lit.this)
            declared = [part.split()[0] for part in structure.split(", ") if part.split()[0].isidentifier()]
        if engine == "spark":
            declared = [c.name for c in raw.this.expressions]
        assert [c for c in declared if c != "dt"] == list(t.names)
        # The view users query reads the raw parts and only their columns.
        assert view.kind == "VIEW" and {x.name for x in view.expression.find_all(exp.Table)} == {raw_name(t)}
        assert {c.name for c in view.find_all(exp.Column)} <= set(t.names) | {"dt", COPY}
    queries = {q: sql for (d, q), sql in _examples().items() if d == engine}
    assert set(queries) == {"crashed", "tournament", "dumps"}
    for sql in queries.values():
        parsed = sqlglot.parse_one(sql, read=engine)
        names = set(table(parsed.find(exp.Table).name).names) | {"dt"}  # type: ignore[union-attr]
        assert {c.name for c in parsed.find_all(exp.Column)} <= names


def test_clickhouse_reads_an_s3_location_at_its_bucket_not_at_a_host_named_like_it() -> None:
    text = ddl("clickhouse", "s3://my-evidence/matches/index/")
    assert "'https://my-evidence.s3.amazonaws.com/matches/index/dt=*/sessions/*.parquet'" in text
    endpoint = "https://minio.example.com:9000/my-evidence/matches/index/"
    assert f"'{endpoint}dt=*/items/*.parquet'" in ddl("clickhouse", endpoint)


def test_every_dialects_tables_count_each_archive_once_over_overlapping_late_parts(tmp_path: Path) -> None:
    root = tmp_path / "archive"
    root.mkdir()
    store = open_store(root.as_uri())
    _seed(store, 10)
    index = root / "index"
    con = duckdb.connect()
    con.execute(ddl("duckdb", str(index)))
    before = {t.name: con.execute(f"SELECT count(*) FROM {t.name}").fetchone() for t in TABLES}
    # Two replicas raced on late entries: each day's parts repeated under another late- name.
    for part in sorted(index.glob("dt=*/*/day-*.parquet")):
        (part.parent / part.name.replace("day-", "late-")).write_bytes(part.read_bytes())
    counted = {t.name: con.execute(f"SELECT count(*) FROM {t.name}").fetchone() for t in TABLES}
    assert counted == before and counted["sessions"] == (11,) and counted["players"] == (22,)
    every = con.execute(f"SELECT count(*) FROM read_parquet('{index}/dt=*/sessions/*.parquet')").fetchone()
    assert every == (22,)  # the overlap is there: only the views count once
    # The other dialects' views, translated by sqlglot, over the same parts.
    for engine in ("athena", "trino", "spark"):
        for statement in sqlglot.parse(ddl(engine, "s3://bucket/prefix/index/"), read=engine):
            if isinstance(statement, exp.Create) and statement.kind == "VIEW" and statement.expression is not None:
                name = _name(statement)
                if name in counted:
                    files = f"'{index}/dt=*/{name}/*.parquet'"
                    raw = f"SELECT * FROM read_parquet({files}, hive_partitioning = true, union_by_name = true)"
                    con.execute(f"CREATE OR REPLACE VIEW {name}_parts AS {raw}")
                    query = statement.expression.sql(dialect="duckdb")
                    assert con.execute(f"SELECT count(*) FROM ({query})").fetchone() == counted[name], engine
    clickhouse = ddl("clickhouse", "s3://bucket/prefix/index/")
    assert "FROM sessions_parts\nORDER BY entry_key, archived_at\nLIMIT 1 BY entry_key;" in clickhouse
    assert "SELECT DISTINCT player, session_id, instance, ended_at\nFROM players_parts;" in clickhouse


def test_the_readme_documents_every_table_as_the_schema_declares_it() -> None:
    text = README.read_text(encoding="utf-8")
    for t in TABLES:
        assert markdown(t) in text, (
            f"docs/columnar-index.md's {t.name} table differs: regenerate it from archiver/index/schema.py"
        )


def test_sql_never_downloads_an_extension(archive: ObjectStore) -> None:
    # A query needing httpfs is refused at once (offline), not sent to fetch it from the internet.
    result = run_cli(archive, ["sql", "SELECT * FROM read_parquet('s3://bucket/x.parquet')"])
    assert result.exit_code == 2 and result.output.count("\n") == 1
    assert result.output.startswith("error: sql: ") and "requires the extension httpfs to be loaded" in result.output


def test_unknown_ddl_engine_and_missing_query_are_usage_errors(archive: ObjectStore) -> None:
    result = run_cli(archive, ["sql", "--ddl", "oracle"])
    assert result.exit_code == 2 and "unknown engine 'oracle'" in result.output
    assert run_cli(archive, ["sql"]).exit_code == 2


def test_sql_and_ls_read_s3_parts_through_a_local_cache(
    s3_store: ObjectStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    _seed(s3_store, 10, until=MID_WEEK + 4 * 86400)
    assert any(p.name.startswith("day-") for p in (tmp_path / "cache").rglob("*.parquet")) is False
    result = run_cli(s3_store, ["sql", "SELECT count(*) AS n FROM sessions", "--format", "csv"])
    assert result.output == "n\n11\n"
    cached = sorted(p.name for p in (tmp_path / "cache").rglob("*.parquet"))
    assert cached and all(name.startswith("day-") for name in cached)
    s3_store.requests_made.reset()
    args = ["ls", "--since", "2026-11-16", "--until", "2026-11-22", "--label", "tournament=cup-7", "--format", "json"]
    result = run_cli(s3_store, args)
    assert re.findall(r'"session_id": "(s\d+)"', result.output) == ["s03"]
    # Parts come from the cache: one listing per day of the range (empty days have empty parts), no GET.
    found = list_sessions(s3_store, since=MID_WEEK - 2 * 86400, until=MID_WEEK + 4 * 86400 - 1, now=NOW)
    assert len(found) == 10
    assert s3_store.requests_made.snapshot() == {"ListObjectsV2": 7}
