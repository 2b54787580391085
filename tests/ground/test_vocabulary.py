"""The vocabulary's members are the very strings the state DB, manifests and index entries hold."""

from __future__ import annotations

import json

from archiver.layout.manifest import OUTCOMES
from archiver.vocabulary import ItemStatus, Outcome, SessionState


def test_stored_values_are_byte_identical_to_the_strings_written_before_the_enums() -> None:
    assert [s.value for s in SessionState] == [
        "active", "candidate", "ended", "finalizing", "archived", "failed", "skipped",
    ]  # fmt: skip
    assert [s.value for s in ItemStatus] == ["pending_fetch", "fetching", "spooled", "uploading", "done"]
    assert OUTCOMES == ("archived", "source_gone", "too_large", "expired", "conflict", "failed")
    assert json.dumps({"outcome": Outcome.TOO_LARGE}) == '{"outcome": "too_large"}'
    assert f"{ItemStatus.PENDING_FETCH}" == "pending_fetch" and Outcome.ARCHIVED == "archived"
