"""`archiver verify --log`: every log of a store and every archive in it, checked against each other.

For each writer's log: the checkpoint's signature (the log's key), the root recomputed from the
entry bundles themselves (not trusting the hash tiles), every stored hash tile against the hashes
recomputed from the entries, consistency with the checkpoints the user kept (a file, a witness),
and each leaf's archive: its manifest must exist with the leaf's SHA-256 (and, with ``objects``,
every archived object its manifest's SHA-256 and size). Then every manifest in the store must be
a leaf of some log. Each problem is one :class:`Finding` naming what and where.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field

from archiver.errors import LogError, ObjectNotFoundError, StoreError
from archiver.layout import keys
from archiver.layout.manifest import parse_manifest
from archiver.store.base import ObjectStore
from archiver.tlog.checkpoint import Checkpoint
from archiver.tlog.leaf import Leaf
from archiver.tlog.log import LogReader, read_object, writers
from archiver.tlog.merkle import leaf_hash, root_of
from archiver.tlog.note import Verifier
from archiver.tlog.tiles import TILE_WIDTH, decode_bundle, tile_path, widths


@dataclass(frozen=True, slots=True)
class Finding:
    """One problem: its kind (a stable word), where (a log or an archive), what was seen."""

    kind: str
    where: str
    detail: str

    def line(self) -> str:
        return f"{self.kind}: {self.where}: {self.detail}"


@dataclass
class AuditReport:
    logs: dict[str, int] = field(default_factory=dict)
    leaves: int = 0
    archives: int = 0
    findings: list[Finding] = field(default_factory=list)


def _entries(reader: LogReader, size: int) -> list[bytes]:
    out: list[bytes] = []
    for n in range((size + TILE_WIDTH - 1) // TILE_WIDTH):
        width = min(TILE_WIDTH, size - n * TILE_WIDTH)
        bundle = decode_bundle(reader.read_tile(-1, n, width))
        if len(bundle) != width:
            raise LogError(f"entry bundle {tile_path(-1, n, width)} holds {len(bundle)} entries, not {width}")
        out.extend(bundle)
    return out


def _check_tiles(reader: LogReader, hashes: list[bytes], size: int, report: AuditReport) -> None:
    """Every hash tile of a tree of ``size`` (full ones and this size's partials) against ``hashes``
    (the level-0 hashes recomputed from the entries)."""
    level, tier = 0, hashes
    partial = {(lvl, n): w for lvl, n, w in widths(size)}
    while tier:
        for n in range((len(tier) + TILE_WIDTH - 1) // TILE_WIDTH):
            want = tier[n * TILE_WIDTH : (n + 1) * TILE_WIDTH]
            width = len(want)
            if width < TILE_WIDTH and partial.get((level, n)) != width:
                continue
            path = tile_path(level, n, width)
            try:
                stored = reader.read_tile(level, n, width)
            except ObjectNotFoundError:
                report.findings.append(Finding("tile-missing", reader.writer, path))
                continue
            if stored != b"".join(want):
                report.findings.append(Finding("tile-altered", reader.writer, f"{path} differs from its entries"))
        tier = [root_of(tier[i : i + TILE_WIDTH]) for i in range(0, len(tier) - TILE_WIDTH + 1, TILE_WIDTH)]
        level += 1


def _audit_log(
    store: ObjectStore, writer: str, verifier: Verifier, kept: Sequence[Checkpoint], report: AuditReport
) -> dict[str, tuple[str, int, Leaf]]:
    reader = LogReader(store, writer)
    where = f"log {writer}"
    try:
        head = reader.head(verifier)
    except LogError as exc:
        report.findings.append(Finding("checkpoint-signature", where, str(exc)))
        return {}
    if head is None:
        report.findings.append(Finding("checkpoint-missing", where, "the log has tiles but no checkpoint"))
        return {}
    cp = head.checkpoint
    report.logs[writer] = cp.size
    try:
        entries = _entries(reader, cp.size)
    except (LogError, ObjectNotFoundError) as exc:
        report.findings.append(Finding("entries-unreadable", where, str(exc)))
        return {}
    hashes = [leaf_hash(e) for e in entries]
    if root_of(hashes) != cp.root:
        report.findings.append(Finding("root-mismatch", where, "the entries do not give the signed checkpoint's root"))
    _check_tiles(reader, hashes, cp.size, report)
    for old in kept:
        if old.origin != cp.origin:
            continue
        if old.size > cp.size:
            report.findings.append(
                Finding("rollback", where, f"a kept checkpoint has {old.size} leaves, the log now {cp.size}")
            )
        elif root_of(hashes[: old.size]) != old.root:
            report.findings.append(
                Finding("fork", where, f"the first {old.size} leaves no longer give the kept checkpoint's root")
            )
    found: dict[str, tuple[str, int, Leaf]] = {}
    for index, entry in enumerate(entries):
        try:
            leaf = Leaf.decode(entry)
        except LogError as exc:
            report.findings.append(Finding("leaf-malformed", f"{where} leaf {index}", str(exc)))
            continue
        found[leaf.manifest_sha256] = (writer, index, leaf)
    report.leaves += len(entries)
    return found


def _check_objects(store: ObjectStore, where: str, data: bytes, report: AuditReport) -> None:
    manifest = parse_manifest(data)
    for item in manifest.items:
        if item.outcome != "archived" or not item.key or not item.sha256:
            continue
        digest, size = hashlib.sha256(), 0
        try:
            for chunk in store.iter_bytes(item.key):
                digest.update(chunk)
                size += len(chunk)
        except ObjectNotFoundError:
            report.findings.append(Finding("object-missing", where, item.key))
            continue
        if digest.hexdigest() != item.sha256 or size != item.size:
            report.findings.append(Finding("object-altered", where, f"{item.key} differs from its manifest"))


def audit(
    store: ObjectStore, verifier: Verifier, *, kept: Sequence[Checkpoint] = (), objects: bool = False
) -> AuditReport:
    """Check every log and every archive of ``store`` (see the module docstring)."""
    report = AuditReport()
    logged: dict[str, tuple[str, int, Leaf]] = {}
    for writer in writers(store):
        logged.update(_audit_log(store, writer, verifier, kept, report))
    origins = {f"{verifier.name}/{w}" for w in report.logs}
    for old in kept:
        if old.origin not in origins:
            report.findings.append(Finding("log-missing", old.origin, "a kept checkpoint's log is gone"))
    seen: set[str] = set()
    for sha, (writer, index, leaf) in logged.items():
        where = f"archive {leaf.session} {leaf.instance or 'legacy'} (log {writer} leaf {index})"
        try:
            key = keys.manifest_key(store.prefix, leaf.session, leaf.instance)
            data = read_object(store, key)
        except ObjectNotFoundError:
            report.findings.append(Finding("archive-deleted", where, "its manifest is gone"))
            continue
        except (ValueError, StoreError) as exc:
            report.findings.append(Finding("archive-unreadable", where, str(exc)))
            continue
        seen.add(key)
        if hashlib.sha256(data).hexdigest() != sha:
            report.findings.append(Finding("manifest-replaced", where, "its manifest differs from the logged one"))
            continue
        if objects:
            _check_objects(store, where, data, report)
    root = keys.check_prefix(store.prefix) + "sessions/"
    for key in store.list_keys(root):
        if not key.endswith("/manifest.json"):
            continue
        report.archives += 1
        if key not in seen:
            report.findings.append(Finding("archive-not-logged", key, "a manifest that no checkpointed log holds"))
    return report
