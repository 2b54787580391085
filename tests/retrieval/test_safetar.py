"""Untrusted artifact tarballs: unsafe members are refused one by one, nothing lands outside the target."""

from __future__ import annotations

import io
import os
import stat
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from archiver.fake import FakeService
from archiver.retrieval.safetar import ExtractResult, check_member, safe_extract
from tests.fixtures_fake import TEST_TOKEN

MTIME = 1_685_577_600


def _info(name: str, kind: bytes = tarfile.REGTYPE, *, linkname: str = "", mode: int = 0o644) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = linkname
    info.mode = mode
    info.mtime = MTIME
    return info


def make_tar(path: Path, members: list[tuple[tarfile.TarInfo, bytes | None]]) -> Path:
    """A .tar.gz written with tarfile itself (headers exactly as given, nothing sanitised)."""
    with tarfile.open(path, "w:gz") as tar:
        for info, data in members:
            if data is not None:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            else:
                tar.addfile(info)
    return path


def _tree(root: Path) -> set[str]:
    """Every path under root (not following symlinks), relative."""
    found = set()
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            found.add(os.path.relpath(os.path.join(dirpath, name), root))
    return found


@pytest.fixture(params=["with-data-filter", "without-data-filter"])
def filter_mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Run each test with the stdlib's data filter as a second opinion, and without it (older 3.11)."""
    if request.param == "without-data-filter":
        monkeypatch.delattr(tarfile, "data_filter", raising=False)
    yield request.param


MALICIOUS = [
    (_info("/tmp/absolute-evil"), b"x", "absolute path"),
    (_info("../evil-up"), b"x", "'..'"),
    (_info("ok/../../evil-deep"), b"x", "'..'"),
    (_info("passwd-link", tarfile.SYMTYPE, linkname="/etc/passwd"), None, "absolute"),
    (_info("up-link", tarfile.SYMTYPE, linkname="../../outside"), None, "outside"),
    (_info("hard-abs", tarfile.LNKTYPE, linkname="/etc/passwd"), None, "absolute"),
    (_info("hard-up", tarfile.LNKTYPE, linkname="../outside-file"), None, "outside"),
    (_info("chardev", tarfile.CHRTYPE), None, "device"),
    (_info("blockdev", tarfile.BLKTYPE), None, "device"),
    (_info("fifo", tarfile.FIFOTYPE), None, "FIFO"),
]


def test_malicious_members_are_refused_and_safe_ones_extracted(tmp_path: Path, filter_mode: str) -> None:
    """Absolute, `..`, escaping symlinks/hard links and device/FIFO members are skipped with a reason."""
    outside = tmp_path / "outside-file"
    outside.write_text("do not touch\n")
    safe = [
        (_info("game", tarfile.DIRTYPE, mode=0o755), None),
        (_info("game/server.log"), b"line 1\nline 2\n"),
        (_info("game/latest.log", tarfile.SYMTYPE, linkname="server.log"), None),
        (_info("game/copy.log", tarfile.LNKTYPE, linkname="game/server.log"), None),
    ]
    archive = make_tar(tmp_path / "a.tar.gz", [(i, d) for i, d, _ in MALICIOUS] + safe)
    work = tmp_path / "work"
    work.mkdir()
    before = _tree(tmp_path)

    result = safe_extract(archive, work / "dest")

    refused = {r.member: r.reason for r in result.refused}
    assert set(refused) == {info.name for info, _, _ in MALICIOUS}
    for info, _, reason in MALICIOUS:
        assert reason in refused[info.name], (info.name, refused[info.name])
    dest = work / "dest"
    assert (dest / "game/server.log").read_bytes() == b"line 1\nline 2\n"
    assert os.readlink(dest / "game/latest.log") == "server.log"
    assert (dest / "game/latest.log").read_bytes() == b"line 1\nline 2\n"
    assert (dest / "game/copy.log").read_bytes() == b"line 1\nline 2\n"
    assert _tree(dest) == {"game", "game/server.log", "game/latest.log", "game/copy.log"}
    # Nothing appeared or changed outside the destination.
    assert _tree(tmp_path) - before == {"work/dest", *(f"work/dest/{p}" for p in _tree(dest))}
    assert outside.read_text() == "do not touch\n"
    assert result.files == 1 and result.links == 2 and not result.ok


def test_symlink_chains_cannot_lead_writes_outside(tmp_path: Path, filter_mode: str) -> None:
    """Links each 'inside' on paper but together reaching the parent are refused, nothing written via them."""
    archive = make_tar(
        tmp_path / "chain.tar.gz",
        [
            (_info("here", tarfile.SYMTYPE, linkname="."), None),
            (_info("parent", tarfile.SYMTYPE, linkname="here/.."), None),
            (_info("parent/escaped.txt"), b"evil"),
            # Created before its hop exists: fine when made, outside once `hop` appears.
            (_info("late", tarfile.SYMTYPE, linkname="hop/.."), None),
            (_info("hop", tarfile.SYMTYPE, linkname="."), None),
            (_info("late/escaped2.txt"), b"evil"),
        ],
    )
    result = safe_extract(archive, tmp_path / "dest")
    refused = {r.member for r in result.refused}
    assert {"parent", "late/escaped2.txt", "late"} <= refused
    assert not (tmp_path / "escaped.txt").exists() and not (tmp_path / "escaped2.txt").exists()
    for link in ("parent", "late"):
        assert not os.path.islink(tmp_path / "dest" / link)
    # With the link refused, `parent/` is an ordinary directory inside the destination.
    assert (tmp_path / "dest/parent/escaped.txt").read_bytes() == b"evil"


def test_a_file_member_replaces_a_symlink_instead_of_writing_through_it(tmp_path: Path, filter_mode: str) -> None:
    """Tar semantics (the last member of a name wins) without following the earlier link."""
    archive = make_tar(
        tmp_path / "over.tar.gz",
        [
            (_info("target.txt"), b"original"),
            (_info("name", tarfile.SYMTYPE, linkname="target.txt"), None),
            (_info("name"), b"replacement"),
        ],
    )
    safe_extract(archive, tmp_path / "dest")
    assert (tmp_path / "dest/target.txt").read_bytes() == b"original"
    assert not os.path.islink(tmp_path / "dest/name")
    assert (tmp_path / "dest/name").read_bytes() == b"replacement"


def test_modes_are_reduced_and_mtimes_kept(tmp_path: Path, filter_mode: str) -> None:
    """No setuid/setgid/sticky bits survive; the executable bit and the modification time do."""
    archive = make_tar(
        tmp_path / "modes.tar.gz",
        [(_info("suid-tool", mode=0o6755), b"#!/bin/sh\n"), (_info("data.bin", mode=0o600), b"\x00\x01")],
    )
    safe_extract(archive, tmp_path / "dest")
    tool = os.lstat(tmp_path / "dest/suid-tool")
    assert stat.S_IMODE(tool.st_mode) == 0o755
    assert int(tool.st_mtime) == MTIME
    assert stat.S_IMODE(os.lstat(tmp_path / "dest/data.bin").st_mode) == 0o600


def test_size_limit_stops_a_decompression_bomb(tmp_path: Path) -> None:
    """Members beyond the byte budget are refused and no partial file is left."""
    archive = make_tar(tmp_path / "bomb.tar.gz", [(_info("a"), b"\x00" * 4000), (_info("b"), b"\x00" * 4000)])
    result = safe_extract(archive, tmp_path / "dest", max_total_bytes=5000)
    assert (tmp_path / "dest/a").stat().st_size == 4000
    assert not (tmp_path / "dest/b").exists()
    assert [r.member for r in result.refused] == ["b"]
    assert "limit" in result.refused[0].reason


def test_hard_link_to_a_refused_member_does_not_resurrect_it(tmp_path: Path, filter_mode: str) -> None:
    """A hard link may only point at a file this extraction wrote (tarfile would copy the refused member)."""
    archive = make_tar(
        tmp_path / "hl.tar.gz",
        [(_info("dev", tarfile.CHRTYPE), None), (_info("alias", tarfile.LNKTYPE, linkname="dev"), None)],
    )
    result = safe_extract(archive, tmp_path / "dest")
    assert {r.member for r in result.refused} == {"dev", "alias"}
    assert _tree(tmp_path / "dest") == set()


def test_check_member_accepts_ordinary_members() -> None:
    """Plain files, dirs and inside links (including `./`-prefixed names) pass the header check."""
    assert check_member(_info("./srv/replays/match.replay")) is None
    assert check_member(_info("srv/", tarfile.DIRTYPE)) is None
    assert check_member(_info("srv/a", tarfile.SYMTYPE, linkname="../srv/b")) is None
    assert check_member(_info("srv/a", tarfile.SYMTYPE, linkname="../../b")) is not None


def test_the_fake_services_artifact_extracts_byte_for_byte(tmp_path: Path, fake_service: FakeService) -> None:
    """A real upstream-shaped .tar.gz (the fake's streamed tarball) extracts completely, refusing nothing."""
    sid = fake_service.add_session(TEST_TOKEN, files={"/srv/replays/extra.bin": 3000})
    fake_service.end_session(TEST_TOKEN, sid)
    archive = tmp_path / "replays.tar.gz"
    archive.write_bytes(b"".join(fake_service.artifact_bytes(TEST_TOKEN, sid, "/srv/replays")))
    result: ExtractResult = safe_extract(archive, tmp_path / "dest")
    assert result.ok
    with tarfile.open(archive) as tar:
        files = {m.name: tar.extractfile(m).read() for m in tar if m.isreg()}  # type: ignore[union-attr]
    assert files and result.files == len(files)
    for name, data in files.items():
        assert (tmp_path / "dest" / name.lstrip("./")).read_bytes() == data


def test_a_hard_link_to_a_name_later_replaced_by_a_symlink_cannot_reach_outside(
    tmp_path: Path, filter_mode: str
) -> None:
    """A deep file, then a symlink of the same name whose text is harmless from its own directory,
    then a shallow hard link to that name: hard-linking the symlink would re-read its text from the
    shallow directory and lead to /etc/passwd."""
    deep = "/".join(["d"] * 30)
    escape = "../" * 30 + "etc/passwd"  # from d/.../d: out/etc/passwd, inside; from out/: /etc/passwd
    archive = make_tar(
        tmp_path / "a.tar.gz",
        [
            (_info(f"{deep}/x"), b"harmless"),
            (_info(f"{deep}/x", tarfile.SYMTYPE, linkname=escape), None),
            (_info("passwd", tarfile.LNKTYPE, linkname=f"{deep}/x"), None),
        ],
    )
    out = tmp_path / "out"
    result = safe_extract(archive, out)
    passwd = out / "passwd"
    assert not (passwd.exists() or passwd.is_symlink()) or os.path.realpath(passwd).startswith(str(out))
    assert any(r.member == "passwd" for r in result.refused), result.refused


def test_a_truncated_archive_leaves_no_half_written_file(tmp_path: Path) -> None:
    """A cut-off download must not leave a file that looks complete."""
    whole = make_tar(tmp_path / "whole.tar.gz", [(_info("big.bin"), os.urandom(3_000_000))])
    cut = tmp_path / "cut.tar.gz"
    cut.write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])
    out = tmp_path / "out"
    with pytest.raises((EOFError, OSError, tarfile.TarError)):
        safe_extract(cut, out)
    assert not (out / "big.bin").exists()
