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
from archiver.tlog.checkpoint import Checkpoint, open_signed
from archiver.tlog.leaf import Leaf
from archiver.tlog.log import HISTORY, LogReader, history_path, read_object, writers
from archiver.tlog.merkle import leaf_hash, root_of
from archiver.tlog.note import Verifier
from archiver.tlog.tiles import TILE_WIDTH, decode_bundle, encode_bundle, tile_path, widths


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


def _parse_tile(path: str) -> tuple[int, int, int] | None:
    """(level, index, width) of a tile or bundle path (level -1: entries); None when it is not one."""
    head, _, width_text = path.partition(".p/")
    parts = head.split("/")
    if len(parts) < 3 or parts[0] != "tile":
        return None
    level_text, groups = parts[1], parts[2:]
    if not all(len(g) == 4 and g[0] == "x" and g[1:].isdigit() for g in groups[:-1]) or not groups[-1].isdigit():
        return None
    n = int("".join(g.removeprefix("x") for g in groups))
    width = int(width_text) if width_text.isdigit() else TILE_WIDTH
    if level_text == "entries":
        return -1, n, width
    return (int(level_text), n, width) if level_text.isdigit() else None


def _partials(sizes: set[int], size: int) -> set[str]:
    """The partial tiles and bundles that checkpoints of ``sizes`` need in a tree of ``size`` leaves
    (one whose full tile exists may be gone, as tlog-tiles allows)."""
    out: set[str] = set()
    for s in sizes:
        for level, n, w in widths(s):
            if (n + 1) * TILE_WIDTH <= size // TILE_WIDTH**level:
                continue
            out.add(tile_path(level, n, w))
            if level == 0:
                out.add(tile_path(-1, n, w))
    return out


def _check_tiles(
    reader: LogReader, entries: list[bytes], hashes: list[bytes], sizes: set[int], report: AuditReport
) -> None:
    """Every stored hash tile and entry bundle (full, partial, and earlier checkpoints' partials)
    against the same range of the entries; the tiles the checkpoints of ``sizes`` need must exist,
    and a partial tile no checkpoint needs means a checkpoint is missing from the history."""
    size = len(entries)
    levels = [hashes]
    while len(levels[-1]) >= TILE_WIDTH:
        tier = levels[-1]
        levels.append([root_of(tier[i : i + TILE_WIDTH]) for i in range(0, len(tier) - TILE_WIDTH + 1, TILE_WIDTH)])
    needed = _partials(sizes, size)
    partials = set(needed)
    for level, tier in enumerate(levels):
        for n in range(len(tier) // TILE_WIDTH):
            needed.add(tile_path(level, n))
            if level == 0:
                needed.add(tile_path(-1, n))
    prefix = reader.key("tile/")
    for key in reader.store.list_keys(prefix):
        path = key[len(reader.base) :]
        parsed = _parse_tile(path)
        if parsed is None:
            report.findings.append(Finding("tile-unknown", reader.writer, f"{path} is no tile of the layout"))
            continue
        level, n, width = parsed
        needed.discard(path)
        if width < TILE_WIDTH and path not in partials and n * TILE_WIDTH + width <= size:
            report.findings.append(
                Finding("checkpoint-history-missing", reader.writer, f"{path} belongs to no checkpoint kept")
            )
        if level < 0:
            want_entries = entries[n * TILE_WIDTH : n * TILE_WIDTH + width]
            if len(want_entries) < width:
                continue  # beyond the checkpoint (a crash before it was replaced): nothing to compare
            if read_object(reader.store, key) != encode_bundle(want_entries):
                report.findings.append(Finding("bundle-altered", reader.writer, f"{path} differs from the log"))
            continue
        tier = levels[level] if level < len(levels) else []
        want = tier[n * TILE_WIDTH : n * TILE_WIDTH + width]
        if len(want) < width:
            continue
        if read_object(reader.store, key) != b"".join(want):
            report.findings.append(Finding("tile-altered", reader.writer, f"{path} differs from its entries"))
    for path in sorted(needed):
        report.findings.append(Finding("tile-missing", reader.writer, path))


def _history(reader: LogReader, verifier: Verifier, current: Checkpoint, report: AuditReport) -> list[Checkpoint]:
    """The log's own checkpoint history (``checkpoints/<size>``), each verified."""
    found: list[Checkpoint] = []
    for key in reader.store.list_keys(reader.key(HISTORY)):
        try:
            old = open_signed(read_object(reader.store, key), verifier)
        except LogError as exc:
            report.findings.append(Finding("checkpoint-signature", f"{reader.writer} {key}", str(exc)))
            continue
        if key != reader.key(history_path(old.size)) or old.origin != current.origin:
            report.findings.append(Finding("history-altered", reader.writer, f"{key} holds another checkpoint"))
            continue
        found.append(old)
    return found


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
    history = _history(reader, verifier, cp, report)
    sizes = {cp.size}
    known = [(k, "a kept") for k in kept if k.origin == cp.origin] + [(h, "the log's own") for h in history]
    for old, whose in known:
        if old.size > cp.size:
            report.findings.append(
                Finding("rollback", where, f"{whose} checkpoint has {old.size} leaves, the log now {cp.size}")
            )
        elif root_of(hashes[: old.size]) != old.root:
            report.findings.append(
                Finding("fork", where, f"the first {old.size} leaves no longer give {whose} checkpoint's root")
            )
        else:
            sizes.add(old.size)
    if cp not in history:
        report.findings.append(Finding("checkpoint-history-missing", where, f"no history entry of size {cp.size}"))
    _check_tiles(reader, entries, hashes, sizes, report)
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
