"""Benchmark of the transparency log: appends per second, `prove` + `verify-bundle` latency, log size.

Usage: python benchmarks/tlog.py [--leaves 200000] [--batch 10000] [--locators 10000]
       [--budget-appends 2000] [--budget-prove-ms 50]

A directory store (a temporary directory on this machine's disk, every tile fsynced as the daemon
writes it) receives ``--leaves`` canonical leaves through ``TileLog.append`` in batches of
``--batch`` (one signed checkpoint, history entry and set of partial tiles per batch, as the log
stage does every 10 s). The same-run baseline is the leaves' SHA-256 alone (what any log must
hash): the ratio says how much the tiles, the signatures and the store cost on top. ``--locators``
more leaves are then appended with a locator object each, as the log stage does (its rate is
reported; the budget is the log's). Then five real
archives are stored and logged at the end of the tree, and ``prove`` (locator, tiles, inclusion
proof, bundle) followed by ``standalone.verify`` (what `verify-bundle` runs) is timed 30 times:
the median is the figure. The log's bytes on disk (tiles, bundles, partials, history) are
reported per million archives, locators (one small object per archive) separately.
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from archiver.layout import keys
from archiver.store import open_store
from archiver.tlog import standalone
from archiver.tlog.leaf import Leaf
from archiver.tlog.log import TileLog
from archiver.tlog.note import Signer
from archiver.tlog.prove import LOCATOR_WORKERS, Location, prove, write_locator, write_locators
from tests.support import put_session

SIGNER = Signer("bench.example/log", hashlib.sha256(b"bench").digest())


def leaves(n: int) -> list[bytes]:
    return [
        Leaf.of(hashlib.sha256(b"%d" % i).hexdigest(), f"bench-{i:07d}", "20261127T000000.000Z", 1.79e9 + i).encode()
        for i in range(n)
    ]


def tree_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--leaves", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=10_000)
    parser.add_argument("--locators", type=int, default=10_000, help="leaves appended with their locators")
    parser.add_argument("--budget-appends", type=float, default=2_000.0)
    parser.add_argument("--budget-prove-ms", type=float, default=50.0)
    args = parser.parse_args()
    entries = leaves(args.leaves)

    started = time.perf_counter()
    for entry in entries:
        hashlib.sha256(b"\x00" + entry).digest()
    baseline = time.perf_counter() - started

    with tempfile.TemporaryDirectory(prefix="bench-tlog-", dir=Path.home()) as tmp:
        root = Path(tmp) / "store"
        root.mkdir()
        store = open_store(root.as_uri())
        log = TileLog(store, "shard-0-replica-0", SIGNER)
        log.open()
        started = time.perf_counter()
        for lo in range(0, len(entries), args.batch):
            log.append(entries[lo : lo + args.batch])
        elapsed = time.perf_counter() - started
        rate = len(entries) / elapsed
        log_bytes = tree_bytes(root / "log")
        # What the log stage does per batch besides: one locator per archive (a create-once object).
        located = entries[: args.locators]
        started = time.perf_counter()
        first = log.append(located)
        logged = [(first + i, entry) for i, entry in enumerate(located)]
        write_locators(store, "shard-0-replica-0", logged, "2026-11-27T00:00:00.000Z")
        stage_rate = len(located) / (time.perf_counter() - started)

        manifests = [put_session(store, f"proof-{i}", ended_at=1.79e9 + i) for i in range(5)]
        real = []
        for m in manifests:
            data = (root / keys.manifest_key("", m.session_id, m.instance)).read_bytes()
            real.append(Leaf.of(hashlib.sha256(data).hexdigest(), m.session_id, m.instance, m.archived_at))
        first = log.append([leaf.encode() for leaf in real])
        before = tree_bytes(root / "log-locators")
        for i, leaf in enumerate(real):
            write_locator(store, leaf, Location("shard-0-replica-0", first + i, "2026-11-27T00:00:00.000Z"))
        locator_bytes = (tree_bytes(root / "log-locators") - before) / len(real)
        vkey = SIGNER.verifier.encode()
        samples = []
        for n in range(30):
            m = manifests[n % len(manifests)]
            started = time.perf_counter()
            bundle = prove(store, SIGNER.verifier, m.session_id, m.instance)
            standalone.verify(bundle, vkey)
            samples.append((time.perf_counter() - started) * 1000)
        prove_ms = statistics.median(samples)

    per_million = log_bytes * 1_000_000 / len(entries)
    # The budget is the log's (the "appends"); locators are a finding aid, reported beside it.
    ok = rate >= args.budget_appends and prove_ms <= args.budget_prove_ms
    print(f"appends: {len(entries):,} leaves in batches of {args.batch:,}: {rate:,.0f} archives/s "
          f"({elapsed:.2f} s; hashing the leaves alone {baseline:.3f} s: {elapsed / baseline:.0f}x) "
          f"budget >= {args.budget_appends:,.0f}/s")  # fmt: skip
    print(f"appends with a locator each (the log stage's work, {LOCATOR_WORKERS} locator writes at once): "
          f"{len(located):,} leaves: {stage_rate:,.0f} archives/s (no budget: one fsynced file each here)")  # fmt: skip
    p90 = statistics.quantiles(samples, n=10)[-1]
    print(f"prove + verify-bundle at {len(entries) + len(real):,} leaves: median {prove_ms:.1f} ms "
          f"(p90 {p90:.1f} ms) budget <= {args.budget_prove_ms:.0f} ms")  # fmt: skip
    print(f"log size: {log_bytes / 1e6:.1f} MB for {len(entries):,} leaves = {per_million / 1e6:.0f} MB per million "
          f"archives (+ locators {locator_bytes:.0f} B each = {locator_bytes:.0f} MB per million)")  # fmt: skip
    print("budgets " + ("met" if ok else "MISSED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
