"""Benchmark of the columnar index: `ls`, `sql`, compaction and grep's token filters at scale.

Usage: python benchmarks/index.py [--sessions 1000000] [--days 90] [--hour-sessions 10000]

Seeds ``--sessions`` archived sessions over ``--days`` days into a directory store, compacted as
the daemon leaves it (one part per closed day, hour parts for the closed hours of today, the
current hour's JSON entries, and those behind the hour parts of the late window, which `ls` lists
too; 1 % of sessions carry ``tournament=cup-7``). The parts are written
straight from SQL with the index's schema (through the daemon it would take hours), so this
measures the readers, not the seeding. Then, in a store of its own, one hour of
``--hour-sessions`` real JSON entries, manifests and logs is compacted by `archiver compact` (CPU
and peak RSS of the process, Parquet bytes against the JSON entries covered), and grep looks for a token present in
1 % of those logs with and without the token filters (bytes read, identical output).

Budgets (issue 32): ls --since 90d --label k=v <= 2 s and <= 300 store requests; ls --since 1h
<= 1 s; ls --player as today (one listing and one read per match, the player index); sql count by
day <= 2 s; compacting the hour <= 10 s CPU and <= 200 MB RSS; the sessions table's Parquet
<= 15 % of the JSON entries it covers; grep reads <= 5 % of the log bytes.
"""

from __future__ import annotations

import argparse
import gzip
import io
import os
import resource
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from archiver.index import grepfilter
from archiver.index.engine import COMPRESSION, connect
from archiver.index.parts import DAY, HOUR, day_of, day_start
from archiver.index.reader import LATE_WINDOW
from archiver.index.schema import TABLES
from archiver.index.sql import run_sql
from archiver.layout import keys
from archiver.layout.manifest import (
    IndexEntry,
    ManifestItem,
    build_manifest,
    index_entry_for,
    index_entry_to_bytes,
    manifest_to_bytes,
)
from archiver.retrieval import retrieve
from archiver.retrieval.grep import Matcher, grep_sessions
from archiver.store import FileStore

INSTANCE = "20261120T000000.000Z"
#: 2026-11-27 10:01 UTC: every hour before 10:00 is compacted, the current one is JSON.
NOW = day_start("2026-11-27") + 10 * HOUR + 60


def _generated(day: str, n: int, first: float, span: float) -> dict[str, str]:
    """SELECTs generating ``n`` sessions ending in ``[first, first + span)`` of ``day``, per table."""
    sid = f"'sess-{day}-' || i"
    ended = f"({first} + (i + 0.5) * {span} / {n})"
    hour = f"lpad(CAST(floor((({ended}) - {day_start(day)}) / 3600) AS VARCHAR), 2, '0')"
    sessions = f"""SELECT {sid} AS session_id, '{INSTANCE}' AS instance, {ended} AS ended_at,
        {ended} + 30 AS archived_at, {ended} - 1800 AS created, 'demo-game' AS image,
        CASE WHEN i % 10 = 0 THEN '1.4.2' ELSE '1.4.1' END AS tag,
        ['eu-west-1', 'us-east-1', 'ap-south-1'][i % 3 + 1] AS location, '203.0.113.42' AS host,
        CASE WHEN i % 100 = 7 THEN MAP {{'mode': 'duel', 'tournament': 'cup-7'}}
             ELSE MAP {{'mode': 'duel', 'tournament': 'league'}} END AS labels,
        ['p' || (i * 7 % 50000), 'p' || ((i * 7 + 1) % 50000)] AS players, 2::BIGINT AS player_count,
        CASE WHEN i % 25 = 0 THEN 'dead' ELSE 'exited' END AS last_status,
        MAP {{'archived': 2::BIGINT}} AS counts, (1049000 + i % 1000)::BIGINT AS total_bytes,
        'sessions/' || {sid} || '/{INSTANCE}/manifest.json' AS manifest_key, sha256({sid}) AS manifest_sha256,
        1::BIGINT AS entry_schema_version,
        'index/dt={day}/hour=' || {hour} || '/' || {sid} || '.{INSTANCE}.json' AS entry_key
        FROM range({n}) t(i)"""
    players = f"""SELECT 'p' || ((i * 7 + j) % 50000) AS player, {sid} AS session_id, '{INSTANCE}' AS instance,
        {ended} AS ended_at FROM range({n}) t(i), range(2) u(j)"""
    items = f"""SELECT {sid} AS session_id, '{INSTANCE}' AS instance, {ended} AS ended_at,
        CASE WHEN j = 0 THEN 'logs' ELSE 'artifact' END AS kind,
        CASE WHEN j = 0 THEN NULL ELSE '/srv/replays/match.replay' END AS path,
        'sessions/' || {sid} || '/{INSTANCE}/' || CASE WHEN j = 0 THEN 'logs.txt.gz'
            ELSE 'artifacts/srv-replays-match.replay-1a2b3c4d.tar.gz' END AS key,
        (1000 + i % 100000)::BIGINT AS size, sha256({sid} || j) AS sha256, 'archived' AS outcome,
        NULL AS capture, NULL AS checksum_sha256, NULL AS error, NULL AS tokens_bloom
        FROM range({n}) t(i), range(2) u(j)"""
    return {"sessions": sessions, "players": players, "items": items}


def _write_entry(root: Path, key: str, sid: str, ended: float, tournament: str) -> None:
    entry = IndexEntry(
        session_id=sid, ended_at=ended, archived_at=ended + 30, image="demo-game", tag="1.4.1",
        location="eu-west-1", labels={"tournament": tournament},
        counts={"archived": 2}, total_bytes=1_049_000, manifest_key=keys.manifest_key("", sid, INSTANCE),
        instance=INSTANCE,
    )  # fmt: skip
    path = root / key
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(index_entry_to_bytes(entry))


def seed(root: Path, sessions: int, days: int) -> int:
    """The compacted archive of ``sessions`` over ``days`` days before NOW; JSON entries written."""
    con = connect()
    per_day = sessions // days
    today = day_of(NOW)
    spans: list[tuple[str, str, int, float, float]] = []
    for d in range(days, 0, -1):
        day = day_of(NOW - d * DAY)
        spans.append((f"index/dt={day}", "day-bench", per_day, day_start(day), DAY))
    per_hour = max(1, per_day // 24)
    for h in range(int((NOW - day_start(today)) // HOUR)):
        spans.append(
            (f"index/hourly/dt={today}/hour={h:02d}", "hour-bench", per_hour, day_start(today) + h * HOUR, HOUR)
        )
    for directory, name, n, first, span in spans:
        day = directory.split("dt=")[1][:10]
        for t in TABLES:
            out = root / directory / t.name / f"{name}.parquet"
            out.parent.mkdir(parents=True, exist_ok=True)
            order = ", ".join(t.order_by)
            query = f"SELECT {', '.join(t.names)} FROM ({_generated(day, n, first, span)[t.name]}) ORDER BY {order}"
            con.execute(f"COPY ({query}) TO '{out}' (FORMAT parquet, COMPRESSION {COMPRESSION})")
    # The entries behind the hour parts of the late window, which readers list besides the parts.
    store = FileStore(root)
    for directory, name, _n, first, _span in spans:
        if name == "hour-bench" and first + HOUR > NOW - LATE_WINDOW:
            part = root / directory / "sessions" / f"{name}.parquet"
            rows = con.execute(f"SELECT session_id, ended_at, entry_key FROM read_parquet('{part}')").fetchall()
            for sid, ended, entry_key in rows:
                _write_entry(root, entry_key, sid, ended, "league")
    con.close()
    # The current hour, not compacted yet: JSON entries, as the archiver writes them.
    current = int(NOW // HOUR * HOUR)
    json_entries = max(1, int(per_hour * (NOW - current) / HOUR))
    for i in range(json_entries):
        sid, ended = f"now-{i}", current + i * (NOW - current) / json_entries
        key = keys.index_key(store.prefix, ended, sid, INSTANCE)
        _write_entry(root, key, sid, ended, "cup-7" if i % 100 == 7 else "league")
    return per_day * days + per_hour * int((NOW - day_start(today)) // HOUR) + json_entries


def seed_player(root: Path, player: str, since: float) -> int:
    """The player index entries (``players/{player}/…``, as the archiver writes them) of every seeded
    archive ``player`` took part in, read back from the seeded ``players`` parts; how many ended since ``since``."""
    con = connect()
    rows = con.execute(
        f"SELECT DISTINCT session_id, ended_at FROM read_parquet('{root}/index/**/players/*.parquet') WHERE player = ?",
        [player],
    ).fetchall()
    con.close()
    for sid, ended in rows:
        entry = IndexEntry(
            session_id=sid, ended_at=ended, archived_at=ended + 30, image="demo-game", tag="1.4.1",
            location="eu-west-1", labels={"tournament": "league"}, counts={"archived": 2}, total_bytes=1_049_000,
            manifest_key=keys.manifest_key("", sid, INSTANCE), instance=INSTANCE,
        )  # fmt: skip
        path = root / keys.player_key("", player, ended, sid, INSTANCE)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(index_entry_to_bytes(entry))
    return sum(1 for _sid, ended in rows if ended >= since)


def on_seaweedfs(root: Path, days: int) -> tuple[float, int, float, int, int]:
    """The seeded archive copied to a SeaweedFS bucket: `ls --since 90d --label` with a cold part cache
    and again warm (seconds and S3 requests each), and the rows listed."""
    import boto3

    from archiver.store import open_store
    from benchmarks.peers import seaweedfs

    with seaweedfs() as endpoint, tempfile.TemporaryDirectory() as cache:
        client = boto3.client("s3", endpoint_url=endpoint)
        client.create_bucket(Bucket="bench")
        files = [p for p in root.rglob("*") if p.is_file() and ".partial" not in p.parts]
        with ThreadPoolExecutor(max_workers=8) as pool:
            list(pool.map(lambda p: client.upload_file(str(p), "bench", f"archive/{p.relative_to(root)}"), files))
        os.environ["XDG_CACHE_HOME"] = cache
        store = open_store("s3://bench/archive/", s3_endpoint_url=endpoint)
        figures = []
        for _ in range(2):
            store.requests_made.reset()
            started = time.perf_counter()
            entries = retrieve.list_sessions(store, since=NOW - days * DAY, labels={"tournament": "cup-7"}, now=NOW)
            retrieve.render_sessions(entries, io.StringIO())
            figures.append((time.perf_counter() - started, store.requests_made.total()))
        store.close()
    (cold, cold_requests), (warm, warm_requests) = figures
    return cold, cold_requests, warm, warm_requests, len(entries)


def timed_ls(store: FileStore, **filters: object) -> tuple[float, int, int]:
    """Best of three: seconds, rows, store requests of `ls` with ``filters`` (rendered as a table)."""
    best = (float("inf"), 0, 0)
    for _ in range(3):
        store.requests_made.reset()
        started = time.perf_counter()
        entries = retrieve.list_sessions(store, now=NOW, **filters)  # type: ignore[arg-type]
        retrieve.render_sessions(entries, io.StringIO())
        elapsed = time.perf_counter() - started
        if elapsed < best[0]:
            best = (elapsed, len(entries), store.requests_made.total())
    return best


# --- one hour of real entries: compaction and grep --------------------------------------------------


def seed_hour(root: Path, n: int, hour_start: float) -> int:
    """``n`` archives (manifest, entry, a ~6 KB text log; 1 % holding ``tok42``) ending in one hour;
    the bytes of their JSON entries."""
    entry_bytes = 0
    for i in range(n):
        sid, ended = f"hour-{i:05d}", hour_start + (i + 0.5) * HOUR / n
        lines = "".join(f"{ended:.3f} match {i} tick {t} players 2 score {t * 7 % 97}\n" for t in range(120))
        if i % 100 == 42:
            lines += "warning: tok42 seen in round 3\n"
        log = gzip.compress(lines.encode(), compresslevel=1, mtime=0)
        log_key = keys.logs_key("", sid, "txt", INSTANCE)
        (root / log_key).parent.mkdir(parents=True, exist_ok=True)
        (root / log_key).write_bytes(log)
        item = ManifestItem(
            kind="logs", source=f"GET /query/log?matchKey={sid}", outcome="archived", key=log_key, size=len(log),
            sha256=__import__("hashlib").sha256(log).hexdigest(), content_type="application/gzip",
        )  # fmt: skip
        manifest = build_manifest(
            session_id=sid, image="demo-game", tag="1.4.1", location="eu-west-1", host="203.0.113.42",
            created=ended - 1800, labels={"mode": "duel", "tournament": "cup-7" if i % 100 == 7 else "league"},
            players=(f"p{i}", f"p{i + 1}"), player_count=2, last_status="exited", last_seen_active=ended - 10,
            first_seen_ended=ended, fetch_deadline=ended + 4 * HOUR, archived_at=ended + 30, items=[item],
            instance=INSTANCE,
        )  # fmt: skip
        mkey = keys.manifest_key("", sid, INSTANCE)
        (root / mkey).write_bytes(manifest_to_bytes(manifest))
        entry = index_entry_to_bytes(index_entry_for(manifest, mkey))
        path = root / keys.index_key("", manifest.ended_at, sid, INSTANCE)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(entry)
        entry_bytes += len(entry)
    return entry_bytes


#: Runs `archiver` and prints its own peak RSS (VmHWM: the process's own, where ru_maxrss of a child
#: would also count the benchmark's memory it was forked from).
_PEAK_RSS_WRAPPER = """import runpy, sys
try:
    runpy.run_module("archiver.cli", run_name="__main__", alter_sys=True)
finally:
    with open("/proc/self/status") as status:
        print(next(line for line in status if line.startswith("VmHWM")).split()[1], file=sys.stderr)
"""


def compact_cli(root: Path) -> dict[str, float]:
    """`archiver compact` over the store at ``root`` as a process of its own: its CPU seconds and peak RSS."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    child = subprocess.run(
        [sys.executable, "-c", _PEAK_RSS_WRAPPER, "compact", "--store", root.as_uri(), "--no-progress"],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return {"cpu": cpu, "rss_mb": int(child.stderr.split()[-1]) / 1024}


def writers(root: Path, work: Path) -> dict[str, tuple[float, int]]:
    """The compacted hour's three tables written again by DuckDB (what the archiver uses) and by
    pyarrow, zstd both, interleaved: median seconds of three and bytes, per writer."""
    import statistics

    import pyarrow.parquet as pq

    con = connect()
    tables = {
        t.name: con.sql(f"SELECT * FROM read_parquet('{root}/index/**/{t.name}/*.parquet')").to_arrow_table()
        for t in TABLES
    }
    times: dict[str, list[float]] = {"duckdb": [], "pyarrow": []}
    sizes: dict[str, int] = {}
    for _ in range(3):
        for writer in times:
            started = time.perf_counter()
            size = 0
            for name, table in tables.items():
                out = work / f"{writer}-{name}.parquet"
                if writer == "duckdb":
                    con.register("rows", table)
                    con.execute(f"COPY rows TO '{out}' (FORMAT parquet, COMPRESSION {COMPRESSION})")
                    con.unregister("rows")
                else:
                    pq.write_table(table, out, compression=COMPRESSION)
                size += out.stat().st_size
            times[writer].append(time.perf_counter() - started)
            sizes[writer] = size
    con.close()
    return {w: (statistics.median(ts), sizes[w]) for w, ts in times.items()}


def grep_bytes(store: FileStore, pattern: str, since: float, until: float) -> tuple[int, int, str, str]:
    """(log bytes read by a full scan, by the filtered grep, full output, filtered output)."""
    entries = retrieve.list_sessions(store, since=since, until=until, now=until)
    full, filtered = io.StringIO(), io.StringIO()
    matcher = Matcher(pattern)
    scan = grep_sessions(store, entries, matcher, full, fmt="json")
    chosen = grepfilter.select(store, entries, pattern, fixed=False, since=since, until=until).entries
    picked = grep_sessions(store, chosen, matcher, filtered, fmt="json")
    return scan.bytes, picked.bytes, full.getvalue(), filtered.getvalue()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=1_000_000)
    parser.add_argument("--days", type=int, default=90)
    parser.add_argument("--hour-sessions", type=int, default=10_000)
    parser.add_argument("--no-seaweedfs", action="store_true", help="Skip the SeaweedFS run (S3 requests counted).")
    args = parser.parse_args()
    results: list[tuple[str, str, bool]] = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "archive"
        started = time.perf_counter()
        total = seed(root, args.sessions, args.days)
        print(f"seeded {total} sessions over {args.days} days in {time.perf_counter() - started:.1f} s", flush=True)
        store = FileStore(root)
        seconds, rows, requests = timed_ls(store, since=NOW - args.days * DAY, labels={"tournament": "cup-7"})
        ok = seconds <= 2.0 and requests <= 300 and rows > 0
        results.append(
            ("ls --since 90d --label (1 %)", f"{seconds * 1000:.0f} ms, {requests} requests, {rows} rows", ok)
        )
        seconds, rows, requests = timed_ls(store, since=NOW - HOUR)
        results.append(("ls --since 1h", f"{seconds * 1000:.0f} ms, {requests} requests, {rows} rows", seconds <= 1.0))
        matches = seed_player(root, "p7", NOW - args.days * DAY)
        seconds, rows, requests = timed_ls(store, since=NOW - args.days * DAY, player="p7")
        ok = rows == matches and requests == 1 + matches  # the player index: one listing, one read per match
        results.append(("ls --since 90d --player", f"{seconds * 1000:.0f} ms, {requests} requests, {rows} rows", ok))
        started = time.perf_counter()
        result = run_sql(
            store, "SELECT dt, count(*) AS n FROM sessions GROUP BY dt ORDER BY dt",
            since=NOW - args.days * DAY, until=NOW, now=NOW, warn=lambda _m: None,
        )  # fmt: skip
        seconds = time.perf_counter() - started
        results.append(("sql count by day", f"{seconds * 1000:.0f} ms, {len(result.rows)} days", seconds <= 2.0))
        if not args.no_seaweedfs:
            cold, cold_requests, warm, warm_requests, rows = on_seaweedfs(root, args.days)
            figure = f"cold cache {cold * 1000:.0f} ms, {cold_requests} requests; warm {warm * 1000:.0f} ms, "
            figure += f"{warm_requests} requests; {rows} rows"
            ok = cold_requests <= 300 and warm <= 2.0
            results.append(("SeaweedFS: ls --since 90d --label (1 %)", figure, ok))
        parquet = sum(p.stat().st_size for p in root.glob("index/dt=*/sessions/*.parquet"))
        print(f"day parts: sessions table {parquet / 1e6:.1f} MB for {args.sessions} sessions", flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        hour_start = (NOW - 2 * HOUR) // HOUR * HOUR
        entry_bytes = seed_hour(root, args.hour_sessions, hour_start)
        stats = compact_cli(root)
        sizes = {t.name: sum(p.stat().st_size for p in root.glob(f"index/**/{t.name}/*.parquet")) for t in TABLES}
        compacted = len(retrieve.list_sessions(FileStore(root), since=hour_start, until=NOW, now=NOW))
        ok = stats["cpu"] <= 10 and stats["rss_mb"] <= 200 and compacted == args.hour_sessions
        results.append(("compact one hour (CLI)", f"{stats['cpu']:.1f} s CPU, {stats['rss_mb']:.0f} MB RSS", ok))
        ratio = sizes["sessions"] / entry_bytes
        every = sum(sizes.values()) / entry_bytes
        results.append((
            "Parquet / JSON entries",
            f"sessions {ratio:.1%} (all three tables {every:.1%}) of {entry_bytes / 1e6:.1f} MB",
            ratio <= 0.15,
        ))  # fmt: skip
        with tempfile.TemporaryDirectory() as work:
            written = writers(root, Path(work))
        (duck_s, duck_b), (arrow_s, arrow_b) = written["duckdb"], written["pyarrow"]
        figure = f"DuckDB {duck_s * 1000:.0f} ms, {duck_b / 1e6:.2f} MB; pyarrow {arrow_s * 1000:.0f} ms, "
        figure += f"{arrow_b / 1e6:.2f} MB (informative: DuckDB also reads, pyarrow is test-only)"
        results.append(("Parquet writers, the hour's three tables", figure, True))
        full, filtered, full_out, filtered_out = grep_bytes(FileStore(root), r"\btok42\b", hour_start, NOW)
        same = full_out == filtered_out and full_out.count("\n") == args.hour_sessions // 100
        results.append(("grep token in 1 % of logs", f"{filtered / full:.1%} of log bytes, same output: {same}",
                        filtered / full <= 0.05 and same))  # fmt: skip
    for name, figure, ok in results:
        print(f"{name}: {figure} {'ok' if ok else 'MISSED'}")
    return 0 if all(ok for _, _, ok in results) else 1


if __name__ == "__main__":
    sys.exit(main())
