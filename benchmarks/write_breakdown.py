"""Where a mass end's disk bytes go (issue 35): one `mass_end.py` run with every page the daemon dirties
attributed to the file it belongs to.

Usage: sudo python benchmarks/write_breakdown.py [--size 1000] [--seed 1]

`/proc/PID/io` `write_bytes` (what `mass_end.py` measures) counts a 4 KiB page each time one of the
process's writes turns a clean page dirty. The kernel's `writeback:writeback_dirty_folio` trace
event reports each such page with its inode; a process beside the run maps the run directory's
inodes to their files every 0.2 s (files created and deleted between two looks stay unnamed; its
CPU slows the run a little, so fewer raw capture pages may be cancelled than in `mass_end.py`), and
the block device's inode stands for filesystem metadata (directory blocks, inode tables, bitmaps). Pages
of files deleted before the kernel wrote them back are counted here as dirtied, and by `mass_end.py`
as cancelled: the net column of `mass_end.py` is this total less its `cancelled_write_bytes`, plus
the WAL checkpoint still due at the end (written by the benchmark's thread, not traced here).

Needs root and tracefs (`/sys/kernel/tracing`); a diagnostic, not in `make bench` and without a budget.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from archiver.app.process import raise_file_limit
from archiver.live.loop import files_for
from benchmarks.mass_end import config
from tests.chaos_run import run_chaos

TRACING = Path("/sys/kernel/tracing")
EVENT = "writeback:writeback_dirty_folio"
#: The daemon's threads are named after its console script.
DAEMON_COMM = "archiver"
LINE = re.compile(r"^\s*(?P<comm>.+?)-(?P<pid>\d+)\s.*writeback_dirty_folio: bdi \S+ ino=(?P<ino>\d+)")


def category(path: str | None) -> str:
    """What a dirtied page belongs to, by its file's path (None: not seen by the mapper)."""
    if path is None:
        return "unnamed (filesystem metadata, or a file that lived under 0.2 s)"
    name = path.rsplit("/", 1)[-1]
    if "/live/" in path:
        if name.endswith(".log"):
            return "running captures (raw lines)"
        if ".gz" in name:
            return "seals (each finished capture as its stored log)"
        return f"captures DB ({name})"
    if name.startswith("state.db"):
        return f"state DB ({name})"
    if "/spool/" in path:
        return "spool files"
    if name.startswith("daemon-"):
        return "the daemon's log"
    return f"other ({name})"


def map_inodes(root: str) -> None:
    """The mapper (`--map-inodes ROOT`, in a process of its own: in the run's process it would take
    the GIL from the fake's follow streams): every 0.2 s, each file's inode and first path under
    ``root``, until SIGTERM; then the map as JSON on stdout."""
    paths: dict[int, str] = {}
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())

    def walk(directory: str) -> None:
        try:
            with os.scandir(directory) as entries:
                for entry in entries:
                    if entry.is_dir(follow_symlinks=False):
                        walk(entry.path)
                    else:
                        paths.setdefault(entry.inode(), entry.path)
        except OSError:
            pass  # deleted while we looked

    while not stopped.is_set():
        walk(root)
        stopped.wait(0.2)
    json.dump(paths, sys.stdout)


class InodeMap:
    """Every inode seen under a directory tree while the block runs, with its first path."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.paths: dict[int, str] = {}
        self._process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> InodeMap:
        self._process = subprocess.Popen(
            [sys.executable, __file__, "--map-inodes", str(self.root)], stdout=subprocess.PIPE
        )
        return self

    def __exit__(self, *_: object) -> None:
        assert self._process is not None
        self._process.terminate()
        out, _ = self._process.communicate()
        self.paths = {int(ino): path for ino, path in json.loads(out or b"{}").items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--map-inodes", metavar="ROOT", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.map_inodes:
        map_inodes(args.map_inodes)
        return 0
    if not os.access(TRACING / "set_event", os.W_OK):
        print(f"write_breakdown: needs root and tracefs at {TRACING} (mount -t tracefs nodev {TRACING})")
        return 2
    raise_file_limit(files_for(args.size))
    (TRACING / "tracing_on").write_text("0")
    (TRACING / "trace").write_text("")
    (TRACING / "set_event").write_text(EVENT)
    with tempfile.TemporaryFile() as trace, tempfile.TemporaryDirectory(prefix="write-breakdown-") as workdir:
        reader = subprocess.Popen(["cat", str(TRACING / "trace_pipe")], stdout=trace)
        (TRACING / "tracing_on").write_text("1")
        try:
            with InodeMap(Path(workdir)) as inodes:
                report = run_chaos(config(args.size, args.seed), Path(workdir))
        finally:
            (TRACING / "tracing_on").write_text("0")
            reader.terminate()
            reader.wait()
            (TRACING / "set_event").write_text("")
        trace.seek(0)
        pages: collections.Counter[str] = collections.Counter()
        for raw in trace:
            found = LINE.match(raw.decode("utf-8", "replace"))
            if found and found["comm"] == DAEMON_COMM:
                pages[category(inodes.paths.get(int(found["ino"])))] += 1
    archived = max(report.archived_once, 1)
    cancelled = report.daemon_cancelled_write_bytes or 0
    print(f"mass end of {args.size:,} sessions (seed {args.seed}): {report.archived_once:,} archived, "
          f"{report.mass_end_exact:,} logs exact; pages the daemon dirtied, per archived session:")  # fmt: skip
    print("| where | pages | KiB per session |\n| --- | --- | --- |")
    for where, count in pages.most_common():
        print(f"| {where} | {count:,} | {count * 4 / archived:.2f} |")
    total = sum(pages.values())
    print(f"| all dirtied | {total:,} | {total * 4 / archived:.2f} |")
    print(f"| less pages never written back (cancelled_write_bytes) | {cancelled // 4096:,} | "
          f"{cancelled / 1024 / archived:.2f} |")  # fmt: skip
    return 0 if not report.failures() else 1


if __name__ == "__main__":
    sys.exit(main())
