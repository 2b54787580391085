"""Safe extraction of untrusted .tar.gz artifacts: each member is checked, unsafe ones skipped and reported.

Policy (documented in the README's retrieval section): an artifact comes from a game-server
container, i.e. from code we do not control, so each member is judged on its own:

* extracted: regular files, directories, symlinks and hard links whose path and target stay inside
  the destination;
* refused (skipped, reported with a reason, the rest of the archive is still extracted):
  absolute names, names with a ``..`` component, symlinks whose target is absolute or leaves the
  destination, hard links to anything that is not a file we already extracted, device nodes,
  FIFOs and any other member type, members that would exceed the size/count limits, and members
  whose on-disk path would pass through a symlink leading outside.

Skipping instead of refusing the whole archive: a folder tarred inside a container often holds a
harmless absolute symlink (``current -> /var/log/game/server.log``); losing every replay because of
it would defeat the purpose. The downloaded ``.tar.gz`` itself is always kept byte for byte, so
nothing is lost for forensics, and every refusal is reported to the user.

Files are written by this module (``O_CREAT|O_EXCL|O_NOFOLLOW``, never through an existing
symlink), not by ``TarFile.extract``: its hard-link fallback would copy a refused member's data.
When the running Python has ``tarfile.data_filter`` (3.11.4+), it is consulted as a second,
independent veto. Modes are reduced to ``0o755`` (no setuid/setgid/sticky), ownership is never
changed, modification times are kept (they matter for forensics).
"""

from __future__ import annotations

import errno
import os
import posixpath
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

#: Upper bound of bytes written per archive: a 100 MB .tar.gz can inflate a thousandfold.
DEFAULT_MAX_TOTAL_BYTES = 20 * 1024**3
#: Upper bound of members per archive (inode exhaustion is a denial of service too).
DEFAULT_MAX_MEMBERS = 200_000
_COPY_CHUNK = 1024 * 1024


@dataclass(frozen=True, slots=True)
class Refusal:
    """A member that was not extracted, and why."""

    member: str
    reason: str


@dataclass(slots=True)
class ExtractResult:
    """What :func:`safe_extract` did with one archive."""

    destination: Path
    files: int = 0
    directories: int = 0
    links: int = 0
    bytes_written: int = 0
    refused: list[Refusal] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.refused


def _parts(name: str) -> list[str] | None:
    """The path components of a member name without ``.``/empty ones; None when one is ``..``."""
    parts = [p for p in name.split("/") if p not in ("", ".")]
    return None if ".." in parts else parts


def check_member(member: tarfile.TarInfo) -> str | None:
    """Why a member must not be extracted (judged on its header alone), or None when it may be.

    Pure: the on-disk checks (symlinked parents, hard-link targets) happen during extraction.
    """
    name = member.name
    if "\x00" in name or "\x00" in member.linkname:
        return "name contains a NUL byte"
    if name.startswith("/"):
        return "absolute path"
    if _parts(name) is None:
        return "path has a '..' component"
    if member.ischr() or member.isblk():
        return "device file"
    if member.isfifo():
        return "FIFO"
    if member.issym():
        target = member.linkname
        if not target:
            return "symlink with an empty target"
        if target.startswith("/"):
            return f"symlink to an absolute path ({target[:80]!r})"
        # Relative targets resolve from the link's own directory.
        resolved = posixpath.normpath(posixpath.join(posixpath.dirname(name.strip("/")), target))
        if resolved == ".." or resolved.startswith("../"):
            return f"symlink pointing outside the destination ({target[:80]!r})"
    elif member.islnk():
        target = member.linkname
        if target.startswith("/"):
            return f"hard link to an absolute path ({target[:80]!r})"
        if _parts(target) is None or not _parts(target):
            return f"hard link pointing outside the destination ({target[:80]!r})"
    elif not (member.isreg() or member.isdir()):
        return f"unsupported member type {member.type!r}"
    return None


def _inside(root: str, path: str) -> bool:
    return path == root or path.startswith(root + os.sep)


class _Extractor:
    """One archive into one fresh directory; keeps track of what was written for hard links."""

    def __init__(self, tar: tarfile.TarFile, root: Path, result: ExtractResult, max_total: int) -> None:
        self.tar = tar
        self.root = os.path.realpath(root)
        self.result = result
        self.max_total = max_total
        #: Normalised names of regular files we wrote (the only legal hard-link targets).
        self.files: set[str] = set()
        self.symlinks: list[str] = []

    def refuse(self, member: tarfile.TarInfo, reason: str) -> None:
        self.result.refused.append(Refusal(member.name, reason))

    def _target(self, rel: str) -> str | None:
        """The absolute on-disk path of ``rel`` if its parent directory really lies inside the root.

        ``realpath`` follows symlinks that earlier members created, so a member cannot be written
        through a (chain of) link(s) leading outside, whatever the archive order.
        """
        path = os.path.join(self.root, rel)
        parent = os.path.realpath(os.path.dirname(path))
        if not _inside(self.root, parent):
            return None
        return os.path.join(parent, os.path.basename(path))

    def _make_parents(self, target: str) -> None:
        os.makedirs(os.path.dirname(target), mode=0o755, exist_ok=True)

    def _clear(self, target: str) -> None:
        """Remove what an earlier member of the same name left (tar semantics: the last one wins)."""
        if os.path.islink(target) or (os.path.lexists(target) and not os.path.isdir(target)):
            os.unlink(target)

    def extract(self, member: tarfile.TarInfo) -> None:
        reason = check_member(member)
        if reason is None and hasattr(tarfile, "data_filter"):
            # The stdlib's own judgement, as an independent second opinion.
            try:
                tarfile.data_filter(member, self.root)
            except tarfile.FilterError as exc:
                reason = f"refused by tarfile's data filter: {type(exc).__name__}"
        if reason is not None:
            self.refuse(member, reason)
            return
        parts = _parts(member.name) or []
        rel = "/".join(parts)
        if not rel:
            return  # "./" — the destination itself
        if member.isreg() and self.result.bytes_written + member.size > self.max_total:
            self.refuse(member, f"extraction limit of {self.max_total} bytes reached")
            return
        target = self._target(rel)
        if target is None:
            self.refuse(member, "its directory is a symlink leading outside the destination")
            return
        if member.isdir():
            if os.path.islink(target) or (os.path.exists(target) and not os.path.isdir(target)):
                self.refuse(member, "a non-directory of the same name was extracted before")
                return
            os.makedirs(target, mode=0o755, exist_ok=True)
            self.result.directories += 1
        elif member.isreg():
            self._write_file(member, rel, target)
        elif member.issym():
            self._make_parents(target)
            self._clear(target)
            if os.path.isdir(target):
                self.refuse(member, "a directory of the same name was extracted before")
                return
            os.symlink(member.linkname, target)
            # The name is a link now, not an extracted file: no hard link may point at it.
            self.files.discard(rel)
            if not _inside(self.root, os.path.realpath(target)):
                # Lexically inside, but through links already on disk it leaves the destination.
                os.unlink(target)
                self.refuse(member, f"symlink resolves outside the destination ({member.linkname[:80]!r})")
                return
            self.symlinks.append(target)
            self.result.links += 1
        elif member.islnk():
            self._hard_link(member, rel, target)

    def _write_file(self, member: tarfile.TarInfo, rel: str, target: str) -> None:
        self._make_parents(target)
        if os.path.isdir(target) and not os.path.islink(target):
            self.refuse(member, "a directory of the same name was extracted before")
            return
        self._clear(target)
        source = self.tar.extractfile(member)
        if source is None:  # cannot happen for a regular file; be explicit rather than crash
            self.refuse(member, "no data in the archive")
            return
        mode = (member.mode & 0o755) | 0o600
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
        written = 0
        try:
            with os.fdopen(fd, "wb") as out, source:
                while chunk := source.read(_COPY_CHUNK):
                    written += len(chunk)
                    if self.result.bytes_written + written > self.max_total:
                        break
                    out.write(chunk)
        except BaseException:
            # A truncated or corrupt archive: no half-written file that looks complete.
            os.unlink(target)
            raise
        if self.result.bytes_written + written > self.max_total:
            os.unlink(target)
            self.refuse(member, f"extraction limit of {self.max_total} bytes reached")
            return
        os.utime(target, (member.mtime, member.mtime), follow_symlinks=False)
        self.files.add(rel)
        self.result.files += 1
        self.result.bytes_written += written

    def _hard_link(self, member: tarfile.TarInfo, rel: str, target: str) -> None:
        source_rel = "/".join(_parts(member.linkname) or [])
        if source_rel not in self.files:
            self.refuse(member, f"hard link to {member.linkname[:80]!r}, which is not an extracted file")
            return
        source = os.path.join(self.root, source_rel)
        if os.path.islink(source):
            # os.link would copy the symlink itself, whose text then resolves from a new directory.
            self.refuse(member, f"hard link to {member.linkname[:80]!r}, which is a symlink")
            return
        if not _inside(self.root, os.path.realpath(source)):
            self.refuse(member, "hard link target resolves outside the destination")
            return
        self._make_parents(target)
        if os.path.isdir(target) and not os.path.islink(target):
            self.refuse(member, "a directory of the same name was extracted before")
            return
        self._clear(target)
        os.link(source, target, follow_symlinks=False)
        self.files.add(rel)
        self.result.links += 1

    def sweep_symlinks(self) -> None:
        """Remove links that now resolve outside (a later member can re-point a link they go through)."""
        for link in self.symlinks:
            if os.path.islink(link) and not _inside(self.root, os.path.realpath(link)):
                os.unlink(link)
                self.result.links -= 1
                self.result.refused.append(
                    Refusal(os.path.relpath(link, self.root), "symlink resolves outside the destination")
                )


def safe_extract(
    archive: Path,
    destination: Path,
    *,
    max_total_bytes: int = DEFAULT_MAX_TOTAL_BYTES,
    max_members: int = DEFAULT_MAX_MEMBERS,
) -> ExtractResult:
    """Extract a .tar.gz (or plain .tar) into ``destination``, which must not exist yet.

    Unsafe members are skipped and listed in ``ExtractResult.refused`` (see the module
    docstring). A damaged archive raises ``tarfile.TarError`` after extracting what came before
    the damage (the caller decides what to say; the original file is untouched). ``OSError`` from
    writing (disk full) propagates.
    """
    destination.mkdir(mode=0o755)
    result = ExtractResult(destination)
    with tarfile.open(archive, mode="r:*") as tar:
        extractor = _Extractor(tar, destination, result, max_total_bytes)
        for count, member in enumerate(tar, start=1):
            if count > max_members:
                extractor.refuse(member, f"more than {max_members} members; the rest is not extracted")
                break
            try:
                extractor.extract(member)
            except OSError as exc:
                # One member the filesystem refuses (name too long, odd characters) must not
                # stop the others; disk full stops everything.
                if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                    raise
                extractor.refuse(member, f"could not be written: {exc.strerror or exc}")
        extractor.sweep_symlinks()
    return result
