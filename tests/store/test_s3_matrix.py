"""The archive → verify → retrieve suite across the quirk matrix: the real pipeline archives fake-service
sessions into SeaweedFS behind the quirky-S3 proxy (`tests/s3_quirks.py`), one case per switch and a
"worst store" with all of them, and every case must hold the same promises: every session archived
once, byte-identical to what the service served, no object written twice with other bytes, and no
false alarm from `verify` or `get`.

Each case archives once (a module-scoped fixture, one bucket and proxy per case, the session's one
SeaweedFS); the tests below then read what it left. `make test` runs the faithful and the worst
store; each switch alone (about 2.5 s a case) runs in `make test-slow`, which CI runs too. Ground
truth is read straight from SeaweedFS, never through the proxy. The start-up probe's findings (and
its warnings) are asserted per case, and issue 28's two `verify` stories and `archiver check` on the
worst store close the module.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import logging
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from archiver.archive.pipeline import Pipeline
from archiver.archive.state import StateDB
from archiver.config.credentials import Token
from archiver.config.settings import Settings
from archiver.fake import FakeService
from archiver.fake.content import REPLAY
from archiver.fake.oracle import LOGS
from archiver.layout.manifest import Manifest, parse_manifest
from archiver.metrics.selfmetrics import SelfMetrics
from archiver.retrieval import retrieve
from archiver.store import S3Store, make_s3_client, open_store
from archiver.store.s3_probe import OPTIONAL_OPERATIONS, StoreFindings, missing_guarantees
from archiver.upstream.api import SessionHostClient
from tests.fixtures_fake import TEST_TOKEN
from tests.fixtures_pipeline import FAST, FAST_POLICY
from tests.fixtures_s3 import SeaweedServer
from tests.s3_quirks import WORST, QuirkyS3Proxy, StoreQuirks
from tests.support import settings_from

MIB = 1024 * 1024
PREFIX = "archive/"
#: Seconds a written key stays out of listings in the lagging cases (by the proxy's own clock,
#: which the tests move: nothing waits for it).
LAG = 30.0

#: One case per switch, and the worst store (every switch at once); "faithful" is the proxy alone.
CASES: dict[str, StoreQuirks] = {
    "faithful": StoreQuirks(),
    "no_checksums": StoreQuirks(no_checksums=True),
    "drops_metadata": StoreQuirks(drops_metadata=True),
    "ignores_if_none_match": StoreQuirks(ignores_if_none_match=True),
    "optional_calls_501": StoreQuirks(optional_calls_501=True),
    "rejects_crc32": StoreQuirks(rejects_crc32=True),
    "etag_unquoted": StoreQuirks(etag_unquoted=True),
    "etag_upper": StoreQuirks(etag_upper=True),
    "list_unordered": StoreQuirks(list_unordered=True),
    "list_lag": StoreQuirks(list_lag=LAG),
    "slowdown": StoreQuirks(slowdown_every=20),
    "worst": WORST,
}


class LogLines(logging.Handler):
    """The messages one logger emits at ``level`` or above while the ``with`` block runs."""

    def __init__(self, name: str, level: int) -> None:
        super().__init__(level)
        self.logger = logging.getLogger(name)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())

    def __enter__(self) -> LogLines:
        self.logger.addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        self.logger.removeHandler(self)


class ManualClock:
    """The proxy's clock for the listing lag: moved by the test, never waited for."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@functools.cache
def direct_client(endpoint: str) -> Any:
    """A client straight to SeaweedFS (no proxy): the ground truth, and out-of-band writes."""
    return make_s3_client(endpoint_url=endpoint)


@dataclass
class MatrixRun:
    """What one case left behind: the store as the archiver sees it (through the proxy) and the truth."""

    case: str
    quirks: StoreQuirks
    seaweed: SeaweedServer
    bucket: str
    proxy: QuirkyS3Proxy
    clock: ManualClock
    store: S3Store
    fake: FakeService
    sids: list[str]
    #: What the start-up probe found, and the warnings it logged (one per missing guarantee).
    findings: StoreFindings
    warnings: list[str]
    probe_answered: bool
    finished: bool
    seconds: float
    out: Path
    #: The store as a user's `verify` or `get` opens it: a fresh one, never probed.
    reader: S3Store
    manifests: dict[str, list[Manifest]] = field(default_factory=dict)

    def object_bytes(self, key: str) -> bytes:
        body: bytes = direct_client(self.seaweed.endpoint).get_object(Bucket=self.bucket, Key=key)["Body"].read()
        return body


def archived_manifests(seaweed: SeaweedServer, bucket: str) -> list[Manifest]:
    """Every manifest in ``bucket`` (read straight from SeaweedFS)."""
    client = direct_client(seaweed.endpoint)
    found = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=PREFIX):
        for obj in page.get("Contents", []):
            if obj["Key"].endswith("/manifest.json"):
                found.append(parse_manifest(client.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read()))
    return found


def fresh_bucket(seaweed: SeaweedServer) -> str:
    bucket = f"mx-{uuid.uuid4().hex[:20]}"
    direct_client(seaweed.endpoint).create_bucket(Bucket=bucket)
    return bucket


def open_quirky_store(proxy: QuirkyS3Proxy, bucket: str) -> S3Store:
    """The archiver's store on the proxy; multipart from 256 KiB (one 5 MiB part holds such an
    artifact: create, part and completion, for a few bytes)."""
    store = open_store(
        f"s3://{bucket}/{PREFIX}", s3_endpoint_url=proxy.endpoint, multipart_threshold=256 * 1024, part_size=5 * MIB
    )
    assert isinstance(store, S3Store)
    return store


def archive_sessions(
    fake: FakeService, store: S3Store, state_dir: Path, sessions: list[dict[str, Any]], *, timeout: float = 20.0
) -> tuple[list[str], bool, bool]:
    """Start the pipeline as the daemon does (writes check first, the store probed, recovered), let
    it archive ``sessions`` (``add_session`` arguments) as each one ends, stop it: (ids, whether the
    probe answered, whether everything finished in ``timeout``)."""
    settings = Settings(state_dir=state_dir, artifact_paths=(REPLAY,), fetch_workers=2, upload_workers=2)
    client = SessionHostClient.connect(fake.base_url, Token(TEST_TOKEN), policy=FAST_POLICY)
    state = StateDB.open(settings.state_dir)
    pipeline = Pipeline(
        settings, client, store, state, SelfMetrics(CollectorRegistry()),
        clock=fake.clock.now, policy=FAST_POLICY, tuning=FAST,
    )  # fmt: skip
    try:
        pipeline.distrust_store()
        answered = pipeline.probe_store()
        pipeline.recover()
        pipeline.start(reconcile=False)
        sids = [fake.add_session(TEST_TOKEN, **kwargs) for kwargs in sessions]
        pipeline.observe_poll(client.list_sessions().sessions, fake.clock.now())
        for sid in sids:
            fake.end_session(TEST_TOKEN, sid)
        pipeline.observe_poll(client.list_sessions().sessions, fake.clock.now())
        finished = pipeline.run_until_idle(timeout)
    finally:
        pipeline.stop(10.0)
        client.close()
        state.close()
    return sids, answered, finished


#: The sessions of every case: two whose artifact (1 MiB) is a multipart upload, one with a small
#: one (a single PUT, as every log is).
SESSIONS: list[dict[str, Any]] = [
    {"players": ["ann", "bob"]},
    {"players": ["cid"], "files": {REPLAY: 64 * 1024}},
    {"players": ["ann"], "crashed": True},
]


#: The cases of `make test`: the proxy alone and every switch at once; the others are `slow`.
IN_MAKE_TEST = {"faithful", "worst"}


@pytest.fixture(
    scope="module", params=[c if c in IN_MAKE_TEST else pytest.param(c, marks=pytest.mark.slow) for c in CASES]
)
def run(
    request: pytest.FixtureRequest, seaweed_server: SeaweedServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[MatrixRun]:
    case = request.param
    quirks = CASES[case]
    clock = ManualClock()
    bucket = fresh_bucket(seaweed_server)
    base = tmp_path_factory.mktemp(f"matrix-{case}")
    with FakeService((TEST_TOKEN,)) as fake, QuirkyS3Proxy(seaweed_server.endpoint, quirks, clock=clock) as proxy:
        store = open_quirky_store(proxy, bucket)
        started = time.monotonic()
        with LogLines("archiver.store.s3", logging.WARNING) as warnings:
            sids, answered, finished = archive_sessions(fake, store, base / "state", SESSIONS)
        result = MatrixRun(
            case, quirks, seaweed_server, bucket, proxy, clock, store, fake, sids, store.findings, warnings.lines,
            answered, finished, time.monotonic() - started, base / "out", open_quirky_store(proxy, bucket),
        )  # fmt: skip
        # A user reads an archive later than it is written: past the listing lag of the lagging cases.
        clock.advance(LAG + 1)
        for manifest in archived_manifests(seaweed_server, bucket):
            result.manifests.setdefault(manifest.session_id, []).append(manifest)
        try:
            yield result
        finally:
            store.close()
            result.reader.close()


def test_every_session_is_archived_once_and_byte_identical(run: MatrixRun) -> None:
    """Each ended session has exactly one archive (logs and artifact archived), and every stored
    object is what its manifest says and what the fake service served (read straight from SeaweedFS)."""
    assert run.finished, f"the pipeline did not finish within its timeout ({run.seconds:.1f} s)"
    for sid in run.sids:
        manifests = run.manifests.get(sid, [])
        assert len(manifests) == 1, f"{sid}: {len(manifests)} archives"
        (manifest,) = manifests
        outcomes = {(item.kind, item.outcome) for item in manifest.items}
        assert outcomes == {("logs", "archived"), ("artifact", "archived")}, outcomes
        for item in manifest.items:
            assert item.key is not None and item.sha256 is not None
            body = run.object_bytes(item.key)
            assert (len(body), hashlib.sha256(body).hexdigest()) == (item.size, item.sha256), item.key
            served = hashlib.sha256(gzip.decompress(body)).hexdigest() if item.kind == "logs" else item.sha256
            what = LOGS if item.kind == "logs" else str(item.path)
            assert served in run.fake.oracle.complete_digests("org-1", sid, what), item.key


def test_no_archived_object_is_written_twice_with_other_bytes(run: MatrixRun) -> None:
    """The proxy saw every write the server accepted: none of an archive key replaced other bytes
    (the probe's own keys are the one exception, written twice on purpose)."""
    assert run.finished
    assert run.proxy.overwrites(ignore=lambda key: key.startswith(f"{PREFIX}_probe/")) == {}
    archived = {i.key for ms in run.manifests.values() for m in ms for i in m.items}
    written = {w.key for w in run.proxy.writes()}
    assert archived <= written


def test_verify_finds_every_archive_intact(run: MatrixRun) -> None:
    """`verify` as a user runs it (a fresh store, not probed) raises no false alarm: each object is
    proved by the store's checksum where the store keeps one, else counted as not provable by it;
    --deep re-hashes them all; `verify --since` finds the same archives through the index."""
    assert run.finished
    now = run.fake.clock.now()
    store = run.reader
    quick = retrieve.verify(store, session_ids=run.sids, now=now, deep=False)
    assert quick.ok, [p.line() for p in quick.problems]
    assert quick.sessions == len(run.sids) and quick.objects == 2 * len(run.sids) and quick.bytes == 0
    assert (quick.proved if run.findings.keeps_checksums else quick.unproven) == quick.objects
    deep = retrieve.verify(store, session_ids=run.sids, now=now, deep=True)
    assert deep.ok and deep.objects == quick.objects, [p.line() for p in deep.problems]
    listed = retrieve.verify(store, since=now - 3600, now=now, deep=False)
    assert listed.ok and listed.sessions == len(run.sids), [p.line() for p in listed.problems]


def test_get_downloads_every_object_verified(run: MatrixRun) -> None:
    """`get` downloads each archive, every file checked against its manifest's sha256."""
    assert run.finished
    for sid in run.sids:
        result = retrieve.download_session(run.reader, sid, run.out)
        assert len(result.files) == 2 and not result.not_archived
        for downloaded in result.files:
            assert hashlib.sha256(downloaded.path.read_bytes()).hexdigest() == downloaded.sha256


def expected_findings(q: StoreQuirks) -> StoreFindings:
    """What the probe must find behind the proxy with ``q`` (SeaweedFS itself keeps every guarantee)."""
    return StoreFindings(
        conditional_writes=not q.ignores_if_none_match,
        metadata_supported=not q.drops_metadata,
        verifies_checksums=not q.no_checksums,
        conditional_completes=not q.ignores_if_none_match,
        keeps_checksums=not q.no_checksums,
        keeps_composite_checksums=not q.no_checksums,
        accepts_crc32=not q.rejects_crc32,
        missing_operations=tuple(OPTIONAL_OPERATIONS) if q.optional_calls_501 else (),
    )


def test_the_start_up_probe_finds_what_the_store_does_and_says_each_missing_guarantee(run: MatrixRun) -> None:
    """The probe's findings follow the switches exactly (nothing assumed), and start-up logs one
    warning per missing guarantee (none where the switches take no guarantee away)."""
    assert run.probe_answered
    assert run.findings == expected_findings(run.quirks)
    lines = [line for _, line in missing_guarantees(run.findings, sends_checksums=True)]
    assert [w for w in run.warnings if w.startswith(run.store.url)] == [f"{run.store.url} {line}" for line in lines]


def test_manifests_record_a_store_checksum_only_where_the_store_keeps_one(run: MatrixRun) -> None:
    """Probed, not assumed: every archived item records the store's checksum exactly when the probe
    saw the store keep it."""
    assert run.finished
    items = [i for ms in run.manifests.values() for m in ms for i in m.items]
    assert items and all((i.checksum_sha256 is not None) is run.findings.keeps_checksums for i in items)


# --- `archiver check` -------------------------------------------------------------------------------


def test_check_says_every_guarantee_the_worst_store_lacks_and_none_on_a_faithful_one(
    seaweed_server: SeaweedServer, tmp_path: Path
) -> None:
    """`archiver check` against the worst store: create-once writes FAIL (naming both calls), one
    WARN line per other missing guarantee, never silent; against SeaweedFS as it is: all OK."""
    from archiver.app import doctor

    bucket = fresh_bucket(seaweed_server)
    with QuirkyS3Proxy(seaweed_server.endpoint, WORST) as proxy:
        settings = settings_from(["--store", f"s3://{bucket}/{PREFIX}", "--s3-endpoint-url", proxy.endpoint])
        results = {r.name: (r.status, r.detail) for r in doctor.check_store(settings)}
    assert results["conditional writes"][0] == "FAIL"
    assert "If-None-Match (on PutObject and CompleteMultipartUpload)" in results["conditional writes"][1]
    assert {name: status for name, (status, _) in results.items() if status == "WARN"} == dict.fromkeys(
        ("user metadata", "store checksums", "crc32 checksums", "orphan sweep", "object lock api", "legal hold api"),
        "WARN",
    )
    assert "not provable by the store" in results["store checksums"][1]
    with QuirkyS3Proxy(seaweed_server.endpoint) as proxy:
        settings = settings_from(["--store", f"s3://{bucket}/{PREFIX}", "--s3-endpoint-url", proxy.endpoint])
        statuses = {r.name: r.status for r in doctor.check_store(settings)}
    assert statuses == dict.fromkeys(
        ("store reachable", "store writable", "conditional writes", "store guarantees"), "OK"
    )


# --- verify on a store that proves nothing ----------------------------------------------------------


def cli(*args: str) -> tuple[int, str]:
    from click.testing import CliRunner

    from archiver.cli.base import main

    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


def test_verify_on_a_store_keeping_no_checksums_says_not_provable_and_deep_names_an_overwritten_object(
    seaweed_server: SeaweedServer, fake_service: FakeService, tmp_path: Path
) -> None:
    """Issue 28's user story: an intact archive on a checksum-less store verifies (exit 0) and
    says its objects are not provable by the store (exit 1 with --require-store-proof, unless
    --deep proves them by their bytes); one object replaced out of band is then named by
    `verify --deep` (exit 1)."""
    bucket = fresh_bucket(seaweed_server)
    with QuirkyS3Proxy(seaweed_server.endpoint, StoreQuirks(no_checksums=True)) as proxy:
        store = open_quirky_store(proxy, bucket)
        (sid,), _, finished = archive_sessions(fake_service, store, tmp_path / "state", [{"players": ["ann"]}])
        store.close()
        assert finished
        where = ["--store", f"s3://{bucket}/{PREFIX}", "--s3-endpoint-url", proxy.endpoint]
        code, out = cli("verify", sid, *where)
        assert (code, "2 object(s) not provable by the store" in out) == (0, True), out
        code, out = cli("verify", "--require-store-proof", sid, *where)
        assert (code, out.startswith("FAILED")) == (1, True), out
        assert cli("verify", "--deep", "--require-store-proof", sid, *where)[0] == 0
        (manifest,) = [m for m in archived_manifests(seaweed_server, bucket) if m.session_id == sid]
        artifact = next(i for i in manifest.items if i.kind == "artifact")
        assert artifact.key is not None
        direct_client(seaweed_server.endpoint).put_object(Bucket=bucket, Key=artifact.key, Body=b"not the replay")
        code, out = cli("verify", "--deep", sid, *where)
        assert code == 1 and artifact.key in out, out


def test_an_archive_whose_store_stops_keeping_checksums_is_not_provable_rather_than_a_mismatch(
    seaweed_server: SeaweedServer, fake_service: FakeService, tmp_path: Path
) -> None:
    """The manifest recorded the store's checksums; the store stops answering them (migrated to a
    gateway that keeps none): `verify` counts the objects as not provable, raises no alarm, and
    `--deep` still proves them by their bytes."""
    bucket = fresh_bucket(seaweed_server)
    with QuirkyS3Proxy(seaweed_server.endpoint) as proxy:
        store = open_quirky_store(proxy, bucket)
        (sid,), _, finished = archive_sessions(fake_service, store, tmp_path / "state", [{"players": ["ann"]}])
        assert finished
        (manifest,) = archived_manifests(seaweed_server, bucket)
        assert all(item.checksum_sha256 for item in manifest.items)
        proxy.quirks = StoreQuirks(no_checksums=True)
        now = fake_service.clock.now()
        quick = retrieve.verify(store, session_ids=[sid], now=now, deep=False)
        assert quick.ok and (quick.proved, quick.unproven) == (0, 2), [p.line() for p in quick.problems]
        deep = retrieve.verify(store, session_ids=[sid], now=now, deep=True)
        assert deep.ok and deep.objects == 2
        store.close()
