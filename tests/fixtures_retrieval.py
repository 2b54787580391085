"""Retrieval fixtures: the stores archives are read back from, a real pipeline archive, a tmpfs dir.

Not registered in conftest: its `s3_store` and parametrized `store` would replace, for every test
module, the `s3_store` of fixtures_pipeline. A module that wants them binds them by name
(``store = fixtures_retrieval.store``): pytest finds fixtures by module attribute.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from archiver.archive.pipeline import Pipeline
from archiver.archive.state import StateDB
from archiver.config.credentials import Token
from archiver.config.settings import Settings
from archiver.fake import FakeService
from archiver.layout import keys
from archiver.layout.manifest import Manifest, parse_manifest
from archiver.metrics.selfmetrics import SelfMetrics
from archiver.store import ObjectStore, open_store
from archiver.upstream.api import SessionHostClient
from tests.fixtures_fake import TEST_TOKEN
from tests.fixtures_pipeline import FAST, FAST_POLICY
from tests.support import ARTIFACT_PATHS


@pytest.fixture
def file_store(tmp_path: Path) -> Iterator[ObjectStore]:
    root = tmp_path / "archive"
    root.mkdir()
    store = open_store(root.as_uri())
    yield store
    store.close()


@pytest.fixture
def s3_store(s3_bucket: tuple[str, str], s3_client: Callable[..., Any]) -> Iterator[ObjectStore]:
    _endpoint, bucket = s3_bucket
    store = open_store(f"s3://{bucket}/archive/", s3_client=s3_client())
    yield store
    store.close()


@pytest.fixture(params=["file", "s3"])
def store(request: pytest.FixtureRequest) -> ObjectStore:
    """The same test against the directory store and the S3 store (moto server)."""
    result: ObjectStore = request.getfixturevalue(f"{request.param}_store")
    return result


@pytest.fixture
def archive_from_fake(
    fake_service: FakeService, store: ObjectStore, tmp_path: Path
) -> Iterator[Callable[..., Manifest]]:
    """Archive fake sessions with the real pipeline (poll, end, confirm, fetch, upload, manifest, index).

    ``archive(shape="text"|"ndjson"|"legacy", labels=...)`` starts a session on the fake service,
    ends it, lets the pipeline archive it into ``store`` and returns the stored manifest.
    """
    settings = Settings(state_dir=tmp_path / "state", artifact_paths=ARTIFACT_PATHS, fetch_workers=2)
    client = SessionHostClient.connect(fake_service.base_url, Token(TEST_TOKEN), policy=FAST_POLICY)
    state = StateDB.open(settings.state_dir)
    pipeline = Pipeline(
        settings,
        client,
        store,
        state,
        SelfMetrics(CollectorRegistry()),
        clock=fake_service.clock.now,
        policy=FAST_POLICY,
        tuning=FAST,
    )
    pipeline.recover()
    pipeline.start()

    def archive(*, shape: str = "text", labels: Mapping[str, str] | None = None) -> Manifest:
        fake_service.set_quirks(query_log_shape=shape)
        sid = fake_service.add_session(TEST_TOKEN, labels=dict(labels or {}), players=["ann", "bob"])
        pipeline.observe_poll(client.list_sessions().sessions, fake_service.clock.now())
        fake_service.end_session(TEST_TOKEN, sid)
        pipeline.observe_poll(client.list_sessions().sessions, fake_service.clock.now())
        assert pipeline.run_until_idle(30), "the pipeline did not archive the session in time"
        row = state.latest(sid)
        assert row is not None
        return parse_manifest(b"".join(store.iter_bytes(keys.manifest_key(store.prefix, sid, row.instance))))

    yield archive
    pipeline.stop(10.0)
    client.close()
    state.close()


@pytest.fixture
def memory_dir(tmp_path: Path) -> Iterator[Path]:
    """A directory in tmpfs where there is one: creating 10,000 files on a disk busy with other
    tests' fsyncs takes 4 to 20 s here, in memory well under one."""
    shm = Path("/dev/shm")
    if not (shm.is_dir() and os.access(shm, os.W_OK)):
        yield tmp_path
        return
    directory = Path(tempfile.mkdtemp(dir=shm, prefix="archiver-test-"))
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)
