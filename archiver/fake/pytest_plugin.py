"""pytest fixtures of the fake service for users' CI: ``pytest_plugins = ["archiver.fake.pytest_plugin"]``."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from archiver.fake import FakeService

#: The token of the default ``fake_service`` organisation.
TEST_TOKEN = "test-token"


@pytest.fixture
def fake_service() -> Iterator[FakeService]:
    """A started FakeService on 127.0.0.1 (free port) with one organisation, ``test-token``;
    stopped cleanly (connections closed, threads joined) after the test."""
    with FakeService((TEST_TOKEN,)) as svc:
        yield svc


@pytest.fixture
def fake_service_factory() -> Iterator[Callable[..., FakeService]]:
    """Call with FakeService's arguments (tokens, clock, retention, capacity, quirks, ...) to get
    more started services; all are stopped after the test."""
    started: list[FakeService] = []

    def make(*args: Any, **kwargs: Any) -> FakeService:
        svc = FakeService(*args, **kwargs).start()
        started.append(svc)
        return svc

    yield make
    for svc in reversed(started):
        svc.stop()
