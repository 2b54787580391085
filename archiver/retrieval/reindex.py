"""`archiver index-players`: writes the player index entries of archives made before that index existed.

Walks the manifests (``sessions/…/manifest.json``, the archives' commit markers) in key order and
writes each archive's ``players/…`` entries exactly as the pipeline does (``layout.players``):
create-once, so an entry already there with the same bytes is success and running it again
changes nothing. It works in batches; after each batch the last manifest key done is handed to
``on_batch`` (the CLI keeps it in a checkpoint file), and ``start_after`` resumes after it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from itertools import islice

from archiver.errors import ManifestError, ObjectConflictError, ObjectNotFoundError
from archiver.layout import keys
from archiver.layout.manifest import parse_manifest
from archiver.layout.players import player_entries
from archiver.retrieval.query import DEFAULT_WORKERS, Warn, stderr_warn
from archiver.store.base import ObjectStore, PutOutcome
from archiver.textsafe import printable

#: Manifests read (in parallel) between two checkpoints.
BATCH = 256

_JSON = "application/json"


@dataclass(slots=True)
class ReindexReport:
    """What a backfill did: manifests read, entries written or found in place, archives it could not index."""

    manifests: int = 0
    written: int = 0
    already_present: int = 0
    problems: list[str] = field(default_factory=list)
    #: The last manifest key of the last complete batch: resume with ``start_after`` set to it.
    last_key: str | None = None

    def line(self) -> str:
        return (
            f"{self.manifests} manifests read, {self.written} player index entries written, "
            f"{self.already_present} already present, {len(self.problems)} problems"
        )


@dataclass(frozen=True, slots=True)
class _Done:
    written: int
    present: int
    problem: str | None = None


def _batches(items: Iterable[str], size: int) -> Iterator[list[str]]:
    iterator = iter(items)
    while batch := list(islice(iterator, size)):
        yield batch


def _index_one(store: ObjectStore, key: str) -> _Done:
    """Write the player entries of the manifest at ``key``; problems are reported, store outages raised."""
    try:
        manifest = parse_manifest(b"".join(store.iter_bytes(key)))
    except ObjectNotFoundError:
        return _Done(0, 0)  # removed between the listing and the read
    except ManifestError as exc:
        return _Done(0, 0, f"{printable(key)}: {exc}")
    if keys.manifest_key(store.prefix, manifest.session_id, manifest.instance) != key:
        # A manifest must not index itself as another session (copied or planted under this key).
        return _Done(0, 0, f"{printable(key)}: the manifest describes session {printable(manifest.session_id)}")
    written = present = 0
    for entry_key, body in player_entries(store.prefix, manifest, key):
        try:
            outcome = store.put_bytes(entry_key, body, content_type=_JSON)
        except ObjectConflictError as exc:
            return _Done(written, present, f"{printable(key)}: {exc}")
        if outcome is PutOutcome.CREATED:
            written += 1
        else:
            present += 1
    return _Done(written, present)


def index_players(
    store: ObjectStore,
    *,
    start_after: str = "",
    workers: int = DEFAULT_WORKERS,
    batch: int = BATCH,
    on_batch: Callable[[ReindexReport], None] | None = None,
    warn: Warn = stderr_warn,
) -> ReindexReport:
    """Backfill the player index of every archive in ``store`` (after the manifest key ``start_after``).

    Unreadable manifests and entries held by other bytes are reported through ``warn`` and
    counted, and the walk goes on; a store outage raises (resume from the last checkpoint).
    """
    report = ReindexReport()
    base = f"{store.prefix}sessions/"
    manifests = (k for k in store.list_keys(base, start_after=start_after) if k.endswith("/manifest.json"))
    with ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="index-players") as pool:
        for keys_batch in _batches(manifests, max(1, batch)):
            for done in pool.map(lambda key: _index_one(store, key), keys_batch):
                report.written += done.written
                report.already_present += done.present
                if done.problem is not None:
                    report.problems.append(done.problem)
                    warn(done.problem)
            report.manifests += len(keys_batch)
            report.last_key = keys_batch[-1]
            if on_batch is not None:
                on_batch(report)
    return report
