"""`archiver verify`: re-reading archived sessions and reporting every object that differs from its manifest."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TextIO

from archiver.errors import (
    ArchiveIntegrityError,
    ManifestError,
    ObjectNotFoundError,
    SessionNotArchivedError,
    StoreError,
)
from archiver.layout import keys
from archiver.layout.manifest import (
    IndexEntry,
)
from archiver.retrieval.query import (
    LEGACY,
    Progress,
    Warn,
    find_archives,
    item_key,
    list_sessions,
    load_archive,
    quiet,
    stderr_warn,
)
from archiver.retrieval.render import human_size
from archiver.store.base import ObjectStore
from archiver.textsafe import printable
from archiver.vocabulary import Outcome


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong with one archived session."""

    session_id: str
    kind: str
    key: str
    detail: str
    #: The instance archive it concerns; ``None`` for the legacy archive or the id as a whole.
    instance: str | None = None

    def line(self) -> str:
        which = f" ({printable(self.instance)})" if self.instance is not None else ""
        return f"{printable(self.session_id)}{which}: {self.kind}: {printable(self.key)}: {printable(self.detail)}"


@dataclass(slots=True)
class VerifyReport:
    """Counts of `verify` and every problem found."""

    #: Archives verified (each instance of a reused id counts), plus ids found not archived.
    sessions: int = 0
    objects: int = 0
    bytes: int = 0
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def sessions_with_problems(self) -> int:
        """Archives with problems (two instances of one id count twice, like in ``sessions``)."""
        return len({(p.session_id, p.instance) for p in self.problems})


def _verify_one(
    store: ObjectStore, sid: str, name: str, check_index: bool, progress: Progress | None
) -> tuple[int, int, list[Problem]]:
    """(objects, bytes, problems) of the archive ``name`` (instance or ``legacy``): re-hash its objects."""
    # A name that is neither is the user's typo: reported as not archived, never turned into a key.
    known = name == LEGACY or keys.is_instance_name(name)
    instance = name if known and name != LEGACY else None
    if not sid:
        mkey = ""
    else:
        mkey = keys.manifest_key(store.prefix, sid, instance) if known else keys.session_prefix(store.prefix, sid)
    problems: list[Problem] = []
    try:
        loaded = load_archive(store, sid, name, note=quiet)
    except SessionNotArchivedError as exc:
        return 0, 0, [Problem(sid, "not_archived", mkey, str(exc), instance)]
    except ManifestError as exc:
        return 0, 0, [Problem(sid, "unreadable_manifest", mkey, str(exc), instance)]
    except ArchiveIntegrityError as exc:
        return 0, 0, [Problem(sid, "manifest_mismatch", mkey, str(exc), instance)]
    manifest = loaded.manifest
    objects = total = 0
    for item in manifest.items:
        if item.outcome != Outcome.ARCHIVED:
            continue
        try:
            key, _ = item_key(store, sid, item, instance)
        except ArchiveIntegrityError as exc:
            problems.append(Problem(sid, "unexpected_key", item.key or "", str(exc), instance))
            continue
        digest = hashlib.sha256()
        size = 0
        try:
            for chunk in store.iter_bytes(key):
                digest.update(chunk)
                size += len(chunk)
                if progress is not None:
                    progress(len(chunk))
        except ObjectNotFoundError:
            problems.append(Problem(sid, "missing_object", key, f"{item.kind} object is gone", instance))
            continue
        objects += 1
        total += size
        if size != item.size:
            problems.append(Problem(sid, "size_mismatch", key, f"stored {size} bytes, manifest {item.size}", instance))
        elif digest.hexdigest() != item.sha256:
            problems.append(
                Problem(sid, "sha256_mismatch", key, f"stored {digest.hexdigest()}, manifest {item.sha256}", instance)
            )
    if check_index:
        ikey = keys.index_key(store.prefix, manifest.ended_at, sid, instance)
        if store.head(ikey) is None:
            problems.append(Problem(sid, "missing_index", ikey, "`ls` cannot find this session", instance))
    return objects, total, problems


def _verify_id(
    store: ObjectStore, sid: str, name: str | None, check_index: bool, progress: Progress | None
) -> list[tuple[int, int, list[Problem]]]:
    """One result per archive verified: the archive ``name``, or every archive of ``sid`` (``None``)."""
    if name is not None:
        return [_verify_one(store, sid, name, check_index, progress)]
    refs = find_archives(store, sid)
    if not refs:
        where = keys.session_prefix(store.prefix, sid) if sid else ""
        return [(0, 0, [Problem(sid, "not_archived", where, "no manifest")])]
    return [_verify_one(store, sid, ref.name, check_index, progress) for ref in refs]


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
) -> VerifyReport:
    """`archiver verify`: re-hash stored objects against their manifests.

    With ``session_ids``: every archive of those ids (each instance of a reused id), or only the
    one named ``instance`` (an instance name or ``legacy``); also checks each archive has its
    index entry, else `ls` cannot find it. Otherwise every archive the index lists between
    ``since`` and ``until`` (default: the last 24 h). Problems are collected per archive
    (missing manifest or object, size or sha256 mismatch, a manifest naming a foreign key) and
    passed to ``on_problem`` as found; a store failure on one session is a ``store_error``
    problem, not the end of the run.
    """
    targets: list[tuple[str, str | None]]
    if session_ids:
        targets = [(sid, instance) for sid in dict.fromkeys(session_ids)]
        check_index = True
    else:
        entries = list_sessions(store, since=since, until=until, now=now, warn=warn)
        targets = list(dict.fromkeys((e.session_id, _entry_archive(store.prefix, e)) for e in entries))
        check_index = False
    report = VerifyReport()

    def run(target: tuple[str, str | None]) -> list[tuple[int, int, list[Problem]]]:
        sid, name = target
        try:
            return _verify_id(store, sid, name, check_index, progress)
        except StoreError as exc:
            # Broad on purpose: one unreachable object must not hide the verdict on the others.
            which = name if name is not None and keys.is_instance_name(name) else None
            return [(0, 0, [Problem(sid, "store_error", "", str(exc), which)])]

    with ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="verify") as pool:
        for results in pool.map(run, targets):
            for objects, total, problems in results:
                report.sessions += 1
                report.objects += objects
                report.bytes += total
                for problem in problems:
                    report.problems.append(problem)
                    if on_problem is not None:
                        on_problem(problem)
    return report


def render_verify(report: VerifyReport, out: TextIO, *, problems: bool = True) -> None:
    """Problems (one line each, unless already printed as found) and the verdict line."""
    if problems:
        for problem in report.problems:
            out.write(problem.line() + "\n")
    verdict = "OK" if report.ok else "FAILED"
    out.write(
        f"{verdict}: {report.sessions} session(s), {report.objects} object(s), {human_size(report.bytes)} "
        f"re-hashed; {len(report.problems)} problem(s) in {report.sessions_with_problems} session(s)\n"
    )
