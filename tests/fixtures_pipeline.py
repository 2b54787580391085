"""Pipeline fixtures: one archiver wired like the daemon against the fake service and a store."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from archiver.archive.pipeline import Pipeline, Tuning
from archiver.archive.state import StateDB
from archiver.config.credentials import Token
from archiver.config.settings import Settings
from archiver.fake import FakeService
from archiver.live.engine import LiveCapture
from archiver.metrics.selfmetrics import SelfMetrics
from archiver.retry import RetryPolicy
from archiver.store import ObjectStore, open_store
from archiver.upstream.api import SessionHostClient

__all__ = ["FAST", "FAST_POLICY", "MB", "MISSING", "REPLAY", "SERVER_LOG", "TOKEN", "Harness", "harness_factory",
           "s3_store"]  # fmt: skip

TOKEN = "test-token"
REPLAY = "/srv/replays/match.replay"
SERVER_LOG = "/var/log/game/server.log"
MISSING = "/srv/does-not-exist"
MB = 1024 * 1024

#: Short loops for tests: the production defaults wait seconds to minutes between retries.
FAST = Tuning(
    not_found_confirm=0.2,
    finalize_backoff_initial=0.05,
    finalize_backoff_max=0.2,
    confirm_retry=0.1,
    confirm_recheck=0.2,
    fetch_backoff_initial=0.05,
    fetch_backoff_max=0.2,
    upload_backoff_initial=0.05,
    upload_backoff_max=0.2,
    permission_backoff=0.2,
    idle_wait=0.5,
)
FAST_POLICY = RetryPolicy(attempts=3, initial_wait=0.01, max_wait=0.05, max_elapsed=2.0)


@dataclass
class Harness:
    """One archiver wired like the daemon: fake upstream, a store, a state dir, a private registry."""

    fake: FakeService
    store: ObjectStore
    settings: Settings
    client: SessionHostClient
    state: StateDB
    registry: CollectorRegistry
    pipeline: Pipeline

    def poll(self) -> None:
        listing = self.client.list_sessions()
        present = {e.session_id for e in listing.invalid if e.session_id}
        self.pipeline.observe_poll(listing.sessions, self.fake.clock.now(), present_ids=present)

    def items_total(self, kind: str, outcome: str) -> float:
        value = self.registry.get_sample_value("archiver_items_total", {"kind": kind, "outcome": outcome})
        return value or 0.0

    def instance(self, sid: str) -> str:
        """The store-layout instance of the newest archive of `sid`."""
        row = self.state.latest(sid)
        assert row is not None, sid
        return row.instance

    def object_bytes(self, key: str) -> bytes:
        return b"".join(self.store.iter_bytes(key))

    def close(self) -> None:
        self.pipeline.stop(10.0)
        self.client.close()
        self.state.close()


@pytest.fixture
def harness_factory(tmp_path: Path) -> Iterator[Callable[..., Harness]]:
    made: list[Harness] = []

    def make(
        fake: FakeService,
        store: ObjectStore,
        *,
        start: bool = True,
        reconcile: bool = True,
        tuning: Tuning = FAST,
        live: LiveCapture | None = None,
        **overrides: Any,
    ) -> Harness:
        settings = Settings(
            state_dir=tmp_path / "state",
            artifact_paths=(REPLAY, MISSING),
            fetch_workers=2,
            upload_workers=2,
            retention=4 * 3600.0,
            deadline_margin=600.0,
        )
        settings = replace(settings, **overrides)
        client = SessionHostClient.connect(fake.base_url, Token(TOKEN), policy=FAST_POLICY)
        state = StateDB.open(settings.state_dir)
        registry = CollectorRegistry()
        pipeline = Pipeline(
            settings,
            client,
            store,
            state,
            SelfMetrics(registry),
            clock=fake.clock.now,
            policy=FAST_POLICY,
            tuning=tuning,
            live=live,
        )
        h = Harness(fake, store, settings, client, state, registry, pipeline)
        made.append(h)
        if start:
            pipeline.recover()
            pipeline.start(reconcile=reconcile)
        return h

    yield make
    for h in made:
        h.close()


@pytest.fixture
def s3_store(s3_bucket: tuple[str, str]) -> ObjectStore:
    endpoint, bucket = s3_bucket
    return open_store(f"s3://{bucket}/archive/", s3_endpoint_url=endpoint)
