"""One archive per session instance: a reused session id keeps every archive, and retrieval picks one.

Archives are stored with ``put_session`` (objects, create-once manifest, index entry, exactly as
``archiver/upload.py`` writes them) in both layouts: instance archives under
``sessions/{sid}/{instance}/`` and legacy archives under ``sessions/{sid}/``; one legacy archive
comes from the real pipeline. Every test runs against the directory store and moto's S3 server.
"""

from __future__ import annotations

import gzip
import io
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from archiver.errors import ArchiveIntegrityError, SessionNotArchivedError
from archiver.layout import keys
from archiver.layout.manifest import Manifest, ManifestItem, manifest_to_bytes
from archiver.retrieval import retrieve
from archiver.store import ObjectStore
from tests import fixtures_retrieval
from tests.support import HOSTILE_IDS, HOUR, NOW, delete, gzipped, overwrite, put_session, run_cli

# The stores and the pipeline archive of the retrieval tests (pytest finds fixtures by module name).
file_store = fixtures_retrieval.file_store
s3_store = fixtures_retrieval.s3_store
store = fixtures_retrieval.store
archive_from_fake = fixtures_retrieval.archive_from_fake

REUSED = "match-7"
OLD_CREATED = NOW - 6 * HOUR
NEW_CREATED = NOW - HOUR + 0.25
OLD = keys.instance_name(OLD_CREATED * 1000)
NEW = keys.instance_name(NEW_CREATED * 1000)
REPLAY = "/srv/replays/match.replay"


def _archive_reused(store: ObjectStore) -> tuple[Manifest, Manifest, Manifest]:
    """Two sessions that share the id `match-7` (old and new instance) and a legacy archive of `old-style`."""
    old = put_session(
        store, REUSED, ended_at=OLD_CREATED + 1800, created=OLD_CREATED, instance=OLD,
        logs=b"old match started\nold match over\n", artifacts={REPLAY: b"old replay bytes"},
    )  # fmt: skip
    new = put_session(
        store, REUSED, ended_at=NEW_CREATED + 1800, created=NEW_CREATED, instance=NEW,
        logs=b"new match started\nnew match over\n", artifacts={REPLAY: b"new replay bytes, longer"},
    )  # fmt: skip
    legacy = put_session(store, "old-style", ended_at=NOW - 2 * HOUR, logs=b"legacy line\n")
    return old, new, legacy


@pytest.fixture
def reused(store: ObjectStore) -> ObjectStore:
    _archive_reused(store)
    return store


def test_instance_names_of_the_fixture_sort_chronologically() -> None:
    assert OLD < NEW and NEW.endswith(".250Z")


# --- finding archives -------------------------------------------------------------------------


def test_find_archives_lists_every_committed_archive_newest_first(reused: ObjectStore) -> None:
    """Instances newest first; the legacy archive by itself; an archive without its manifest is not one."""
    assert retrieve.find_archives(reused, REUSED) == [
        retrieve.ArchiveRef(NEW, keys.manifest_key(reused.prefix, REUSED, NEW)),
        retrieve.ArchiveRef(OLD, keys.manifest_key(reused.prefix, REUSED, OLD)),
    ]
    assert retrieve.find_archives(reused, "old-style") == [
        retrieve.ArchiveRef(None, keys.manifest_key(reused.prefix, "old-style"))
    ]
    assert [r.name for r in retrieve.find_archives(reused, "old-style")] == ["legacy"]
    # Objects of a third instance still being written (no manifest yet): not an archive.
    pending = keys.instance_name(NOW * 1000)
    reused.put_bytes(keys.logs_key(reused.prefix, REUSED, "txt", pending), gzipped(b"x\n"), content_type="x")
    assert [r.name for r in retrieve.find_archives(reused, REUSED)] == [NEW, OLD]
    assert retrieve.find_archives(reused, "never-archived") == []
    # `match-7` is not a prefix match for `match-70`.
    put_session(reused, "match-70", ended_at=NOW - 60)
    assert [r.name for r in retrieve.find_archives(reused, REUSED)] == [NEW, OLD]


def test_a_legacy_archive_sorts_among_instances_by_its_creation_time(store: ObjectStore) -> None:
    """Legacy + instances of one id: the legacy manifest's `created` places it (newest first)."""
    before, after = keys.instance_name((NOW - 5 * HOUR) * 1000), keys.instance_name((NOW - HOUR) * 1000)
    put_session(store, "mixed", ended_at=NOW - 5 * HOUR + 60, created=NOW - 5 * HOUR, instance=before)
    put_session(store, "mixed", ended_at=NOW - 3 * HOUR + 60, created=NOW - 3 * HOUR)  # legacy layout
    put_session(store, "mixed", ended_at=NOW - HOUR + 60, created=NOW - HOUR, instance=after)
    assert [r.name for r in retrieve.find_archives(store, "mixed")] == [after, "legacy", before]


# --- ls ---------------------------------------------------------------------------------------


def test_ls_lists_each_instance_as_its_own_row_with_its_instance_in_json(reused: ObjectStore) -> None:
    entries = retrieve.list_sessions(reused, since=NOW - 12 * HOUR, until=NOW, now=NOW)
    assert [(e.session_id, e.instance) for e in entries] == [
        (REUSED, NEW),
        ("old-style", None),
        (REUSED, OLD),
    ]
    out = io.StringIO()
    retrieve.render_sessions(entries, out, fmt="json")
    doc = json.loads(out.getvalue())
    assert [(d["session_id"], d["instance"]) for d in doc] == [(REUSED, NEW), ("old-style", None), (REUSED, OLD)]
    assert doc[0]["manifest_key"] == keys.manifest_key(reused.prefix, REUSED, NEW)
    out = io.StringIO()
    retrieve.render_sessions(entries, out)
    rows = out.getvalue().splitlines()[1:]
    assert [row.split()[2] for row in rows] == [REUSED, "old-style", REUSED]


# --- show / logs / get ------------------------------------------------------------------------


def test_show_picks_the_newest_archive_and_notes_the_others(reused: ObjectStore) -> None:
    notes: list[str] = []
    out = io.StringIO()
    shown = retrieve.show_session(reused, REUSED, out, note=notes.append)
    assert shown.instance == NEW
    assert f"Instance          {NEW}\n" in out.getvalue()
    assert notes == [f"session {REUSED} has 2 archives ({NEW}, {OLD}); showing the newest; pick one with --instance"]

    notes.clear()
    out = io.StringIO()
    assert retrieve.show_session(reused, REUSED, out, instance=OLD, note=notes.append).instance == OLD
    assert f"Instance          {OLD}\n" in out.getvalue() and not notes

    out = io.StringIO()
    legacy = retrieve.show_session(reused, "old-style", out, fmt="json", note=notes.append)
    assert out.getvalue().encode() == manifest_to_bytes(legacy) and not notes
    assert "Instance" not in out.getvalue()
    assert retrieve.show_session(reused, "old-style", io.StringIO(), instance="legacy").session_id == "old-style"


@pytest.mark.parametrize("asked", ["nosuch", "legacy", "20261122T060305.123Z", "../../x", "\x1b[31m"])
def test_an_archive_that_does_not_exist_is_a_one_line_error_naming_the_ones_that_do(
    reused: ObjectStore, asked: str
) -> None:
    with pytest.raises(SessionNotArchivedError) as info:
        retrieve.show_session(reused, REUSED, io.StringIO(), instance=asked)
    message = str(info.value)
    assert f"its archives: {NEW}, {OLD}" in message
    assert "\n" not in message and "\x1b" not in message


def test_logs_of_either_instance_and_of_a_legacy_archive(reused: ObjectStore) -> None:
    out = io.StringIO()
    retrieve.print_logs(reused, REUSED, out, note=lambda _m: None)
    assert out.getvalue() == "new match started\nnew match over\n"
    out = io.StringIO()
    retrieve.print_logs(reused, REUSED, out, instance=OLD)
    assert out.getvalue() == "old match started\nold match over\n"
    out = io.StringIO()
    retrieve.print_logs(reused, "old-style", out)
    assert out.getvalue() == "legacy line\n"


def test_get_downloads_each_instance_into_its_own_directory(reused: ObjectStore, tmp_path: Path) -> None:
    """`{sid}.{instance}/` per instance, `{sid}/` for the legacy archive: nothing overwrites anything."""
    tmp_path = tmp_path / "downloads"
    new = retrieve.download_session(reused, REUSED, tmp_path, extract=True, note=lambda _m: None)
    old = retrieve.download_session(reused, REUSED, tmp_path, extract=True, instance=OLD)
    legacy = retrieve.download_session(reused, "old-style", tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["old-style", f"{REUSED}.{NEW}", f"{REUSED}.{OLD}"])
    assert (new.directory, old.directory, legacy.directory) == (
        tmp_path / f"{REUSED}.{NEW}",
        tmp_path / f"{REUSED}.{OLD}",
        tmp_path / "old-style",
    )
    replay = keys.artifact_name(REPLAY)
    assert (new.directory / "artifacts" / replay).read_bytes() == b"new replay bytes, longer"
    assert (old.directory / "artifacts" / replay).read_bytes() == b"old replay bytes"
    assert (new.directory / "logs.txt").read_text() == "new match started\nnew match over\n"
    assert (old.directory / "logs.txt").read_text() == "old match started\nold match over\n"
    assert json.loads((old.directory / "manifest.json").read_bytes())["instance"] == OLD
    assert (legacy.directory / "logs.txt.gz").is_file()


def test_hostile_ids_with_instances_stay_inside_their_prefix_and_directory(store: ObjectStore, tmp_path: Path) -> None:
    downloads = tmp_path / "downloads"
    for n, sid in enumerate(HOSTILE_IDS):
        created = NOW - 5 * HOUR + n
        put_session(store, sid, ended_at=created + 60, created=created, instance=keys.instance_name(created * 1000))
        put_session(store, sid, ended_at=created + 120, created=created + 60, logs=f"line {n}\n".encode())
    for n, sid in enumerate(HOSTILE_IDS):
        names = [r.name for r in retrieve.find_archives(store, sid)]
        assert names == ["legacy", keys.instance_name((NOW - 5 * HOUR + n) * 1000)]
        notes: list[str] = []
        out = io.StringIO()
        retrieve.print_logs(store, sid, out, escape=False, note=notes.append)
        assert out.getvalue() == f"line {n}\n"
        assert len(notes) == 1 and "\x1b" not in notes[0] and "\u202e" not in notes[0]
        result = retrieve.download_session(store, sid, downloads, instance=names[1])
        assert result.directory.parent == downloads
        assert result.directory.name == f"{keys.escape_session_id(sid)}.{names[1]}"
    assert not (tmp_path / "etc").exists() and not (downloads.parent / "b").exists()


# --- item keys never cross archives --------------------------------------------------------------


def _steal(store: ObjectStore, victim_key: str, victim: ManifestItem, instance: str | None) -> None:
    """An archive of `thief` whose logs item names someone else's key."""
    put_session(
        store, "thief", ended_at=NOW - 60, logs=None, instance=instance,
        extra_items=[ManifestItem(
            kind="logs", source="x", outcome="archived", key=victim_key, size=victim.size,
            sha256=victim.sha256, content_type="application/gzip",
        )],
    )  # fmt: skip


@pytest.mark.parametrize(
    "steer",
    [
        "other instance of the id",
        "legacy key in an instance manifest",
        "instance key in a legacy manifest",
    ],
)
def test_a_manifest_cannot_steer_a_read_into_another_archive(store: ObjectStore, tmp_path: Path, steer: str) -> None:
    """The instance segment of an item key must be the archive's own; anything else is refused, not read."""
    mine = keys.instance_name((NOW - 120) * 1000)
    other = keys.instance_name((NOW - 7200) * 1000)
    victim = put_session(store, "thief", ended_at=NOW - 7000, created=NOW - 7200, instance=other).items[0]
    if steer == "other instance of the id":
        key, instance = keys.logs_key(store.prefix, "thief", "txt", other), mine
    elif steer == "legacy key in an instance manifest":
        key, instance = keys.logs_key(store.prefix, "thief", "txt"), mine
        store.put_bytes(key, gzipped(b"boot\nmatch over\n"), content_type="application/gzip")
    else:
        key, instance = keys.logs_key(store.prefix, "thief", "txt", other), None
    _steal(store, key, victim, instance)
    name = instance or "legacy"
    with pytest.raises(ArchiveIntegrityError, match="unexpected key"):
        retrieve.print_logs(store, "thief", io.StringIO(), instance=name)
    with pytest.raises(ArchiveIntegrityError, match="unexpected key"):
        retrieve.download_session(store, "thief", tmp_path, instance=name)
    report = retrieve.verify(store, session_ids=["thief"], instance=name, now=NOW)
    assert [p.kind for p in report.problems] == ["unexpected_key"]


# --- verify -----------------------------------------------------------------------------------


def test_verify_checks_every_archive_of_an_id_or_the_named_one(reused: ObjectStore) -> None:
    report = retrieve.verify(reused, session_ids=[REUSED, "old-style"], now=NOW)
    assert report.ok, report.problems
    assert (report.sessions, report.objects) == (3, 5)  # logs + replay of each instance, logs of the legacy one

    art = keys.artifact_key(reused.prefix, REUSED, REPLAY, OLD)
    overwrite(reused, art, b"forged")
    report = retrieve.verify(reused, session_ids=[REUSED], now=NOW)
    assert [(p.instance, p.kind, p.key) for p in report.problems] == [(OLD, "size_mismatch", art)]
    assert report.problems[0].line().startswith(f"{REUSED} ({OLD}): size_mismatch: {art}")
    assert retrieve.verify(reused, session_ids=[REUSED], instance=NEW, now=NOW).ok
    assert not retrieve.verify(reused, session_ids=[REUSED], instance=OLD, now=NOW).ok

    missing = retrieve.verify(reused, session_ids=[REUSED], instance="nosuch", now=NOW)
    assert [p.kind for p in missing.problems] == ["not_archived"]
    assert f"its archives: {NEW}, {OLD}" in missing.problems[0].detail


def test_verify_finds_a_missing_index_entry_of_an_instance(reused: ObjectStore) -> None:
    """The index entry checked is the instance's own `{sid}.{instance}.json`."""
    ikey = keys.index_key(reused.prefix, NEW_CREATED + 1800, REUSED, NEW)
    assert reused.head(ikey) is not None
    delete(reused, ikey)
    report = retrieve.verify(reused, session_ids=[REUSED], now=NOW)
    assert [(p.instance, p.kind, p.key) for p in report.problems] == [(NEW, "missing_index", ikey)]


def test_verify_since_covers_every_instance_from_the_index(reused: ObjectStore) -> None:
    logs_old = keys.logs_key(reused.prefix, REUSED, "txt", OLD)
    delete(reused, logs_old)
    report = retrieve.verify(reused, since=NOW - 12 * HOUR, until=NOW, now=NOW)
    assert report.sessions == 3 and report.objects == 4
    assert [(p.session_id, p.instance, p.kind, p.key) for p in report.problems] == [
        (REUSED, OLD, "missing_object", logs_old)
    ]


# --- a legacy archive of the real pipeline beside a new instance ---------------------------------


def test_a_pipeline_archive_goes_beside_an_older_legacy_archive_of_the_same_id(
    store: ObjectStore, archive_from_fake: Callable[..., Manifest], tmp_path: Path
) -> None:
    """The pipeline writes the instance layout; a legacy archive of the same id written by an older
    archiver is still shown, read, downloaded and verified by name, and the newer one is the default."""
    current = archive_from_fake(shape="text")
    sid = current.session_id
    assert current.created is not None and current.instance == keys.instance_name(current.created * 1000 + 1e-3)
    earlier = current.created - 3 * HOUR
    legacy = put_session(store, sid, ended_at=earlier + 600, created=earlier, logs=b"first session\n")
    assert [r.name for r in retrieve.find_archives(store, sid)] == [current.instance, "legacy"]

    out = io.StringIO()
    assert retrieve.show_session(store, sid, out, fmt="json", note=lambda _m: None).instance == current.instance
    out = io.StringIO()
    assert retrieve.show_session(store, sid, out, instance="legacy", fmt="json").instance is None
    assert out.getvalue().encode() == manifest_to_bytes(legacy)
    result = retrieve.download_session(store, sid, tmp_path, instance="legacy")
    assert result.directory == tmp_path / keys.escape_session_id(sid)
    assert gzip.decompress((result.directory / "logs.txt.gz").read_bytes()) == b"first session\n"
    report = retrieve.verify(store, session_ids=[sid], now=NOW)
    assert report.ok and report.sessions == 2, report.problems


# --- the commands -----------------------------------------------------------------------------


def test_the_commands_pick_an_archive_with_instance(reused: ObjectStore, tmp_path: Path) -> None:
    """ls shows both rows (instance in JSON), show/logs/get take the newest with a note or --instance, verify all."""
    since = ["--since", "2026-11-22T00:00", "--until", "2026-11-23T00:00"]
    ls = run_cli(reused, ["ls", *since, "--format", "json"])
    assert ls.exit_code == 0, ls.stderr
    assert [(d["session_id"], d["instance"]) for d in json.loads(ls.stdout)] == [
        (REUSED, NEW),
        ("old-style", None),
        (REUSED, OLD),
    ]
    table = run_cli(reused, ["ls", *since])
    assert [line.split()[2] for line in table.stdout.splitlines()[1:]] == [REUSED, "old-style", REUSED]

    show = run_cli(reused, ["show", REUSED])
    assert show.exit_code == 0 and f"Instance          {NEW}" in show.stdout
    assert show.stderr == (
        f"note: session {REUSED} has 2 archives ({NEW}, {OLD}); showing the newest; pick one with --instance\n"
    )
    show_old = run_cli(reused, ["show", REUSED, "--instance", OLD])
    assert show_old.exit_code == 0 and f"Instance          {OLD}" in show_old.stdout and show_old.stderr == ""

    logs_old = run_cli(reused, ["logs", REUSED, "--instance", OLD])
    assert logs_old.stdout == "old match started\nold match over\n" and logs_old.exit_code == 0
    logs_new = run_cli(reused, ["logs", REUSED, "--grep", "over"])
    assert logs_new.stdout == "new match over\n" and "has 2 archives" in logs_new.stderr
    assert run_cli(reused, ["logs", "old-style"]).stdout == "legacy line\n"

    out = tmp_path / "out"
    for args in (["get", REUSED], ["get", REUSED, "--instance", OLD], ["get", "old-style", "--instance", "legacy"]):
        got = run_cli(reused, [*args, "--out", str(out), "--no-progress"])
        assert got.exit_code == 0 and "sha256 verified" in got.stdout, got.stderr
    assert sorted(p.name for p in out.iterdir()) == sorted([f"{REUSED}.{NEW}", f"{REUSED}.{OLD}", "old-style"])

    verified = run_cli(reused, ["verify", REUSED, "old-style"])
    assert verified.exit_code == 0 and verified.stdout.startswith("OK: 3 session(s), 5 object(s)")
    assert run_cli(reused, ["verify", REUSED, "--instance", OLD]).stdout.startswith("OK: 1 session(s), 2 object(s)")
    verified_since = run_cli(reused, ["verify", *since])
    assert verified_since.exit_code == 0 and verified_since.stdout.startswith("OK: 3 session(s)")


@pytest.mark.parametrize("command", ["show", "logs", "get"])
def test_a_wrong_instance_is_a_clear_error_listing_the_instances(
    reused: ObjectStore, command: str, tmp_path: Path
) -> None:
    tmp_path = tmp_path / "downloads"
    tmp_path.mkdir()
    result = run_cli(
        reused, [command, REUSED, "--instance", "nosuch", *(["--out", str(tmp_path)] if command == "get" else [])]
    )
    assert result.exit_code == 1 and result.stdout == ""
    assert result.stderr == f"error: session {REUSED} has no archive 'nosuch'; its archives: {NEW}, {OLD}\n"
    assert list(tmp_path.iterdir()) == []


def test_verify_with_a_wrong_instance_or_without_ids_fails_clearly(reused: ObjectStore) -> None:
    wrong = run_cli(reused, ["verify", REUSED, "--instance", "nosuch"])
    assert wrong.exit_code == 1 and wrong.stdout.splitlines()[-1].startswith("FAILED: 1 session(s)")
    assert f"its archives: {NEW}, {OLD}" in wrong.stdout
    usage = run_cli(reused, ["verify", "--since", "2h", "--instance", OLD])
    assert usage.exit_code == 2 and "--instance" in usage.stderr


def test_show_and_verify_follow_the_one_format_convention(reused: ObjectStore) -> None:
    """`--format table` is show's readable output (`text` still accepted); verify reports as JSON too."""
    table = run_cli(reused, ["show", REUSED, "--instance", OLD, "--format", "table"])
    assert table.exit_code == 0 and f"Instance          {OLD}" in table.stdout
    assert run_cli(reused, ["show", REUSED, "--instance", OLD, "--format", "text"]).stdout == table.stdout
    verified = run_cli(reused, ["verify", REUSED, "old-style", "--format", "json"])
    document = json.loads(verified.stdout)
    assert verified.exit_code == 0 and document == {"ok": True, "sessions": 3, "objects": 5,
                                                    "bytes": document["bytes"], "problems": [],
                                                    "proved": document["proved"], "unproven": 0}  # fmt: skip
    # A directory re-hashes the objects; S3 proves them by the SHA-256 checksum it keeps.
    assert (document["bytes"] > 0, document["proved"]) in ((True, 0), (False, 5))
    wrong = run_cli(reused, ["verify", REUSED, "--instance", "nosuch", "--format", "json"])
    (problem,) = json.loads(wrong.stdout)["problems"]
    assert wrong.exit_code == 1 and problem["session_id"] == REUSED and "nosuch" in problem["detail"]
