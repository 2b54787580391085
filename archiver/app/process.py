"""Process-wide effects, applied once from an entry point (`archiver run`, `archiver archive`), never on
import: what changes the whole interpreter is here, under one switch, `ARCHIVER_PROCESS_TUNING`.

ARCHITECTURE.md §11 lists every effect with a process-wide reach, those outside the switch too.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Mapping

from archiver.archive import crashpoints
from archiver.errors import ConfigError


def apply(environ: Mapping[str, str] = os.environ, *, tuning: bool = True) -> None:
    """At an entry point's start: arm the crash point `ARCHIVER_CRASH_AT` names (ConfigError for a
    bad value), and, with ``tuning`` (the long-running daemon), the tuning `tune_allocator` applies."""
    crashpoints.arm(environ)
    if tuning:
        tune_allocator(environ)


#: Net new container objects between two young-generation collections (CPython's default is 700).
GC_YOUNG_THRESHOLD = 20_000
#: `ARCHIVER_PROCESS_TUNING=off` leaves the interpreter's defaults alone (`tune_allocator`).
TUNING_ENV = "ARCHIVER_PROCESS_TUNING"


def tune_allocator(environ: Mapping[str, str] = os.environ) -> bool:
    """Raise the cyclic GC's young-generation threshold to GC_YOUNG_THRESHOLD, once, at start-up;
    False when switched off (`ARCHIVER_PROCESS_TUNING=off`), ConfigError for a value other than `on`
    or `off`.

    A poll that replaces a few percent of a large list leaves thousands of new long-lived containers
    (models, label dicts, cached lines); at the default threshold each poll set off many young and
    middle collections, and a full one every few polls, each rescanning them for cycles that nothing
    here makes (refcounting frees the garbage). The older generations keep their thresholds.

    It changes the behaviour of everything in the process: that is why it happens here, in the entry
    points (`archiver run`, and the benchmarks that stand for it), never on import. (glibc's mmap
    threshold used to be fixed here too; the streamed list and the block parts left no large
    per-poll buffer for it to help, and paired runs showed it cost CPU for no memory.)
    """
    raw = environ.get(TUNING_ENV, "on")
    value = raw.strip().lower()
    if value not in ("on", "off"):
        raise ConfigError(f"{TUNING_ENV}={raw!r}: expected on or off")
    if value == "off":
        return False
    gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])
    return True
