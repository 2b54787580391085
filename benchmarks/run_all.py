"""`make bench`: runs every benchmark in its own process and exits non-zero if any budget failed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
BENCHMARKS = [
    "scrape.py",
    "upload.py",
    "archive.py",
    "reconcile.py",
    "state.py",
    "retrieval.py",
    "browse.py",
    "sharded.py",
    "grep.py",
    "search_isolation.py",
    "verify.py",
    "follow.py",
    "tlog.py",
    "index.py",
    "mass_end.py",
]


def main() -> int:
    failed = []
    for name in BENCHMARKS:
        print(f"=== {name} ===", flush=True)
        result = subprocess.run([sys.executable, str(HERE / name)], check=False)
        if result.returncode != 0:
            failed.append(name)
    if failed:
        print(f"budgets missed in: {', '.join(failed)}")
        return 1
    print("all budgets met")
    return 0


if __name__ == "__main__":
    sys.exit(main())
