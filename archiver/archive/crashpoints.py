"""Named crash points at the pipeline's durability boundaries, armed by `ARCHIVER_CRASH_AT` for crash tests.

`ARCHIVER_CRASH_AT=after_spool_rename` kills the process (exit code 137, as after `kill -9`) the
first time that point is reached; `after_part_upload:3` on the third hit. The environment is read
once, by `arm`, from an entry point (`archiver.app.process.apply`; a crash test's runner calls it
itself), never on import; disarmed, a crash point costs one comparison and behaviour never changes.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from typing import Final

from archiver.errors import ConfigError

ENV_VAR: Final = "ARCHIVER_CRASH_AT"
#: What `kill -9` leaves as exit status in a shell (128 + SIGKILL); tests wait for exactly this.
EXIT_CODE: Final = 137

#: Every point the pipeline places, in the order an item passes them.
POINTS: Final = (
    "after_spool_write",  # body written to spool/<id>.partial, before fsync
    "after_spool_rename",  # spool file renamed and directory fsynced, before the `spooled` commit
    "after_part_upload",  # a multipart part stored and journaled, before the next part
    "after_upload_complete",  # object stored and verified, before the `done` commit
    "after_outcome_commit",  # a group commit's `done` rows committed, before their spool files go
    "after_manifest",  # manifest stored, before the index entry and the `archived` commit
    "after_log_tiles",  # a log batch's tiles and bundles stored, before its checkpoint
    "after_log_checkpoint",  # a log batch's checkpoint stored, before its queue commit
)


def _parse(value: str | None) -> tuple[str, int] | None:
    """The armed point and hit number; ConfigError (one line, the known names) for a bad value."""
    if not value:
        return None
    name, _, nth = value.partition(":")
    if name not in POINTS:
        raise ConfigError(f"{ENV_VAR}={value!r}: unknown crash point; known: {', '.join(POINTS)}")
    if nth and not (nth.isascii() and nth.isdigit() and len(nth) <= 9):
        raise ConfigError(f"{ENV_VAR}={value!r}: the hit number must be a positive integer")
    count = int(nth) if nth else 1
    if count < 1:
        raise ConfigError(f"{ENV_VAR}={value!r}: the hit number must be >= 1")
    return name, count


_armed: tuple[str, int] | None = None
_hits = 0
_lock = threading.Lock()


def arm(environ: Mapping[str, str] = os.environ) -> None:
    """Arm the point `ARCHIVER_CRASH_AT` names (nothing when unset); ConfigError for a bad value."""
    global _armed, _hits
    armed = _parse(environ.get(ENV_VAR))
    with _lock:
        _armed, _hits = armed, 0


def crashpoint(name: str) -> None:
    """Exit the process at once (no cleanup, no flush) if `ARCHIVER_CRASH_AT` names this point and hit."""
    global _hits
    if _armed is None or _armed[0] != name:
        return
    with _lock:
        _hits += 1
        due = _hits == _armed[1]
    if due:
        # os._exit skips atexit handlers, finally blocks and buffered writes: exactly what a kill does.
        os._exit(EXIT_CODE)
