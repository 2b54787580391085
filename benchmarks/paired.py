"""Paired A/B runs of one benchmark: is a speed technique worth its code? (ARCHITECTURE.md §11)

Usage: python benchmarks/paired.py --bench scrape.py --runs 3 \\
           base=. off=.:ARCHIVER_PROCESS_TUNING=off [other=/tmp/tree] -- --sessions 10000 --polls 10

Each variant is `name=TREE[:ENV=VALUE,...]`: the benchmark script of that source tree (every
benchmark puts its own tree first on `sys.path`), run with those environment variables. The
variants take turns within each run (ABAB..., the order reversed every other run), so a shared
machine's load falls on all of them alike; the report gives, per figure of the benchmark's JSON,
each variant's median over the runs and its ratio to the first variant. Keep runs short (fewer
polls and sizes than `make bench`) and say so beside any figure taken from here.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any


def parse_variant(text: str) -> tuple[str, Path, dict[str, str]]:
    """`name=TREE[:ENV=VALUE,...]` → (name, tree, extra environment)."""
    name, _, rest = text.partition("=")
    tree, _, env_text = rest.partition(":")
    if not name or not tree:
        raise SystemExit(f"a variant is name=TREE[:ENV=VALUE,...], got {text!r}")
    env = dict(item.split("=", 1) for item in env_text.split(",") if item)
    return name, Path(tree).resolve(), env


def flatten(value: Any, prefix: str = "") -> dict[str, float]:
    """Every number of a benchmark's JSON, by a dotted path (a list item is named by its `sessions`,
    `shard` and `total` when it has them, else by its index)."""
    out: dict[str, float] = {}
    if isinstance(value, bool):
        return out
    if isinstance(value, int | float):
        return {prefix: float(value)}
    if isinstance(value, dict):
        for key, item in value.items():
            out.update(flatten(item, f"{prefix}.{key}" if prefix else str(key)))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            label = str(index)
            if isinstance(item, dict) and "sessions" in item:
                label = "/".join(str(item[k]) for k in ("shard", "total", "sessions") if k in item)
            out.update(flatten(item, f"{prefix}[{label}]"))
    return out


def run_once(bench: str, tree: Path, env: dict[str, str], args: list[str]) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="archiver-paired-") as tmp:
        out = Path(tmp) / "result.json"
        script = tree / "benchmarks" / bench
        subprocess.run(
            [sys.executable, str(script), *args, "--json", str(out)],
            cwd=tree,
            env={**os.environ, **env},
            check=False,  # a missed budget still measured something
            stdout=subprocess.DEVNULL,
        )
        if not out.exists():
            raise SystemExit(f"{script} wrote no JSON")
        return flatten(json.loads(out.read_text()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bench", required=True, help="a script of benchmarks/ that takes --json")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--keys", default="", help="comma-separated substrings: report only matching figures")
    parser.add_argument("variants", nargs="+", help="name=TREE[:ENV=VALUE,...]; the first is the reference")
    argv = sys.argv[1:] if argv is None else argv
    split = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:split])
    bench_args = argv[split + 1 :]
    variants = [parse_variant(v) for v in args.variants]
    samples: dict[str, list[dict[str, float]]] = {name: [] for name, _, _ in variants}
    for run in range(args.runs):
        order = variants if run % 2 == 0 else variants[::-1]
        for name, tree, env in order:
            print(f"run {run + 1}/{args.runs}: {name}", file=sys.stderr, flush=True)
            samples[name].append(run_once(args.bench, tree, env, bench_args))
    reference = variants[0][0]
    wanted = [k for k in args.keys.split(",") if k]
    keys = [k for k in samples[reference][0] if not wanted or any(w in k for w in wanted)]
    names = [name for name, _, _ in variants]
    print(f"{args.bench} {' '.join(bench_args)}: median of {args.runs} paired runs")
    ratios = "".join(f"{n + '/' + reference:>18}" for n in names[1:])
    print(f"{'figure':52}" + "".join(f"{n:>14}" for n in names) + ratios)
    for key in keys:
        medians = [statistics.median(s[key] for s in samples[n] if key in s) for n in names]
        ratios = [f"{m / medians[0]:.3f}" if medians[0] else "-" for m in medians[1:]]
        print(f"{key:52}" + "".join(f"{m:>14.2f}" for m in medians) + "".join(f"{r:>18}" for r in ratios))
    return 0


if __name__ == "__main__":
    sys.exit(main())
