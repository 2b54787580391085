"""`archiver ls` and `show` tell a configured path that simply was not in the container from lost
evidence, by the one decision the browser uses too (`vocabulary.standing`)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from archiver.browse import views
from archiver.layout.manifest import ManifestItem
from archiver.store import open_store
from archiver.vocabulary import OUTCOMES, Standing, standing
from tests.support import ARCHIVER, NOW, put_session


def _absent(path: str) -> ManifestItem:
    return ManifestItem(kind="artifact", source=f"GET /artifacts?path={path}", outcome="source_gone", path=path)


def _expired(path: str) -> ManifestItem:
    return ManifestItem(kind="artifact", source=f"GET /artifacts?path={path}", outcome="expired", path=path, error="x")


@pytest.fixture
def archive(tmp_path: Path) -> Path:
    root = tmp_path / "archive"
    root.mkdir()
    store = open_store(root.as_uri())
    # No crash folder in a match that did not crash: nothing lost.
    put_session(store, "s-calm", ended_at=NOW - 60, artifacts={"/srv/replays/r.dem": b"demo"},
                extra_items=[_absent("/srv/crash")])  # fmt: skip
    # The deadline passed before a path was fetched: evidence lost, beside an absent one.
    put_session(store, "s-late", ended_at=NOW - 120, extra_items=[_absent("/srv/crash"), _expired("/srv/replays")])
    # The service no longer had the logs: lost evidence, though the outcome is source_gone too.
    put_session(
        store, "s-nologs", ended_at=NOW - 180, logs=None,
        extra_items=[ManifestItem(kind="logs", source="GET /logs", outcome="source_gone", error="404")],
    )  # fmt: skip
    store.close()
    return root


def _run(*args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ARCHIVER_")}
    result = subprocess.run([ARCHIVER, *args], env=env, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    return result.stdout


def test_ls_table_marks_lost_evidence_and_only_notes_absent_paths(archive: Path) -> None:
    rows = {
        line.split()[2]: line for line in _run("ls", "--store", archive.as_uri(), "--since", "30d").splitlines()[1:]
    }
    assert "2/3 (1 not present)" in rows["s-calm"] and "!" not in rows["s-calm"]
    assert "1/3 !expired (1 not present)" in rows["s-late"]
    assert "!source_gone" not in rows["s-late"]


def test_ls_json_counts_lost_and_absent_items_apart(archive: Path) -> None:
    doc = {
        d["session_id"]: d
        for d in json.loads(_run("ls", "--store", archive.as_uri(), "--since", "30d", "--format", "json"))
    }
    assert (doc["s-calm"]["items_lost"], doc["s-calm"]["items_not_present"]) == (0, 1)
    assert (doc["s-late"]["items_lost"], doc["s-late"]["items_not_present"]) == (1, 1)
    assert doc["s-late"]["counts"] == {"archived": 1, "source_gone": 1, "expired": 1}
    # The index entry does not say an item's kind: source_gone there reads as an absent path (as in
    # the browser's list); `show` tells the lost logs apart (below).
    assert (doc["s-nologs"]["items_lost"], doc["s-nologs"]["items_not_present"]) == (0, 1)


def test_show_says_what_each_outcome_means(archive: Path) -> None:
    calm = _run("show", "s-calm", "--store", archive.as_uri())
    assert "meaning      not present in this container: an optional path, no evidence lost" in calm
    assert "meaning      evidence lost" not in calm
    late = _run("show", "s-late", "--store", archive.as_uri())
    assert late.count("meaning      evidence lost") == 1
    nologs = _run("show", "s-nologs", "--store", archive.as_uri())
    assert "meaning      evidence lost" in nologs and "not present" not in nologs


def test_the_browser_and_the_cli_read_every_outcome_alike() -> None:
    """The browser's classes and words come from the same decision as `ls` and `show`."""
    css = {Standing.KEPT: views.KEPT, Standing.ABSENT: views.EXPECTED, Standing.POLICY: views.POLICY,
           Standing.LOST: views.LOST}  # fmt: skip
    for outcome in OUTCOMES:
        for kind in ("logs", "artifact"):
            stored = {"key": "k", "size": 1, "sha256": "0" * 64, "content_type": "text/plain"}
            item = ManifestItem(kind=kind, source="GET /x", outcome=outcome, path="/p" if kind == "artifact" else None,
                                **(stored if outcome == "archived" else {}))  # type: ignore[arg-type]  # fmt: skip
            assert views.item_outcome(item).css == css[standing(outcome, kind)], (outcome, kind)
    assert standing("source_gone", "artifact") is Standing.ABSENT
    assert standing("source_gone", "logs") is Standing.LOST
    assert standing("source_gone") is Standing.ABSENT  # an index entry: the kind unknown
    assert standing("too_large", "artifact") is Standing.POLICY
