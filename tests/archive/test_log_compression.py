"""Logs are stored as ISA-L gzip: the same log gives the same bytes however the network cut it, and
the digests that compare logs by content refuse what is not gzip."""

from __future__ import annotations

import gzip
import hashlib
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from archiver.archive import spool as spool_module
from archiver.archive.spool import Spool
from archiver.archive.upload import log_digests
from archiver.errors import ArchiveIntegrityError
from archiver.store.gzipstream import DEFLATE_BLOCK, gzip_blocks

LINES = st.lists(st.text(min_size=0, max_size=80), min_size=0, max_size=4000)


def cut(body: bytes, sizes: list[int]) -> list[bytes]:
    """`body` in pieces of the given sizes (cycled), as a network might deliver it."""
    pieces, at, n = [], 0, 0
    while at < len(body):
        step = sizes[n % len(sizes)]
        pieces.append(body[at : at + step])
        at += step
        n += 1
    return pieces


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    lines=LINES,
    sizes=st.lists(st.integers(min_value=1, max_value=3 * DEFLATE_BLOCK), min_size=1, max_size=6),
    repeat=st.integers(min_value=1, max_value=40),
)
def test_the_same_log_gives_the_same_stored_bytes_however_it_arrives(
    tmp_path: Path, lines: list[str], sizes: list[int], repeat: int
) -> None:
    """Spool files of one log delivered whole and in arbitrary pieces are byte for byte the same
    gzip, which decompresses to the log."""
    body = ("\n".join(lines) + "\n").encode() * repeat
    spool = Spool(tmp_path / "spool")
    whole = spool.write(1, iter([body]), compress=True, limit=None)
    pieces = spool.write(2, iter(cut(body, sizes)), compress=True, limit=None)
    assert whole.path.read_bytes() == pieces.path.read_bytes()
    assert (whole.sha256, whole.size, whole.received) == (pieces.sha256, pieces.size, len(body))
    assert gzip.decompress(pieces.path.read_bytes()) == body


def test_log_digests_compare_content_and_refuse_what_is_not_gzip() -> None:
    """Two compressions of one log share the content digest, not the stored one; an empty object
    or other bytes are not a log."""
    log = b"12:00:01 INFO match started\n" * 5000
    fast, small = gzip.compress(log, compresslevel=1, mtime=0), gzip.compress(log, compresslevel=9, mtime=0)
    a, b = log_digests([fast], "a"), log_digests([small[:100], small[100:]], "b")
    assert a.content_sha256 == b.content_sha256 and a.sha256 != b.sha256
    assert (a.size, b.size) == (len(fast), len(small))
    with pytest.raises(ArchiveIntegrityError):
        log_digests([b""], "empty")
    with pytest.raises(ArchiveIntegrityError):
        log_digests([log[:100]], "plain text")


def test_a_live_capture_s_seal_is_adopted_by_a_link_not_a_copy_and_copied_across_filesystems(
    tmp_path: Path,
) -> None:
    """The spool takes a sealed capture (already the stored log's gzip, synced) as it is: a hard link
    on the same filesystem; a durable copy of the same bytes where a link cannot cross (tmpfs)."""
    body = b"".join(gzip_blocks([b"line\n" * 500]))
    digest = hashlib.sha256(body).hexdigest()
    seal = tmp_path / "capture.gz"
    seal.write_bytes(body)
    spool = Spool(tmp_path / "spool")
    linked = spool.adopt(7, seal, size=len(body), sha256=digest, received=2500)
    assert linked.path == spool.final_path(7) and linked.path.stat().st_ino == seal.stat().st_ino
    assert (linked.size, linked.sha256, linked.received) == (len(body), digest, 2500)
    seal.unlink()  # the capture removed once spooled: the spool file stays whole
    assert linked.path.read_bytes() == body

    with tempfile.TemporaryDirectory(dir="/dev/shm") as other:
        elsewhere = Path(other) / "capture.gz"
        elsewhere.write_bytes(body)
        copied = spool.adopt(8, elsewhere, size=len(body), sha256=digest, received=2500)
        assert copied.path.stat().st_ino != elsewhere.stat().st_ino
        assert (copied.path.read_bytes(), copied.sha256, copied.received) == (body, digest, 2500)
    with pytest.raises(FileNotFoundError):
        spool.adopt(9, tmp_path / "gone.gz", size=1, sha256=digest, received=1)
    assert not spool.partial_path(9).exists()


def test_the_spool_syncs_its_directory_once_for_a_batch_of_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 35: each file's data is synced as it is written, their names once before the batch's
    commit (`Spool.sync`), and a sync with no new name syncs nothing."""
    synced: list[Path] = []
    real = spool_module.fsync_dir
    monkeypatch.setattr(spool_module, "fsync_dir", lambda path: (synced.append(path), real(path))[1])
    spool = Spool(tmp_path / "spool")
    seal = tmp_path / "seal.gz"
    seal.write_bytes(gzip.compress(b"x\n"))
    for n in range(3):
        spool.write(n, iter([b"line\n"]), compress=True, limit=None)
    spool.adopt(3, seal, size=seal.stat().st_size, sha256="0" * 64, received=2)
    assert synced == []
    spool.sync()
    assert synced == [spool.directory]
    spool.sync()
    assert synced == [spool.directory]
    assert sorted(p.name for p in spool.directory.iterdir()) == ["0", "1", "2", "3"]


def test_the_start_up_sweep_syncs_the_spool_files_it_keeps_and_deletes_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a seal sync delay, an adopted seal a `kill -9` left waiting for its sync is synced by the
    next start's sweep, with every file a spooled item still names; without one nothing needs it."""
    spool = Spool(tmp_path / "spool")
    seal = tmp_path / "seal.gz"
    seal.write_bytes(gzip.compress(b"x\n"))
    spool.adopt(1, seal, size=seal.stat().st_size, sha256="0" * 64, received=2)
    spool.write(2, iter([b"orphan\n"]), compress=True, limit=None)
    synced: list[str] = []
    real = spool_module.fdatasync_file
    monkeypatch.setattr(spool_module, "fdatasync_file", lambda path: (synced.append(path.name), real(path))[1])
    assert spool.sweep({"1"}) == 1
    assert synced == [] and [p.name for p in spool.directory.iterdir()] == ["1"]  # no seal delay: all synced
    assert spool.sweep({"1"}, sync_kept=True) == 0
    assert synced == ["1"]
