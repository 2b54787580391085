"""Process-wide effects happen at an entry point's start, under `ARCHIVER_PROCESS_TUNING`, never on
import: the open-file limit for the follow cap, the GC threshold, the keyed hash for list digests.
Each case runs in a fresh interpreter, so this test process keeps its own limits."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import textwrap
from typing import Any

import pytest

from archiver.live.loop import files_to_raise

#: The soft open-file limit each probe starts from: below what FOLLOWS need.
LOW = 256
FOLLOWS = 300

_PROBE = textwrap.dedent(
    f"""
    import gc, importlib, json, pkgutil, resource, sys

    resource.setrlimit(resource.RLIMIT_NOFILE, ({LOW}, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    threshold = gc.get_threshold()
    how, follows = sys.argv[1], int(sys.argv[2])
    import archiver

    if how == "import":
        for found in pkgutil.walk_packages(archiver.__path__, "archiver."):
            if not found.name.endswith("__main__"):
                importlib.import_module(found.name)
        from archiver.upstream.listparser import SessionListParser

        digests = SessionListParser().digests
    else:
        from archiver.app import process

        digests = process.apply(tuning=how == "apply", follows=follows).list_digests
    print(json.dumps({{
        "soft_limit": resource.getrlimit(resource.RLIMIT_NOFILE)[0],
        "gc_tuned": gc.get_threshold() != threshold,
        "digests": digests.__name__,
    }}))
    """
)


def _probe(how: str, follows: int, **env: str) -> dict[str, Any]:
    """`how`: "import" (every archiver module, nothing else), "apply" (as `archiver run`) or
    "untuned" (as `archiver archive`), in an interpreter with a random hash key unless `env` says."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < files_to_raise(FOLLOWS):
        pytest.skip(f"the hard open-file limit {hard} leaves no room to raise the soft one")
    base = {k: v for k, v in os.environ.items() if k not in ("PYTHONHASHSEED", "ARCHIVER_PROCESS_TUNING")}
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, how, str(follows)],
        env={**base, **env},
        capture_output=True,
        text=True,
        check=True,
    )
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def test_importing_every_archiver_module_changes_no_process_limit_and_keeps_sha256_digests() -> None:
    assert _probe("import", 0) == {"soft_limit": LOW, "gc_tuned": False, "digests": "sha256_digests"}


def test_the_daemons_start_raises_the_file_limit_for_its_follow_cap_and_picks_the_keyed_hash() -> None:
    assert _probe("apply", FOLLOWS) == {
        "soft_limit": files_to_raise(FOLLOWS),
        "gc_tuned": True,
        "digests": "keyed_hash_digests",
    }


def test_a_start_without_live_capture_leaves_the_file_limit_alone() -> None:
    assert _probe("apply", 0)["soft_limit"] == LOW


@pytest.mark.parametrize("switch", ["off", " OFF "])
def test_process_tuning_switched_off_leaves_the_limit_and_the_gc_alone_and_keeps_sha256(switch: str) -> None:
    assert _probe("apply", FOLLOWS, ARCHIVER_PROCESS_TUNING=switch) == {
        "soft_limit": LOW,
        "gc_tuned": False,
        "digests": "sha256_digests",
    }


@pytest.mark.parametrize("seed", ["0", "12345"])  # randomisation off (an all-zero key), a known key
def test_a_fixed_hash_seed_keeps_sha256_digests_under_the_tuning(seed: str) -> None:
    assert _probe("apply", FOLLOWS, PYTHONHASHSEED=seed) == {
        "soft_limit": files_to_raise(FOLLOWS),
        "gc_tuned": True,
        "digests": "sha256_digests",
    }


def test_an_entry_point_without_the_tuning_leaves_the_limit_the_gc_and_the_digests_alone() -> None:
    """`archiver archive`: one short run that follows nothing."""
    assert _probe("untuned", FOLLOWS) == {"soft_limit": LOW, "gc_tuned": False, "digests": "sha256_digests"}
