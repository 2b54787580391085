"""Recovery of a captures directory at open: what each segment's files really hold against its
checkpoint (the rules are in `store`'s module doc), as rows to record again."""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from archiver.live.policy import Finish
from archiver.live.resume import Kept
from archiver.live.segment import FOLLOWING, SegmentRow, scan, sealed_path
from archiver.logshape import NDJSON, TEXT, starts_like_json

log = logging.getLogger("archiver.live")


@dataclass(frozen=True, slots=True)
class Recovered:
    """What recovery found: captures whose files are all gone, and rows that changed."""

    #: Keys whose every file is gone (a removal a crash cut short): their rows are deleted.
    removed: frozenset[str]
    #: Rows to record again: extended, cut short (`gap`), found without a row, or to be sealed.
    changed: list[SegmentRow]


def recover(directory: Path, rows: Sequence[SegmentRow], scratch: Path | None = None) -> Recovered:
    """What the files of a captures directory (and its ``scratch``, `archiver.live.scratch`) really
    hold against their checkpointed ``rows``: the keys whose files are all gone (a removal a crash
    cut short) and the rows to record again. ``rows`` name each lines file where it is found."""
    places = [directory] if scratch is None else [directory, scratch]
    if scratch is not None:
        _drop_twins(directory, scratch)
    # Captures removed (every file gone) whose rows a crash kept: their removal is finished now.
    keys = {row.key for row in rows}
    for row in rows:
        if row.state == FOLLOWING or row.path.exists() or (row.sealed and sealed_path(row).exists()):
            keys.discard(row.key)
    rows = [row for row in rows if row.key not in keys]
    changed: dict[tuple[str, int], SegmentRow] = {}
    for row in rows:
        kept = _recovered(row)
        if kept != row.kept:
            state = row.state if row.state == FOLLOWING or kept.size >= row.kept.size else Finish.GAP
            changed[(row.key, row.index)] = dataclasses.replace(row, kept=kept, state=state, sealed=None)
        elif row.sealed is not None and not _seal_holds(row):
            log.warning("live capture of %r: its seal is missing or short; sealing it again", row.session_id)
            changed[(row.key, row.index)] = dataclasses.replace(row, sealed=None)
    found = [row for place in places for row in _unrecorded(place, rows)]
    changed.update({(row.key, row.index): row for row in found})
    current = {(row.key, row.index): row for row in rows} | changed
    for key in {row.key for row in found}:  # a segment begins when the one before it diverged
        newest = max(index for k, index in current if k == key)
        for (k, index), row in current.items():
            if k == key and index < newest and row.state == FOLLOWING:
                changed[(k, index)] = dataclasses.replace(row, state=Finish.DIVERGED)
    # Finished segments without a seal (an older archiver's, or one whose seal was lost) are sealed now.
    for where, row in (current | changed).items():
        if row.state != FOLLOWING and row.sealed is None and row.kept.lines:
            changed[where] = row
    _sweep_seals(directory, list((current | changed).values()))
    if scratch is not None:
        for entry in scratch.glob("*.partial"):
            entry.unlink()
    return Recovered(frozenset(keys), list(changed.values()))


def _drop_twins(directory: Path, scratch: Path) -> None:
    """A lines file in both places is a spill a crash cut short after its copy was named: the
    copy holds every line (nothing is appended during a spill), the scratch's goes."""
    for entry in scratch.glob("*.log"):
        if (directory / entry.name).exists():
            log.info("live capture file %s was being moved out of the scratch: the moved copy is kept", entry.name)
            entry.unlink()


def _seal_holds(row: SegmentRow) -> bool:
    try:
        return row.sealed is not None and sealed_path(row).stat().st_size == row.sealed.size
    except FileNotFoundError:
        return False


def _sweep_seals(directory: Path, rows: Sequence[SegmentRow]) -> None:
    """Delete seals no row names (made for an older finish, or before a crash let their row
    commit) and seals left half written."""
    named = {sealed_path(row).name for row in rows if row.sealed is not None}
    for entry in directory.iterdir():
        if entry.name.endswith(".partial") or (entry.name.endswith(".gz") and entry.name not in named):
            entry.unlink()


def _unrecorded(directory: Path, rows: Sequence[SegmentRow]) -> list[SegmentRow]:
    """The files without a row (begun after the last checkpoint) rebuilt as segments, when a row
    of another segment names their session; the others are deleted (the replay brings their lines
    again), as are empty ones."""
    recorded = {row.path.name for row in rows}
    sessions = {row.path.name.partition(".")[0]: row for row in rows}
    found = []
    for entry in directory.iterdir():
        if not entry.name.endswith(".log") or entry.name in recorded:
            continue
        digest, _, index = entry.name.removesuffix(".log").partition(".")
        other = sessions.get(digest)
        if other is None or not index.isdigit() or not (kept := scan(entry, Kept())).lines:
            entry.unlink()
            continue
        with entry.open("rb") as f:  # the answer's shape was not recorded: its first line tells
            shape = NDJSON if starts_like_json(f.read(64)) else TEXT
        log.info("live capture of %r: segment %s began after the last checkpoint; kept", other.session_id, index)
        found.append(
            dataclasses.replace(
                other, index=int(index), shape=shape, kept=kept, state=FOLLOWING, path=entry, sealed=None
            )
        )
    return found


def _recovered(row: SegmentRow) -> Kept:
    """What the segment's file really holds, beyond or instead of its checkpoint."""
    if row.state != FOLLOWING and row.sealed is not None and not row.path.exists():
        if _seal_holds(row):
            return row.kept  # sealed: its seal holds the lines
        # A machine crash before a delayed seal was synced (`--follow-logs-seal-sync-delay`), its
        # lines file already gone: nothing is left to seal again (the read after the end may still
        # find the logs at the service).
        log.warning("live capture of %r segment %d: its seal was lost and no lines file is left; kept as a gap",
                    row.session_id, row.index)  # fmt: skip
        row.path.touch(mode=0o600)  # as every segment, an empty one has its lines file
        return Kept()
    try:
        size = row.path.stat().st_size
    except FileNotFoundError:
        log.warning("live capture file of %r segment %d is missing: starting it afresh", row.session_id, row.index)
        row.path.touch(mode=0o600)
        return Kept()
    if size < row.kept.size:
        log.warning("live capture file of %r is shorter than its checkpoint: re-reading it", row.session_id)
        return scan(row.path, Kept())
    if row.state != FOLLOWING:
        if size > row.kept.size:
            os.truncate(row.path, row.kept.size)  # nothing is appended after a segment finished
        return row.kept
    return scan(row.path, row.kept) if size > row.kept.size else row.kept
