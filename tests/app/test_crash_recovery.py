"""Crash safety: the archiver killed at each durability boundary loses nothing and duplicates nothing.

Each case runs the pipeline in a subprocess (this file doubles as the runner script) with
`ARCHIVER_CRASH_AT=<point>`, waits for exit code 137, restarts it without the variable and checks
the bucket: every session archived exactly once, byte-identical to what the fake served, and no
multipart upload left behind.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow  # tens of seconds: `make test-slow`, which CI runs

TOKEN = "test-token"
REPLAY = "/srv/replays/match.replay"
#: Larger than the store's 8 MiB multipart threshold: two parts, so a crash can fall between them.
BIG = "/srv/replays/big.bin"
BIG_SIZE = 12 * 1024 * 1024
PREFIX = "archive/"
CRASH_POINTS = (
    "after_spool_write",
    "after_spool_rename",
    "after_part_upload",
    "after_upload_complete",
    "after_outcome_commit",
    "after_manifest",
)


# --- the runner (subprocess side) ---------------------------------------------------------------


def _run(config: dict[str, Any]) -> int:
    """Archive until every expected session is archived (exit 0), or give up (exit 3)."""
    from prometheus_client import CollectorRegistry

    from archiver.archive import crashpoints
    from archiver.archive.pipeline import Pipeline, Tuning
    from archiver.archive.state import StateDB
    from archiver.config.settings import Settings
    from archiver.metrics.selfmetrics import SelfMetrics
    from archiver.retry import RetryPolicy
    from archiver.store import open_store
    from archiver.upstream.api import SessionHostClient, Token

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    crashpoints.arm()  # what an entry point does (archiver.app.process.apply)
    settings = Settings(
        state_dir=Path(config["state_dir"]),
        artifact_paths=tuple(config["paths"]),
        fetch_workers=2,
        upload_workers=2,
    )
    policy = RetryPolicy(attempts=3, initial_wait=0.01, max_wait=0.05, max_elapsed=2.0)
    client = SessionHostClient.connect(config["fake_url"], Token(TOKEN), policy=policy)
    store = open_store(f"s3://{config['bucket']}/{PREFIX}", s3_endpoint_url=config["endpoint"])
    state = StateDB.open(settings.state_dir)
    tuning = Tuning(confirm_retry=0.1, fetch_backoff_initial=0.05, fetch_backoff_max=0.2,
                    upload_backoff_initial=0.05, upload_backoff_max=0.2, idle_wait=0.3)  # fmt: skip
    pipeline = Pipeline(settings, client, store, state, SelfMetrics(CollectorRegistry()), policy=policy, tuning=tuning)
    pipeline.recover()
    pipeline.start()
    until = time.monotonic() + config["timeout"]
    while time.monotonic() < until:
        pipeline.observe_poll(client.list_sessions().sessions, time.time())
        done = all((row := state.latest(sid)) is not None and row.state == "archived" for sid in config["ids"])
        if done and pipeline.run_until_idle(0.0):
            pipeline.stop(5.0)
            return 0
        pipeline.run_until_idle(0.2)  # doubles as the poll interval, woken early by progress
    return 3


if __name__ == "__main__":
    sys.exit(_run(json.loads(sys.argv[1])))


# --- the test (pytest side) ---------------------------------------------------------------------

from archiver.archive.state import StateDB  # noqa: E402
from archiver.errors import StateError  # noqa: E402
from archiver.fake import FakeService  # noqa: E402
from archiver.fake.logs import render_text  # noqa: E402
from archiver.layout import keys  # noqa: E402
from archiver.layout.manifest import parse_index_entry, parse_manifest  # noqa: E402
from tests.support import sha256_of, wait_until  # noqa: E402


def _start(config: dict[str, Any], crash_at: str | None) -> subprocess.Popen[bytes]:
    env = dict(os.environ)
    env.pop("ARCHIVER_CRASH_AT", None)
    if crash_at:
        env["ARCHIVER_CRASH_AT"] = crash_at
    return subprocess.Popen(
        [sys.executable, __file__, json.dumps(config)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


def _wait(proc: subprocess.Popen[bytes], timeout: float) -> tuple[int, str]:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        pytest.fail(f"runner did not finish in {timeout} s:\n{out.decode(errors='replace')[-3000:]}")
    return proc.returncode, out.decode(errors="replace")


def _poll_until(condition: Callable[[], bool], proc: subprocess.Popen[bytes], timeout: float) -> None:
    """Wait (by polling the runner's durable state) until `condition`, failing if the runner exits.
    The runner is another process: there is nothing to wait on but its DB."""

    def met() -> bool:
        if condition():
            return True
        if proc.poll() is not None:
            pytest.fail(f"runner exited early ({proc.returncode}):\n{_wait(proc, 1)[1][-3000:]}")
        return False

    wait_until(met, timeout=timeout, message="the runner never saw the sessions active")


@pytest.mark.parametrize("point", CRASH_POINTS)
def test_a_crash_at_each_boundary_loses_nothing_and_duplicates_nothing(
    point: str, tmp_path: Path, s3_bucket: tuple[str, str], s3_client: Callable[..., Any]
) -> None:
    endpoint, bucket = s3_bucket
    with FakeService((TOKEN,)) as fake:
        ids = [fake.add_session(TOKEN, id=f"crash-{n}") for n in range(2)]
        ids.append(fake.add_session(TOKEN, id="crash-big", files={BIG: BIG_SIZE}))
        state_dir = tmp_path / "state"
        config = {
            "fake_url": fake.base_url, "endpoint": endpoint, "bucket": bucket, "state_dir": str(state_dir),
            "paths": [REPLAY, BIG], "ids": ids, "timeout": 40.0,
        }  # fmt: skip
        first = _start(config, point)

        def all_active() -> bool:
            if not (state_dir / "state.db").exists():
                return False
            try:
                state = StateDB.open_readonly(state_dir)
            except StateError:
                return False  # created but the schema not yet committed
            try:
                return all((r := state.latest(sid)) is not None and r.state == "active" for sid in ids)
            finally:
                state.close()

        _poll_until(all_active, first, 30)
        for sid in ids:
            fake.end_session(TOKEN, sid)
        code, out = _wait(first, 60)
        assert code == 137, f"expected the crash at {point}, got exit {code}:\n{out[-3000:]}"

        s3 = s3_client()
        _assert_crashed_mid_way(point, state_dir, ids, s3, bucket)

        code, out = _wait(_start(config, None), 60)
        assert code == 0, out[-3000:]

        listed = s3.list_objects_v2(Bucket=bucket)
        stored = sorted(o["Key"] for o in listed.get("Contents", []))
        expected: set[str] = set()
        state = StateDB.open_readonly(state_dir)
        instances = {sid: row.instance for sid in ids if (row := state.latest(sid)) is not None}
        state.close()
        for sid in ids:
            manifest_key = keys.manifest_key(PREFIX, sid, instances[sid])
            manifest = parse_manifest(s3.get_object(Bucket=bucket, Key=manifest_key)["Body"].read())
            expected.add(manifest_key)
            index_key = keys.index_key(PREFIX, manifest.ended_at, sid, instances[sid])
            expected.add(index_key)
            entry = parse_index_entry(s3.get_object(Bucket=bucket, Key=index_key)["Body"].read())
            assert entry.manifest_key == manifest_key
            outcomes = {i.path: i.outcome for i in manifest.items}
            assert outcomes == {
                None: "archived",
                REPLAY: "archived",
                BIG: "archived" if sid == "crash-big" else "source_gone",
            }
            for item in manifest.items:
                if item.outcome != "archived":
                    continue
                assert item.key is not None
                expected.add(item.key)
                body = s3.get_object(Bucket=bucket, Key=item.key)["Body"].read()
                assert hashlib.sha256(body).hexdigest() == item.sha256 and len(body) == item.size
                if item.kind == "logs":
                    assert gzip.decompress(body) == render_text(fake.log_lines(TOKEN, sid))
                else:
                    assert item.sha256 == sha256_of(fake.artifact_bytes(TOKEN, sid, item.path or ""))
        # Exactly the expected objects: nothing lost, nothing duplicated, no stray temporary keys.
        assert stored == sorted(expected)
        assert s3.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []
        assert not any(state_dir.joinpath("spool").iterdir())


def _assert_crashed_mid_way(point: str, state_dir: Path, ids: list[str], s3: Any, bucket: str) -> None:
    """The crash left exactly the half-done state its boundary promises (so recovery had work to do)."""
    state = StateDB.open_readonly(state_dir)
    try:
        sessions = [state.latest(sid) for sid in ids]
        items = [i for s in sessions if s is not None for i in state.items_of(s.key)]
        journal = dict(state.journal.entries())
    finally:
        state.close()
    spool = sorted(p.name for p in (state_dir / "spool").iterdir())
    stored = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket).get("Contents", [])]
    uploads = s3.list_multipart_uploads(Bucket=bucket).get("Uploads", [])
    if point == "after_spool_write":
        assert any(name.endswith(".partial") for name in spool), spool
    elif point == "after_spool_rename":
        fetching = {str(i.id) for i in items if i.status == "fetching"}
        assert fetching & set(spool), (fetching, spool)
    elif point == "after_part_upload":
        assert len(uploads) == 1 and journal == {uploads[0]["Key"]: uploads[0]["UploadId"]}
    elif point == "after_upload_complete":
        assert any(i.status == "spooled" and i.key in stored for i in items)  # its claim was in memory
    elif point == "after_outcome_commit":
        # Committed `done`, its spool file still there: recovery's sweep must delete it, nothing else.
        assert any(i.outcome == "archived" and i.key in stored and str(i.id) in spool for i in items), (items, spool)
    elif point == "after_manifest":
        finalizing = [s for s in sessions if s is not None and s.state == "finalizing"]
        assert any(keys.manifest_key(PREFIX, s.id, s.instance) in stored for s in finalizing)
