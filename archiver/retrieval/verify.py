"""`archiver verify`: re-reading archived sessions and reporting every object that differs from its manifest."""

from __future__ import annotations

import functools
import multiprocessing
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TextIO

from archiver.errors import (
    ArchiveIntegrityError,
    ManifestError,
    SessionNotArchivedError,
    StoreError,
)
from archiver.index import reader as index_reader
from archiver.index.engine import PartFiles
from archiver.layout import keys
from archiver.layout.manifest import IndexEntry
from archiver.retrieval.proof import ManifestProof, Problem, Tally, prove, rehash_object
from archiver.retrieval.query import (
    DEFAULT_SINCE,
    LEGACY,
    Progress,
    Warn,
    fetch_entry,
    find_archives,
    item_key,
    load_archive,
    quiet,
    stderr_warn,
)
from archiver.retrieval.render import human_size
from archiver.store.base import ObjectStore
from archiver.vocabulary import Outcome

#: Archives per task handed to a verify process (large enough that pickling tallies is noise).
PROCESS_CHUNK = 250


@dataclass(slots=True)
class VerifyReport:
    """Counts of `verify` and every problem found."""

    #: Archives verified (each instance of a reused id counts), plus ids found not archived.
    sessions: int = 0
    objects: int = 0
    #: Bytes re-read and re-hashed (``deep``, or a store that keeps no checksums).
    bytes: int = 0
    #: Objects proved by the store's own SHA-256 checksum, without reading them.
    proved: int = 0
    #: Objects not provable by the store: archived without a store checksum (older archives, a
    #: store keeping none) or on a store that no longer answers it. Present with the right size,
    #: but their bytes are provable only by re-reading them (``deep``).
    unproven: int = 0
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def sessions_with_problems(self) -> int:
        """Archives with problems (two instances of one id count twice, like in ``sessions``)."""
        return len({(p.session_id, p.instance) for p in self.problems})


def _verify_one(
    store: ObjectStore, sid: str, name: str, check_index: bool, progress: Progress | None, deep: bool
) -> Tally:
    """(objects, bytes, problems) of the archive ``name`` (instance or ``legacy``): re-hash its objects."""
    # A name that is neither is the user's typo: reported as not archived, never turned into a key.
    known = name == LEGACY or keys.is_instance_name(name)
    instance = name if known and name != LEGACY else None
    if not sid:
        mkey = ""
    else:
        mkey = keys.manifest_key(store.prefix, sid, instance) if known else keys.session_prefix(store.prefix, sid)
    tally = Tally()
    try:
        loaded = load_archive(store, sid, name, note=quiet)
    except SessionNotArchivedError as exc:
        tally.problems.append(Problem(sid, "not_archived", mkey, str(exc), instance))
        return tally
    except ManifestError as exc:
        tally.problems.append(Problem(sid, "unreadable_manifest", mkey, str(exc), instance))
        return tally
    except ArchiveIntegrityError as exc:
        tally.problems.append(Problem(sid, "manifest_mismatch", mkey, str(exc), instance))
        return tally
    manifest = loaded.manifest
    # A directory keeps no checksum it verified itself: reading it is the only proof (and cheap).
    rehash = deep or not store.keeps_checksums
    manifest_proof = ManifestProof(store, loaded.ref.manifest_key)
    for item in manifest.items:
        if item.outcome != Outcome.ARCHIVED:
            continue
        try:
            key, _ = item_key(store, sid, item, instance)
        except ArchiveIntegrityError as exc:
            tally.problems.append(Problem(sid, "unexpected_key", item.key or "", str(exc), instance))
            continue
        if not rehash:
            prove(store, sid, key, item, instance, tally, manifest_proof)
            continue
        result = rehash_object(store, sid, key, item, instance, progress)
        if result is None:
            tally.problems.append(Problem(sid, "missing_object", key, f"{item.kind} object is gone", instance))
            continue
        tally.objects += 1
        tally.bytes += result[0]
        if result[1] is not None:
            tally.problems.append(result[1])
    if check_index:
        ikey = keys.index_key(store.prefix, manifest.ended_at, sid, instance)
        if store.head(ikey) is None:
            tally.problems.append(Problem(sid, "missing_index", ikey, "`ls` cannot find this session", instance))
    return tally


def _verify_id(
    store: ObjectStore, sid: str, name: str | None, check_index: bool, progress: Progress | None, deep: bool
) -> list[Tally]:
    """One result per archive verified: the archive ``name``, or every archive of ``sid`` (``None``)."""
    if name is not None:
        return [_verify_one(store, sid, name, check_index, progress, deep)]
    refs = find_archives(store, sid)
    if not refs:
        where = keys.session_prefix(store.prefix, sid) if sid else ""
        return [Tally(problems=[Problem(sid, "not_archived", where, "no manifest")])]
    return [_verify_one(store, sid, ref.name, check_index, progress, deep) for ref in refs]


def _entry_archive(prefix: str, entry: IndexEntry) -> str:
    """The archive (instance name or ``legacy``) an index entry stands for, from its manifest key.

    The key decides (it names what the entry was written for, whatever prefix it was copied
    from); the entry's ``instance`` field is the fallback for a key that does not parse.
    """
    _head, found, rest = entry.manifest_key.partition(f"sessions/{keys.escape_session_id(entry.session_id)}/")
    segment, sep, tail = rest.partition("/")
    if found and rest == "manifest.json":
        return LEGACY
    if found and sep and tail == "manifest.json" and keys.is_instance_name(segment):
        return segment
    return LEGACY if entry.instance is None else entry.instance


def _target_from_name(stem: str) -> tuple[str, str] | None:
    """(session id, archive) from an index entry's file name without ``.json``; None when the name
    cannot say (a shortened id, anything the archiver does not write)."""
    escaped, dot, instance = stem.partition(".")
    if keys.is_hashed_session_id(escaped):
        return None
    try:
        sid = keys.unescape_session_id(escaped)
    except ValueError:
        return None
    if not dot:
        return sid, LEGACY
    return (sid, instance) if keys.is_instance_name(instance) else None


def _index_targets(
    store: ObjectStore, *, since: float | None, until: float | None, now: float, warn: Warn, workers: int = 16
) -> list[tuple[str, str]]:
    """(session id, archive) of every archive the index lists as ended in ``[since, until]``.

    The same archives as ``list_sessions`` finds (the columnar index's parts for the hours they
    cover), for one request less per session: an entry's
    file name (``{escaped id}[.{instance}].json``) names its archive, and every entry of an hour
    partition inside the range ended inside it, so only the entries of the two edge hours and
    those whose name cannot say (a shortened id) are read.
    """
    start = now - DEFAULT_SINCE if since is None else since
    last = max(now, start) if until is None else until
    every = keys.index_partitions(store.prefix, start, last)
    edges = {every[0], every[-1]} if every else set()
    # Hours the columnar index covers come from its parts; only the others are listed.
    plan = index_reader.plan(store, start, last, now=now)
    partitions = [partition for partition, _ in plan.json_hours]
    files = PartFiles(store)
    indexed = index_reader.session_entries(plan.files(files), since=start, until=until)
    in_parts = plan.in_parts(files, store.prefix)  # late entries' hours are listed too: the others skipped

    def from_partition(partition: str) -> tuple[list[tuple[str, str]], list[str]]:
        named, unnamed = [], []
        for key in store.list_keys(partition):
            name = key[len(partition) :]
            if "/" in name or not name.endswith(".json") or key in in_parts:
                continue
            target = None if partition in edges else _target_from_name(name[: -len(".json")])
            if target is None:
                unnamed.append(key)
            else:
                named.append(target)
        return named, unnamed

    targets = [(entry.session_id, _entry_archive(store.prefix, entry)) for entry in indexed]
    to_read: list[str] = []
    with ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="verify-index") as pool:
        for named, unnamed in pool.map(from_partition, reversed(partitions)):
            targets.extend(named)
            to_read.extend(unnamed)
        for entry in pool.map(lambda key: fetch_entry(store, key, warn), to_read):
            if entry is not None and start <= entry.ended_at and (until is None or entry.ended_at <= until):
                targets.append((entry.session_id, _entry_archive(store.prefix, entry)))
    return targets


def verify(
    store: ObjectStore,
    *,
    session_ids: Sequence[str] = (),
    instance: str | None = None,
    since: float | None = None,
    until: float | None = None,
    now: float,
    progress: Progress | None = None,
    on_problem: Callable[[Problem], None] | None = None,
    workers: int = 4,
    warn: Warn = stderr_warn,
    deep: bool = True,
    opener: Callable[[], ObjectStore] | None = None,
    processes: int = 1,
    chunk: int = PROCESS_CHUNK,
) -> VerifyReport:
    """`archiver verify`: check stored objects against their manifests.

    ``deep`` (the default here; the command's ``--deep``) re-reads and re-hashes every byte.
    Otherwise each object is proved by the checksum the store verified on arrival and keeps
    (one HEAD each, nothing downloaded, see ``checksum_verdict``); objects archived without one
    are counted as ``unproven``; a store that keeps none (a directory) is re-hashed anyway.

    With ``session_ids``: every archive of those ids (each instance of a reused id), or only the
    one named ``instance`` (an instance name or ``legacy``); also checks each archive has its
    index entry, else `ls` cannot find it. Otherwise every archive the index lists between
    ``since`` and ``until`` (default: the last 24 h). Problems are collected per archive
    (missing manifest or object, size or sha256 mismatch, a manifest naming a foreign key) and
    passed to ``on_problem`` as found; a store failure on one session is a ``store_error``
    problem, not the end of the run.

    ``processes`` > 1 with an ``opener`` (a picklable callable opening the same store, e.g. a
    ``functools.partial`` of ``open_store``) spreads the archives over that many processes, each
    with ``workers`` threads, ``chunk`` archives at a time: the S3 client's CPU cost per request
    under the GIL, not the server, bounds one process. Used only for more than ``chunk`` archives
    of a store that keeps checksums, without ``progress``; the report is the same, in the same order.
    """
    targets: list[tuple[str, str | None]]
    if session_ids:
        targets = [(sid, instance) for sid in dict.fromkeys(session_ids)]
        check_index = True
    else:
        targets = list(dict.fromkeys(_index_targets(store, since=since, until=until, now=now, warn=warn)))
        check_index = False
    report = VerifyReport()
    spread = processes > 1 and len(targets) > chunk and store.keeps_checksums and progress is None
    if opener is not None and spread:
        tallies = _in_processes(opener, targets, check_index, deep, workers, processes, max(1, chunk))
    else:
        tallies = _in_threads(store, targets, check_index, progress, deep, workers)
    for results in tallies:
        for tally in results:
            report.sessions += 1
            report.objects += tally.objects
            report.bytes += tally.bytes
            report.proved += tally.proved
            report.unproven += tally.unproven
            for problem in tally.problems:
                report.problems.append(problem)
                if on_problem is not None:
                    on_problem(problem)
    return report


def _run_target(
    store: ObjectStore, target: tuple[str, str | None], check_index: bool, progress: Progress | None, deep: bool
) -> list[Tally]:
    """The tallies of one target; a store failure is that target's ``store_error`` problem."""
    sid, name = target
    try:
        return _verify_id(store, sid, name, check_index, progress, deep)
    except StoreError as exc:
        # Broad on purpose: one unreachable object must not hide the verdict on the others.
        which = name if name is not None and keys.is_instance_name(name) else None
        return [Tally(problems=[Problem(sid, "store_error", "", str(exc), which)])]


def _in_threads(
    store: ObjectStore,
    targets: Sequence[tuple[str, str | None]],
    check_index: bool,
    progress: Progress | None,
    deep: bool,
    workers: int,
) -> Iterator[list[Tally]]:
    """The tallies of each target in order, from a pool of ``workers`` threads over ``store``."""
    with ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="verify") as pool:
        yield from pool.map(lambda target: _run_target(store, target, check_index, progress, deep), targets)


#: The store of a verify process, opened once by ``_open_process_store`` (one client per process).
_process_store: ObjectStore | None = None


def _open_process_store(opener: Callable[[], ObjectStore]) -> None:
    global _process_store
    _process_store = opener()


def _verify_chunk(
    targets: list[tuple[str, str | None]], check_index: bool, deep: bool, workers: int
) -> list[list[Tally]]:
    """In a verify process: the tallies of each target of a chunk, in order."""
    assert _process_store is not None  # set by the pool's initializer
    return list(_in_threads(_process_store, targets, check_index, None, deep, workers))


def _in_processes(
    opener: Callable[[], ObjectStore],
    targets: Sequence[tuple[str, str | None]],
    check_index: bool,
    deep: bool,
    workers: int,
    processes: int,
    chunk: int,
) -> Iterator[list[Tally]]:
    """The tallies of each target in order, from ``processes`` processes of ``workers`` threads each."""
    chunks = [list(targets[at : at + chunk]) for at in range(0, len(targets), chunk)]
    # spawn, not fork: the parent's client holds threads and sockets a fork would copy mid-use.
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(
        max_workers=processes, mp_context=context, initializer=_open_process_store, initargs=(opener,)
    ) as pool:
        task = functools.partial(_verify_chunk, check_index=check_index, deep=deep, workers=workers)
        for results in pool.map(task, chunks):
            yield from results


def render_verify(
    report: VerifyReport, out: TextIO, *, problems: bool = True, require_store_proof: bool = False
) -> None:
    """Problems (one line each, unless already printed as found) and the verdict line; with
    ``require_store_proof`` objects not provable by the store fail the verdict (see `verify_failed`)."""
    if problems:
        for problem in report.problems:
            out.write(problem.line() + "\n")
    verdict = "FAILED" if verify_failed(report, require_store_proof=require_store_proof) else "OK"
    how = f"{human_size(report.bytes)} re-hashed"
    if report.proved or report.unproven:
        how = f"{report.proved} proved by the store's SHA-256 checksum without download"
        if report.bytes:
            how += f", {human_size(report.bytes)} re-hashed"
    out.write(
        f"{verdict}: {report.sessions} session(s), {report.objects} object(s), {how}; "
        f"{len(report.problems)} problem(s) in {report.sessions_with_problems} session(s)\n"
    )
    if report.unproven:
        what = "NOT PROVED (--require-store-proof)" if require_store_proof else "NOT PROVABLE without --deep"
        out.write(
            f"{what}: {report.unproven} object(s) not provable by the store (it keeps no SHA-256 checksum for "
            "them, or they were archived without one); present with the right size: run "
            "`archiver verify --deep` to re-hash their bytes\n"
        )


def verify_failed(report: VerifyReport, *, require_store_proof: bool = False) -> bool:
    """The verdict: a problem found, or (``require_store_proof``) an object the store cannot prove."""
    return not report.ok or (require_store_proof and report.unproven > 0)
