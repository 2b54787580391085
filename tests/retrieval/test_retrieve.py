"""Retrieval (`ls/show/logs/get/verify`) against real stores (moto server, a directory) holding real archives.

Archives of fake-service sessions are made by the real pipeline (``archive_from_fake``). Tests
that need chosen end times, hostile ids, corrupt or malicious content, or thousands of sessions
write them with ``put_session``, which stores objects, manifest and index entry exactly as
``archiver/upload.py`` does (objects first, manifest create-once, then the index entry).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import pty
import re
import subprocess
import sys
import tarfile
import textwrap
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

import pytest

from archiver.errors import ArchiveIntegrityError, SessionNotArchivedError
from archiver.fake import FakeService
from archiver.layout import keys
from archiver.layout.manifest import (
    IndexEntry,
    Manifest,
    ManifestItem,
    index_entry_to_bytes,
    manifest_to_bytes,
)
from archiver.retrieval import retrieve
from archiver.store import ObjectStore
from tests import fixtures_retrieval
from tests.fixtures_fake import TEST_TOKEN
from tests.support import (
    HOSTILE_IDS,
    HOUR,
    NOW,
    ClosedPipe,
    delete,
    gzipped,
    overwrite,
    put_session,
)

# The stores and the pipeline archive of the retrieval tests (pytest finds fixtures by module name).
file_store = fixtures_retrieval.file_store
s3_store = fixtures_retrieval.s3_store
store = fixtures_retrieval.store
archive_from_fake = fixtures_retrieval.archive_from_fake


# --- input parsing ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2h", NOW - 2 * HOUR),
        ("30m", NOW - 1800),
        ("7d", NOW - 7 * 86400),
        ("1h30m", NOW - 5400),
        ("now", NOW),
        ("2026-11-22T10:00", datetime(2026, 11, 22, 10, tzinfo=UTC).timestamp()),
        ("2026-11-22T10:00Z", datetime(2026, 11, 22, 10, tzinfo=UTC).timestamp()),
        ("2026-11-22 10:00:05", datetime(2026, 11, 22, 10, 0, 5, tzinfo=UTC).timestamp()),
        ("2026-11-22T12:00+02:00", datetime(2026, 11, 22, 10, tzinfo=UTC).timestamp()),
        ("2026-11-22", datetime(2026, 11, 22, tzinfo=UTC).timestamp()),
    ],
)
def test_parse_time_accepts_durations_and_iso_times(text: str, expected: float) -> None:
    """Durations count back from now; ISO times without a zone are UTC."""
    assert retrieve.parse_time(text, NOW) == expected


@pytest.mark.parametrize("text", ["yesterday", "2h ago", "-5m", "2026-13-01T00:00", "2026-11-22T25:00", ""])
def test_parse_time_rejects_garbage_with_examples(text: str) -> None:
    """The message shows both accepted forms, so the user can fix the flag at once."""
    with pytest.raises(ValueError, match=r"2h|2026-11-22T10:00"):
        retrieve.parse_time(text, NOW)


def test_time_range_defaults_and_order() -> None:
    """Since defaults to 24 h back, until to open-ended; since after until is refused."""
    assert retrieve.parse_time_range(None, None, NOW) == (NOW - 24 * HOUR, None)
    with pytest.raises(ValueError, match="after --until"):
        retrieve.parse_time_range("1h", "2h", NOW)


def test_label_and_grep_parsing() -> None:
    assert retrieve.parse_label("tournament=spring=2026") == ("tournament", "spring=2026")
    for bad in ("novalue", "=x"):
        with pytest.raises(ValueError, match="KEY=VALUE"):
            retrieve.parse_label(bad)
    with pytest.raises(ValueError, match="not a valid regular expression"):
        retrieve.compile_grep("(unclosed")
    assert retrieve.compile_grep("ERROR", ignore_case=True).matches("an error here")


@pytest.mark.parametrize("text", HOSTILE_IDS)
def test_printable_never_lets_control_or_format_characters_through(text: str) -> None:
    """Nothing a terminal would interpret (ESC, CR, BEL, bidi overrides, lone surrogates) survives."""
    shown = retrieve.printable(text)
    assert all(ch.isprintable() for ch in shown)
    shown.encode("utf-8")  # never raises: surrogates are escaped
    if text.isprintable() and "\\" not in text:
        assert shown == text


# --- ls ---------------------------------------------------------------------------------------


@pytest.fixture
def listed(store: ObjectStore) -> ObjectStore:
    """Six sessions over two days with different images, locations and labels."""
    put_session(store, "s-now", ended_at=NOW - 60, labels={"tournament": "spring", "mode": "duel"})
    put_session(store, "s-1h", ended_at=NOW - HOUR, image="other-game", tag="2.0", location="us-east-1")
    put_session(store, "s-3h", ended_at=NOW - 3 * HOUR, labels={"tournament": "spring"})
    put_session(store, "s-20h", ended_at=NOW - 20 * HOUR, tag="1.0.0", location="ap-southeast-1")
    put_session(
        store,
        "s-30h",
        ended_at=NOW - 30 * HOUR,
        extra_items=[
            ManifestItem(kind="artifact", source="GET /artifacts", outcome="too_large", path="/big", error="x")
        ],
    )
    put_session(store, "s-future", ended_at=NOW + 120)  # a writer whose clock runs ahead
    return store


def _ids(entries: Sequence[IndexEntry]) -> list[str]:
    return [e.session_id for e in entries]


def test_ls_filters_and_orders_newest_first(listed: ObjectStore) -> None:
    """Default 24 h, --since/--until, --image NAME and NAME:TAG, --location, --label, --limit."""
    ls = retrieve.list_sessions
    assert _ids(ls(listed, now=NOW)) == ["s-future", "s-now", "s-1h", "s-3h", "s-20h"]
    assert _ids(ls(listed, since=NOW - 2 * HOUR, now=NOW)) == ["s-future", "s-now", "s-1h"]
    assert _ids(ls(listed, since=NOW - 48 * HOUR, until=NOW - 2 * HOUR, now=NOW)) == [
        "s-3h",
        "s-20h",
        "s-30h",
    ]
    assert _ids(ls(listed, image="other-game", now=NOW)) == ["s-1h"]
    assert _ids(ls(listed, image="demo-game:1.0.0", now=NOW)) == ["s-20h"]
    assert _ids(ls(listed, location="us-east-1", now=NOW)) == ["s-1h"]
    assert _ids(ls(listed, labels={"tournament": "spring"}, now=NOW)) == ["s-now", "s-3h"]
    assert _ids(ls(listed, labels={"tournament": "spring", "mode": "duel"}, now=NOW)) == ["s-now"]
    assert _ids(ls(listed, labels={"tournament": "autumn"}, now=NOW)) == []
    assert _ids(ls(listed, since=NOW - 48 * HOUR, limit=2, now=NOW)) == ["s-future", "s-now"]


def test_ls_table_and_json_output(listed: ObjectStore) -> None:
    """The table has the documented columns and flags non-archived items; JSON is one array, stable fields."""
    entries = retrieve.list_sessions(listed, since=NOW - 48 * HOUR, until=NOW, now=NOW)
    out = io.StringIO()
    retrieve.render_sessions(entries, out)
    lines = out.getvalue().splitlines()
    assert lines[0].split() == [
        "ENDED",
        "(UTC)",
        "SESSION",
        "IMAGE:TAG",
        "LOCATION",
        "ITEMS",
        "SIZE",
        "LABELS",
    ]
    row = {line.split()[2]: line for line in lines[1:]}
    assert row["s-now"].startswith("2026-11-22 12:29:00  s-now")
    assert "mode=duel,tournament=spring" in row["s-now"]
    assert re.search(r"\b1/1\b", row["s-now"])
    assert "1/2 !too_large" in row["s-30h"]
    assert "other-game:2.0" in row["s-1h"] and "us-east-1" in row["s-1h"]

    out = io.StringIO()
    retrieve.render_sessions(entries, out, fmt="json")
    doc = json.loads(out.getvalue())
    assert [d["session_id"] for d in doc] == _ids(entries)
    assert set(doc[0]) == {
        "session_id", "ended_at", "ended_at_iso", "archived_at", "archived_at_iso", "image", "tag",
        "location", "labels", "items_archived", "items_total", "items_lost", "items_not_present", "counts",
        "total_bytes", "manifest_key", "instance",
    }  # fmt: skip
    assert doc[0]["instance"] is None  # legacy-layout archives have no instance
    s30 = next(d for d in doc if d["session_id"] == "s-30h")
    assert (s30["items_archived"], s30["items_total"], s30["counts"]) == (
        1,
        2,
        {"archived": 1, "too_large": 1},
    )
    assert s30["ended_at_iso"] == "2026-11-21T06:30:00.000Z"

    out = io.StringIO()
    retrieve.render_sessions([], out)
    assert out.getvalue() == "no archived sessions match\n"


def test_ls_lists_only_the_hour_partitions_it_needs(listed: ObjectStore) -> None:
    """`--since 2h` lists 3 hour partitions (never the bucket) and reads only entries found there."""
    listed.requests_made.reset()
    entries = retrieve.list_sessions(listed, since=NOW - 2 * HOUR, until=NOW, now=NOW)
    assert _ids(entries) == ["s-now", "s-1h"]
    counts = listed.requests_made.snapshot()
    # 10:xx, 11:xx, 12:xx, and the day's columnar index parts (day, hourly): none compacted here.
    assert counts.get("ListObjectsV2") == 3 + 2
    # The three entries in those hours: s-now, s-1h, and s-future (read, then outside --until).
    assert counts.get("GetObject") == 3
    assert set(counts) <= {"ListObjectsV2", "GetObject"}


def test_ls_skips_an_unreadable_index_entry_with_a_warning(store: ObjectStore) -> None:
    """One corrupt entry is reported and skipped; the others are still listed."""
    put_session(store, "good", ended_at=NOW - 60)
    store.put_bytes(keys.index_key(store.prefix, NOW - 120, "bad"), b"{not json", content_type="application/json")
    warnings: list[str] = []
    assert _ids(retrieve.list_sessions(store, now=NOW, warn=warnings.append)) == ["good"]
    assert len(warnings) == 1 and "bad.json" in warnings[0]


# --- hostile ids ------------------------------------------------------------------------------


def test_hostile_ids_list_show_read_and_download_safely(store: ObjectStore, tmp_path: Path) -> None:
    """Ids that look like paths, escapes or bidi tricks print escaped on one row and download inside DIR."""
    for n, sid in enumerate(HOSTILE_IDS):
        put_session(store, sid, ended_at=NOW - 60 * (n + 1), logs=f"hello from {n}\n".encode())
    entries = retrieve.list_sessions(store, now=NOW)
    assert sorted(_ids(entries)) == sorted(HOSTILE_IDS)

    out = io.StringIO()
    retrieve.render_sessions(entries, out)
    text = out.getvalue()
    assert len(text.splitlines()) == len(HOSTILE_IDS) + 1
    assert "\x1b" not in text and "\r" not in text and "\x07" not in text and "\u202e" not in text
    assert "\\x1b[31mred\\x1b[0m\\x0d\\x0a\\x07bell" in text
    assert "x" * 300 in text  # never truncated: it must stay copy-pastable

    out = io.StringIO()
    retrieve.render_sessions(entries, out, fmt="json")
    assert out.getvalue().isascii()
    assert sorted(d["session_id"] for d in json.loads(out.getvalue())) == sorted(HOSTILE_IDS)

    downloads = tmp_path / "downloads"
    for n, sid in enumerate(HOSTILE_IDS):
        shown = io.StringIO()
        retrieve.show_session(store, sid, shown)
        assert shown.getvalue().splitlines()[0] == f"Session           {retrieve.printable(sid)}"
        lines = io.StringIO()
        assert retrieve.print_logs(store, sid, lines, escape=False) == 1
        assert lines.getvalue() == f"hello from {n}\n"
        result = retrieve.download_session(store, sid, downloads)
        assert result.directory.parent == downloads
        assert result.directory.name == keys.escape_session_id(sid)
    # Everything landed in one directory per session right below DIR, nothing elsewhere.
    assert sorted(p.name for p in downloads.iterdir()) == sorted(keys.escape_session_id(s) for s in HOSTILE_IDS)
    assert not (tmp_path / "etc").exists() and not (downloads.parent / "b").exists()


# --- show -------------------------------------------------------------------------------------


def test_show_prints_the_manifest_readably_and_as_json(store: ObjectStore) -> None:
    """Metadata, end times, deadline, every item with outcome and error; --format json is the stored bytes."""
    m = put_session(
        store,
        "match-42",
        ended_at=NOW - HOUR,
        artifacts={"/srv/replays/match.replay": b"\x1f\x8breplay"},
        extra_items=[
            ManifestItem(
                kind="artifact",
                source="GET /artifacts?session=match-42&path=/srv/crash/core.txt",
                outcome="source_gone",
                path="/srv/crash/core.txt",
                error="GET /artifacts answered 404",
            )
        ],
        labels={"tournament": "spring"},
    )
    out = io.StringIO()
    retrieve.show_session(store, "match-42", out)
    text = out.getvalue()
    for expected in (
        "Session           match-42",
        "Image             demo-game:1.1.0",
        "Location          eu-west-1",
        "Host              203.0.113.42",
        "Last status       exited",
        "Players           2 (p1, p2)",
        "Labels            tournament=spring",
        "Last seen active  2026-11-22 11:29:50 UTC",
        "First seen ended  2026-11-22 11:30:00 UTC",
        "Fetch deadline    2026-11-22 15:20:00 UTC",
        "Archived at       2026-11-22 11:30:30 UTC",
        "Items: 2 archived of 3",
        "/srv/replays/match.replay",
        f"sha256       {m.items[1].sha256}",
        "artifact  source_gone",
        "error        GET /artifacts answered 404",
    ):
        assert expected in text, expected
    out = io.StringIO()
    retrieve.show_session(store, "match-42", out, fmt="json")
    assert out.getvalue().encode() == manifest_to_bytes(m)


def test_unknown_session_is_a_one_line_not_archived_error(store: ObjectStore) -> None:
    with pytest.raises(SessionNotArchivedError) as info:
        retrieve.show_session(store, "never-archived", io.StringIO())
    message = str(info.value)
    assert "never-archived" in message and "not archived" in message and "\n" not in message


# --- logs -------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", ["text", "ndjson", "legacy"])
def test_logs_prints_plain_lines_whatever_the_upstream_shape(
    shape: str, store: ObjectStore, fake_service: FakeService, archive_from_fake: Callable[..., Manifest]
) -> None:
    """Whatever /query/log sent (text, NDJSON entries, the legacy map), `logs` prints the same lines."""
    m = archive_from_fake(shape=shape)
    truth = fake_service.log_lines(TEST_TOKEN, m.session_id)
    out = io.StringIO()
    printed = retrieve.print_logs(store, m.session_id, out, escape=False)
    assert out.getvalue().splitlines() == [line for _stream, line in truth]
    assert printed == len(truth)


def test_logs_stream_filter_and_grep(
    store: ObjectStore, fake_service: FakeService, archive_from_fake: Callable[..., Manifest]
) -> None:
    """--stream keeps one stream where the source tells them apart; --grep is a regex search."""
    m = archive_from_fake(shape="ndjson")
    truth = fake_service.log_lines(TEST_TOKEN, m.session_id)
    stderr_lines = [line for stream, line in truth if stream == 2]
    assert stderr_lines, "the fake writes some stderr lines"
    out, warnings = io.StringIO(), list[str]()
    retrieve.print_logs(store, m.session_id, out, stream="stderr", warn=warnings.append)
    assert out.getvalue().splitlines() == stderr_lines and not warnings

    pattern = retrieve.compile_grep(r"join|JOIN", ignore_case=False)
    out = io.StringIO()
    retrieve.print_logs(store, m.session_id, out, grep=pattern)
    expected = [line for _s, line in truth if re.search(r"join|JOIN", line)]
    assert expected and out.getvalue().splitlines() == expected


def test_logs_stream_filter_on_plain_text_prints_everything_and_says_so_once(store: ObjectStore) -> None:
    put_session(store, "plain", ended_at=NOW - 60, logs=b"one\ntwo\nthree\n")
    out, warnings = io.StringIO(), list[str]()
    retrieve.print_logs(store, "plain", out, stream="stdout", warn=warnings.append)
    assert out.getvalue() == "one\ntwo\nthree\n"
    assert len(warnings) == 1 and "do not tell stdout from stderr" in warnings[0]


def test_logs_escape_control_characters_on_a_terminal_only(store: ObjectStore) -> None:
    """A log line with terminal escapes is shown escaped on a tty (a real pty) and verbatim in a pipe."""
    put_session(store, "esc", ended_at=NOW - 60, logs=b"\x1b]0;owned\x07title\tcol\n")
    master, slave = pty.openpty()
    try:
        with open(slave, "w", encoding="utf-8", closefd=False) as tty:
            retrieve.print_logs(store, "esc", tty)
        shown = os.read(master, 4096)
    finally:
        os.close(master)
        os.close(slave)
    assert b"\x1b" not in shown and b"\x07" not in shown
    assert b"\\x1b]0;owned\\x07title" in shown
    piped = io.StringIO()
    retrieve.print_logs(store, "esc", piped)
    assert piped.getvalue() == "\x1b]0;owned\x07title\tcol\n"


def test_logs_lets_broken_pipe_through_for_the_cli_to_end_quietly(store: ObjectStore) -> None:
    put_session(store, "long", ended_at=NOW - 60, logs=b"".join(b"line %d\n" % i for i in range(1000)))
    with pytest.raises(BrokenPipeError):
        retrieve.print_logs(store, "long", ClosedPipe(keep=1))


def test_logs_piped_to_head_exits_quietly(file_store: ObjectStore, tmp_path: Path) -> None:
    """`archiver logs ID | head -1` through a real pipe: one line, no traceback, no error exit.

    Uses the real `archiver logs` command once cli.py wires it; until then print_logs behind
    cli.friendly_errors (what the command does) in a subprocess.
    """
    from archiver.cli import base as cli

    lines = b"".join(b"line %06d\n" % i for i in range(50_000))  # far more than a pipe buffer
    put_session(file_store, "piped", ended_at=NOW - 60, logs=lines)
    if "logs" in cli.main.commands:
        argv = [sys.executable, "-m", "archiver.cli", "logs", "piped", "--store", file_store.url]
    else:
        script = textwrap.dedent(
            """
            import sys
            from archiver.cli.base import friendly_errors
            from archiver.retrieval.retrieve import print_logs
            from archiver.store import open_store

            @friendly_errors
            def main():
                print_logs(open_store(sys.argv[1]), sys.argv[2], sys.stdout)

            main()
            """
        )
        argv = [sys.executable, "-c", script, file_store.url, "piped"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    first = proc.stdout.readline()
    proc.stdout.close()  # what `head -1` does after its line
    stderr = proc.stderr.read()
    assert proc.wait(timeout=30) == 0, stderr
    assert first == b"line 000000\n"
    assert b"Traceback" not in stderr and b"BrokenPipeError" not in stderr, stderr


def test_logs_of_a_session_whose_logs_were_not_archived(store: ObjectStore) -> None:
    put_session(
        store,
        "gone",
        ended_at=NOW - 60,
        logs=None,
        extra_items=[
            ManifestItem(kind="logs", source="GET /query/log", outcome="expired", error="fetch deadline passed")
        ],
    )
    with pytest.raises(SessionNotArchivedError, match=r"not archived \(expired: fetch deadline passed\)"):
        retrieve.print_logs(store, "gone", io.StringIO())


def test_tampered_logs_are_printed_then_flagged(store: ObjectStore) -> None:
    """The bytes under the logs key changed: the (readable) lines come out, then an integrity error."""
    put_session(store, "tampered", ended_at=NOW - 60, logs=b"honest line\n")
    overwrite(store, keys.logs_key(store.prefix, "tampered", "txt"), gzipped(b"forged line\n"))
    out = io.StringIO()
    with pytest.raises(ArchiveIntegrityError, match="do not match the manifest"):
        retrieve.print_logs(store, "tampered", out)
    assert out.getvalue() == "forged line\n"


def test_truncated_gzip_is_reported(store: ObjectStore) -> None:
    put_session(store, "cut", ended_at=NOW - 60, logs=b"".join(b"line %d\n" % i for i in range(5000)))
    key = keys.logs_key(store.prefix, "cut", "txt")
    full = b"".join(store.iter_bytes(key))
    overwrite(store, key, full[: len(full) // 2])
    with pytest.raises(ArchiveIntegrityError, match="truncated"):
        retrieve.print_logs(store, "cut", io.StringIO())


# --- get --------------------------------------------------------------------------------------


def test_get_downloads_verifies_and_extracts(
    store: ObjectStore, fake_service: FakeService, archive_from_fake: Callable[..., Manifest], tmp_path: Path
) -> None:
    """Everything of a fake session lands verified under DIR/<sid>.<instance>/; --extract unpacks the real tarballs."""
    m = archive_from_fake(shape="ndjson")
    sid = m.session_id
    progress: list[int] = []
    result = retrieve.download_session(store, sid, tmp_path / "out", extract=True, progress=progress.append)
    base = tmp_path / "out" / f"{keys.escape_session_id(sid)}.{m.instance}"
    assert result.directory == base
    assert (base / "manifest.json").read_bytes() == manifest_to_bytes(m)
    archived = [i for i in m.items if i.outcome == "archived"]
    assert sum(progress) == retrieve.download_size(m) == sum(i.size or 0 for i in archived)
    for item in archived:
        assert item.key is not None
        local = base / item.key.split(f"{keys.escape_session_id(sid)}/{m.instance}/", 1)[1]
        assert hashlib.sha256(local.read_bytes()).hexdigest() == item.sha256
    assert [i.path for i in result.not_archived] == ["/srv/crash/core.txt"]
    assert not list(base.rglob("*.partial"))

    # --extract: plain logs and the unpacked artifacts, byte for byte what the fake serves.
    assert (base / "logs.txt").read_text().splitlines() == [
        line for _s, line in fake_service.log_lines(TEST_TOKEN, sid)
    ]
    for path in ("/var/log/game/server.log", "/srv/replays/match.replay"):
        name = keys.artifact_name(path).removesuffix(".tar.gz")
        with tarfile.open(fileobj=io.BytesIO(b"".join(fake_service.artifact_bytes(TEST_TOKEN, sid, path)))) as tar:
            members = {i.name.lstrip("./"): tar.extractfile(i).read() for i in tar if i.isreg()}  # type: ignore[union-attr]
        assert members
        for member, data in members.items():
            assert (base / "artifacts" / name / member).read_bytes() == data
        assert result.extracted[f"artifacts/{name}.tar.gz"].ok

    out = io.StringIO()
    retrieve.render_download(result, out)
    assert "sha256 verified" in out.getvalue() and "not archived: /srv/crash/core.txt (source_gone" in out.getvalue()

    # A second run reuses what is there and leaves the extracted trees alone.
    again = retrieve.download_session(store, sid, tmp_path / "out", extract=True)
    assert all(f.reused for f in again.files)
    assert set(again.extract_skipped) == set(result.extracted)


def test_a_pipeline_archive_is_listed_shown_and_verifies(
    store: ObjectStore, fake_service: FakeService, archive_from_fake: Callable[..., Manifest]
) -> None:
    """What the real pipeline wrote is found by `ls` (label filter), shown, and passes `verify` with index."""
    m = archive_from_fake(shape="text", labels={"tournament": "spring-cup"})
    now = fake_service.clock.now()
    found = retrieve.list_sessions(store, since=now - HOUR, labels={"tournament": "spring-cup"}, now=now)
    assert _ids(found) == [m.session_id]
    assert found[0].counts == {"archived": 3, "source_gone": 1}
    report = retrieve.verify(store, session_ids=[m.session_id], now=now)
    assert report.ok and report.objects == 3, report.problems
    # The pipeline records the store's own checksums: S3 proves each object without a download; a
    # directory keeps none, so its objects are re-hashed even without --deep.
    archived = [i for i in m.items if i.outcome == "archived"]
    assert all((i.checksum_sha256 is not None) is store.keeps_checksums for i in archived)
    quick = retrieve.verify(store, session_ids=[m.session_id], now=now, deep=False)
    assert quick.ok and quick.objects == 3 and quick.unproven == 0, quick.problems
    assert (quick.proved, quick.bytes == 0) == ((3, True) if store.keeps_checksums else (0, False))
    out = io.StringIO()
    retrieve.show_session(store, m.session_id, out)
    assert "Labels            tournament=spring-cup" in out.getvalue()


def test_get_refuses_a_tampered_object_and_leaves_nothing(store: ObjectStore, tmp_path: Path) -> None:
    """A sha256 mismatch names the file and both hashes; neither the partial nor a final file remains."""
    m = put_session(store, "t", ended_at=NOW - 60, artifacts={"/srv/replays/match.replay": b"genuine bytes"})
    item = m.items[1]
    assert item.key is not None
    forged = b"forged bytes!"
    overwrite(store, item.key, forged)
    with pytest.raises(ArchiveIntegrityError) as info:
        retrieve.download_session(store, "t", tmp_path)
    message = str(info.value)
    assert item.key in message and item.sha256 is not None and item.sha256 in message
    assert hashlib.sha256(forged).hexdigest() in message
    artifacts = tmp_path / "t" / "artifacts"
    assert list(artifacts.iterdir()) == []


def test_get_extract_refuses_a_malicious_tarball(store: ObjectStore, tmp_path: Path) -> None:
    """An artifact built to escape (absolute, `..`, symlink to /etc/passwd, hard link out, device):
    only its safe member is extracted."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, kind, link in [
            ("/etc/evil", tarfile.REGTYPE, ""),
            ("../../escape", tarfile.REGTYPE, ""),
            ("passwd", tarfile.SYMTYPE, "/etc/passwd"),
            ("hard", tarfile.LNKTYPE, "../../outside"),
            ("null", tarfile.CHRTYPE, ""),
            ("ok.txt", tarfile.REGTYPE, ""),
        ]:
            info = tarfile.TarInfo(name)
            info.type, info.linkname = kind, link
            data = b"payload" if kind == tarfile.REGTYPE else b""
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data else None)
    put_session(store, "evil", ended_at=NOW - 60, artifacts={"/srv/evil": buf.getvalue()})
    result = retrieve.download_session(store, "evil", tmp_path / "out", extract=True)
    (extracted,) = result.extracted.values()
    assert {r.member for r in extracted.refused} == {"/etc/evil", "../../escape", "passwd", "hard", "null"}
    dest = extracted.destination
    assert sorted(p.name for p in dest.iterdir()) == ["ok.txt"]
    assert not (tmp_path / "escape").exists() and not (tmp_path / "out" / "escape").exists()
    out = io.StringIO()
    retrieve.render_download(result, out)
    assert "refused passwd: symlink to an absolute path" in out.getvalue()


def test_a_manifest_cannot_steer_downloads_elsewhere(store: ObjectStore, tmp_path: Path) -> None:
    """A manifest item whose key is not this session's own object name is refused, not followed."""
    other = put_session(store, "victim", ended_at=NOW - 120)
    stolen = other.items[0]
    assert stolen.key is not None
    put_session(
        store,
        "attacker",
        ended_at=NOW - 60,
        logs=None,
        extra_items=[
            ManifestItem(
                kind="logs", source="x", outcome="archived", key=stolen.key, size=stolen.size,
                sha256=stolen.sha256, content_type="application/gzip",
            )
        ],
    )  # fmt: skip
    with pytest.raises(ArchiveIntegrityError, match="unexpected key"):
        retrieve.download_session(store, "attacker", tmp_path)


# --- verify -----------------------------------------------------------------------------------


def test_verify_reports_tampered_and_missing_objects(store: ObjectStore) -> None:
    """Clean sessions pass; an overwritten object, a deleted one and an unknown id are each reported."""
    artifacts = {"/srv/replays/match.replay": os.urandom(3000)}
    for sid in ("clean", "tampered", "missing"):
        put_session(store, sid, ended_at=NOW - 60, artifacts=artifacts)
    ok = retrieve.verify(store, session_ids=["clean"], now=NOW)
    assert ok.ok and (ok.sessions, ok.objects) == (1, 2)

    art_key = keys.artifact_key(store.prefix, "tampered", "/srv/replays/match.replay")
    overwrite(store, art_key, os.urandom(3000))
    delete(store, keys.logs_key(store.prefix, "missing", "txt"))
    seen: list[retrieve.Problem] = []
    report = retrieve.verify(
        store, session_ids=["clean", "tampered", "missing", "unknown"], now=NOW, on_problem=seen.append
    )
    kinds = sorted((p.session_id, p.kind) for p in report.problems)
    assert kinds == [
        ("missing", "missing_object"),
        ("tampered", "sha256_mismatch"),
        ("unknown", "not_archived"),
    ]
    assert seen == report.problems and not report.ok
    assert report.sessions == 4 and report.sessions_with_problems == 3
    out = io.StringIO()
    retrieve.render_verify(report, out)
    assert out.getvalue().splitlines()[-1].startswith("FAILED: 4 session(s)")
    assert f"tampered: sha256_mismatch: {art_key}" in out.getvalue()

    # --since walks the index: the same problems, found without naming the sessions.
    since = retrieve.verify(store, since=NOW - HOUR, now=NOW)
    assert sorted((p.session_id, p.kind) for p in since.problems) == kinds[:2]


def test_verify_notices_a_session_missing_from_the_index(store: ObjectStore) -> None:
    put_session(store, "unindexed", ended_at=NOW - 60)
    delete(store, keys.index_key(store.prefix, NOW - 60, "unindexed"))
    report = retrieve.verify(store, session_ids=["unindexed"], now=NOW)
    assert [p.kind for p in report.problems] == ["missing_index"]


# --- scale ------------------------------------------------------------------------------------

SESSIONS_10K = 10_000
DAYS = 30


def _spread(n: int, days: int) -> list[tuple[str, float]]:
    """n session ids ending evenly over the last `days` days before NOW."""
    span = days * 86400.0
    return [(f"sess-{i:05d}-{'x' * (i % 7)}", NOW - span + span * (i + 0.5) / n) for i in range(n)]


def _entry_bytes(store: ObjectStore, sid: str, ended: float) -> tuple[str, bytes]:
    mkey = keys.manifest_key(store.prefix, sid)
    entry = IndexEntry(
        session_id=sid, ended_at=ended, archived_at=ended + 30, image="demo-game", tag="1.1.0",
        location="eu-west-1", labels={"tournament": "spring"}, counts={"archived": 2}, total_bytes=1_049_000,
        manifest_key=mkey,
    )  # fmt: skip
    return keys.index_key(store.prefix, ended, sid), index_entry_to_bytes(entry)


def test_ls_over_10k_sessions_in_30_days_reads_only_the_partitions_asked_for(file_store: ObjectStore) -> None:
    """10,000 sessions over 30 days: `ls --since 2h` lists 3 partitions and reads only their entries.

    The wall-clock budget (< 1 s) is measured by benchmarks/retrieval.py, not asserted here."""
    root = Path(file_store.url.removeprefix("file://"))
    sessions = _spread(SESSIONS_10K, DAYS)
    for sid, ended in sessions:  # fast path: plain files in the store's layout (only ls reads them)
        key, data = _entry_bytes(file_store, sid, ended)
        path = root / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    since = NOW - 2 * HOUR
    partitions = keys.index_partitions(file_store.prefix, since, NOW)
    in_partitions = sum(
        1
        for _sid, ended in sessions
        if ended >= datetime.fromtimestamp(since, UTC).replace(minute=0, second=0).timestamp()
    )
    expected = sorted((sid for sid, ended in sessions if ended >= since), key=lambda s: s)

    file_store.requests_made.reset()
    entries = retrieve.list_sessions(file_store, since=since, now=NOW)
    out = io.StringIO()
    retrieve.render_sessions(entries, out)

    counts = file_store.requests_made.snapshot()
    assert sorted(_ids(entries)) == expected and len(entries) == len(expected) > 0
    # The 3 hour partitions, and the day's columnar index parts (day, hourly): none compacted here.
    assert counts["ListObjectsV2"] == len(partitions) + 2 == 3 + 2
    assert counts["GetObject"] == in_partitions <= len(expected) + 20


def test_ls_on_s3_lists_partitions_not_the_bucket(s3_store: ObjectStore) -> None:
    """On S3 too: 720 entries over 30 days; `ls --since 2h` costs 3 listings + the entries of those hours."""
    sessions = _spread(24 * DAYS, DAYS)
    payloads = [_entry_bytes(s3_store, sid, ended) for sid, ended in sessions]
    with ThreadPoolExecutor(max_workers=16) as pool:
        list(pool.map(lambda kv: s3_store.put_bytes(kv[0], kv[1], content_type="application/json"), payloads))
    since = NOW - 2 * HOUR
    s3_store.requests_made.reset()
    entries = retrieve.list_sessions(s3_store, since=since, now=NOW)
    counts = s3_store.requests_made.snapshot()
    assert len(entries) == sum(1 for _s, ended in sessions if ended >= since) == 2
    assert counts["ListObjectsV2"] == 3 + 2 and counts["GetObject"] == 3  # + the day's index parts (none)


@pytest.mark.parametrize(
    "text", ["99999999999999999d", "0001-01-01T00:00+01:00", "9999-12-31T23:59:59-23:59", "60000d"]
)
def test_times_outside_the_archive_range_are_a_clear_error(text: str) -> None:
    """Not an OverflowError or 'year 0 is out of range' traceback from deeper down."""
    with pytest.raises(ValueError, match="out of range"):
        retrieve.parse_time(text, NOW)
