"""The session-list parser's fast paths give exactly the reference results: entries remembered by a
keyed hash of their bytes (SHA-256 when the hash key is not secret), never by the bytes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

_PROBE = (
    "from archiver.upstream import models as m; "
    "p = m.SessionListParser(); "
    'p.parse(b\'{"sessions": [{"id": "a", "image": "i", "location": "l", "created": 1648472895000}]}\'); '
    "print(m._digests.__name__, type(next(iter(p._by_digest))).__name__)"
)


@pytest.mark.parametrize(
    ("seed", "expected"),
    [
        (None, "_keyed_hash_digests int"),
        ("random", "_keyed_hash_digests int"),
        ("0", "_sha256_digests bytes"),  # randomisation off: the key is all zeros
        ("12345", "_sha256_digests bytes"),  # a fixed key is a known key
    ],
)
def test_entries_are_remembered_by_a_keyed_hash_only_while_its_key_is_secret(seed: str | None, expected: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"}
    if seed is not None:
        env["PYTHONHASHSEED"] = seed
    out = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == expected.split()


def test_the_remembered_digests_hold_no_entry_bytes() -> None:
    from archiver.upstream.models import SessionListParser

    secret = "hunter2-do-not-leak"
    entry = {"id": "a", "image": "i", "location": "l", "created": 1648472895000, "labels": {"env": secret}}
    parser = SessionListParser()
    parser.parse(json.dumps({"sessions": [entry]}).encode())
    [digest] = parser._by_digest
    assert isinstance(digest, int | bytes) and secret.encode() not in repr(digest).encode()
