"""Disk writes per archived session (issue 35): a flood of endings shares its state DB commits across
sessions instead of paying a commit per session per transition, and its pages are small."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from pathlib import Path

from prometheus_client import CollectorRegistry

from archiver.archive.pipeline import Pipeline
from archiver.archive.state import PAGE_SIZE, StateDB
from archiver.config.credentials import Token
from archiver.config.settings import Settings
from archiver.fake import FakeService
from archiver.metrics.selfmetrics import SelfMetrics
from archiver.store import FileStore
from archiver.upstream.api import SessionHostClient
from tests.fixtures_pipeline import FAST, FAST_POLICY, TOKEN

SESSIONS = 60


class CountingStateDB(StateDB):
    """The real state DB, counting its committed write transactions (durable ones apart)."""

    def __init__(self, path: Path) -> None:
        self.commits = 0
        self.durable_commits = 0
        super().__init__(path)

    @contextlib.contextmanager
    def write(self, *, durable: bool = True) -> Iterator[sqlite3.Connection]:
        with super().write(durable=durable) as db:
            yield db
        self.commits += 1
        self.durable_commits += durable


def test_a_flood_of_endings_commits_the_state_db_a_few_times_per_batch_not_per_session(
    fake_service: FakeService, tmp_path: Path
) -> None:
    """Before grouping, every session paid an end, a spooled and an archived commit (durable, each
    a sync of the WAL) and two claims: over 3 durable and 5 in all per session (measured at e464cac:
    3.2 and 6.6). Ends, spooled marks and archived marks grouped, a batch of endings shares them."""
    ids = [fake_service.add_session(TOKEN, id=f"flood-{n:03d}") for n in range(SESSIONS)]
    settings = Settings(state_dir=tmp_path / "state", artifact_paths=(), fetch_workers=2, upload_workers=2)
    state = CountingStateDB(settings.state_dir / "state.db")
    client = SessionHostClient.connect(fake_service.base_url, Token(TOKEN), policy=FAST_POLICY)
    (tmp_path / "store").mkdir()
    store = FileStore(tmp_path / "store")
    pipeline = Pipeline(
        settings, client, store, state, SelfMetrics(CollectorRegistry()),
        clock=fake_service.clock.now, policy=FAST_POLICY, tuning=FAST,
    )  # fmt: skip
    try:
        pipeline.recover()

        def poll() -> None:
            listing = client.list_sessions()
            pipeline.observe_poll(listing.sessions, fake_service.clock.now(), present_ids=set())

        poll()
        pipeline.start(reconcile=False)
        for sid in ids:
            fake_service.end_session(TOKEN, sid)
        before, durable_before = state.commits, state.durable_commits
        poll()
        assert pipeline.run_until_idle(60)
        archived = [row for row in state.sessions_in("archived") if row.id in ids]
        assert len(archived) == SESSIONS
        commits = state.commits - before
        durable = state.durable_commits - durable_before
    finally:
        pipeline.stop(10.0)
        client.close()
        state.close()
    # Measured grouped: about 0.45 durable and 1.2 in all per session (upload claims take a few at once).
    assert durable / SESSIONS < 1.0, (commits, durable)
    assert commits / SESSIONS < 2.0, (commits, durable)


def test_a_new_state_db_has_small_pages_and_an_existing_one_keeps_its_own(tmp_path: Path) -> None:
    state = StateDB.open(tmp_path / "new")
    state.close()
    with contextlib.closing(sqlite3.connect(tmp_path / "new" / "state.db")) as db:
        assert db.execute("PRAGMA page_size").fetchone()[0] == PAGE_SIZE == 1024

    (tmp_path / "old").mkdir()
    with contextlib.closing(sqlite3.connect(tmp_path / "old" / "state.db")) as db:
        db.execute("PRAGMA page_size=4096")
        db.execute("PRAGMA journal_mode=WAL")
    old = StateDB.open(tmp_path / "old")  # an empty 4 KiB-page DB (as an earlier archiver made)
    old.close()
    with contextlib.closing(sqlite3.connect(tmp_path / "old" / "state.db")) as db:
        assert db.execute("PRAGMA page_size").fetchone()[0] == 4096
