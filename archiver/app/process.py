"""Process-wide effects, applied once from an entry point (`archiver run`, `archiver demo`, `archiver
archive`), never on import: what changes the whole interpreter is here, under one switch,
`ARCHIVER_PROCESS_TUNING`.

ARCHITECTURE.md §11 lists every effect with a process-wide reach, those outside the switch too.
"""

from __future__ import annotations

import contextlib
import gc
import os
import resource
from collections.abc import Mapping
from dataclasses import dataclass

from archiver.archive import crashpoints
from archiver.errors import ConfigError
from archiver.live.loop import files_to_raise
from archiver.upstream.sessionlist import HASH_KEY_SECRET, Digests, keyed_hash_digests, sha256_digests


@dataclass(frozen=True, slots=True)
class Applied:
    """What `apply` chose that the entry point hands on to what it builds."""

    #: How the poller's list parser remembers entries (`SessionListParser(digests=...)`).
    list_digests: Digests = sha256_digests


def apply(environ: Mapping[str, str] = os.environ, *, tuning: bool = True, follows: int = 0) -> Applied:
    """At an entry point's start: arm the crash point `ARCHIVER_CRASH_AT` names (ConfigError for a
    bad value); with ``tuning`` (the long-running daemon, and the demo that runs one) and the
    switch on: the GC threshold (`tune_allocator`), the open-file limit raised for ``follows`` live
    follows (the follow cap, 0 without live capture: `raise_file_limit`), and the keyed hash for
    list digests (`list_digests`). Returns the choices the entry point hands on."""
    crashpoints.arm(environ)
    if not (tuning and tune_allocator(environ)):
        return Applied()
    if follows:
        raise_file_limit(files_to_raise(follows))
    return Applied(list_digests=list_digests(environ))


#: Net new container objects between two young-generation collections (CPython's default is 700).
GC_YOUNG_THRESHOLD = 20_000
#: `ARCHIVER_PROCESS_TUNING=off` leaves the interpreter's defaults alone (`tuning_on`).
TUNING_ENV = "ARCHIVER_PROCESS_TUNING"


def tuning_on(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether `ARCHIVER_PROCESS_TUNING` is on (the default) or off; ConfigError for another value."""
    raw = environ.get(TUNING_ENV, "on")
    value = raw.strip().lower()
    if value not in ("on", "off"):
        raise ConfigError(f"{TUNING_ENV}={raw!r}: expected on or off")
    return value == "on"


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
    if not tuning_on(environ):
        return False
    gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])
    return True


def raise_file_limit(files: int) -> int:
    """Raise this process's open-file soft limit to ``files``, as far as the hard limit allows (never
    lower it); returns the soft limit after.

    A daemon following thousands of sessions holds two descriptors per follow (`live.loop.files_for`)
    and a seal's after it ends (`files_to_raise`), past the 1,024 many systems start a process with.
    The limit is the whole process's, so it is raised here, by the entry point, for the configured
    follow cap; live capture only reads it and follows what it leaves room for (`LiveCapture.start`,
    with a warning)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < files:
        target = files if hard == resource.RLIM_INFINITY else min(files, hard)
        with contextlib.suppress(ValueError, OSError):  # not allowed: live capture warns and follows fewer
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def list_digests(environ: Mapping[str, str] = os.environ) -> Digests:
    """The digests the poller's list parser remembers entries by: Python's keyed `hash()` when the
    switch is on and the interpreter's hash key is secret (`sessionlist.HASH_KEY_SECRET`: no fixed
    `PYTHONHASHSEED`), SHA-256 otherwise (the same in every process). Chooses, changes nothing: a
    benchmark that stands for the poll path alone may ask it without the rest of `apply`."""
    return keyed_hash_digests if tuning_on(environ) and HASH_KEY_SECRET else sha256_digests
