"""The Merkle core against RFC 6962's published vectors (transparency-dev/merkle) and random trees."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from archiver.errors import LogVerificationError
from archiver.tlog import merkle

VECTORS = Path(__file__).resolve().parents[1] / "data" / "rfc6962"


def _b64(value: str | None) -> bytes:
    return base64.b64decode(value or "")


def _proof(values: list[str] | None) -> list[bytes]:
    return [_b64(v) for v in values or []]


def _cases(kind: str) -> list[Any]:
    paths = sorted((VECTORS / kind).rglob("*.json"))
    assert len(paths) > 50, f"the {kind} vectors are missing"
    return [pytest.param(json.loads(p.read_text()), id=str(p.relative_to(VECTORS))) for p in paths]


@pytest.mark.parametrize("case", _cases("inclusion"))
def test_inclusion_vectors_verify_exactly_when_published_valid(case: dict[str, Any]) -> None:
    def verify() -> None:
        merkle.verify_inclusion(
            case["leafIdx"], case["treeSize"], _b64(case["leafHash"]), _proof(case["proof"]), _b64(case["root"])
        )

    if case["wantErr"]:
        with pytest.raises(LogVerificationError):
            verify()
    else:
        verify()


@pytest.mark.parametrize("case", _cases("consistency"))
def test_consistency_vectors_verify_exactly_when_published_valid(case: dict[str, Any]) -> None:
    def verify() -> None:
        merkle.verify_consistency(
            case["size1"], case["size2"], _b64(case["root1"]), _b64(case["root2"]), _proof(case["proof"])
        )

    if case["wantErr"]:
        with pytest.raises(LogVerificationError):
            verify()
    else:
        verify()


def test_hashes_match_rfc6962_known_answers() -> None:
    # transparency-dev/merkle rfc6962/rfc6962_test.go
    assert merkle.EMPTY_ROOT.hex() == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    assert merkle.leaf_hash(b"").hex() == "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d"
    assert merkle.leaf_hash(b"L123456").hex() == "395aa064aa4c29f7010acfe3f25db9485bbd4b91897b6ad7ad547639252b4d56"
    assert (
        merkle.node_hash(b"N123", b"N456").hex() == "aa217fe888e47007fa15edab33c2b492a722cb106c64667fc2b044444de66bbb"
    )


# The RFC 6962 test tree: its eight leaves, whose root the vectors' size-8 cases use.
RFC_LEAVES = [bytes.fromhex(h) for h in ("", "00", "10", "2021", "3031", "40414243", "5051525354555657")] + [
    bytes.fromhex("606162636465666768696a6b6c6d6e6f")
]


def test_root_of_the_rfc_tree_is_the_one_the_vectors_use() -> None:
    hashes = [merkle.leaf_hash(x) for x in RFC_LEAVES]
    happy = json.loads((VECTORS / "inclusion" / "1" / "happy-path.json").read_text())
    assert merkle.root_of(hashes) == _b64(happy["root"])
    assert merkle.inclusion_proof(happy["leafIdx"], 8, merkle.list_mth(hashes)) == _proof(happy["proof"])


# --- an independent reference: RFC 6962 §2.1's recursive definitions, literally -----------------


def _mth(d: list[bytes]) -> bytes:
    if not d:
        return hashlib.sha256(b"").digest()
    if len(d) == 1:
        return d[0]
    k = merkle.split_point(len(d))
    return merkle.node_hash(_mth(d[:k]), _mth(d[k:]))


def _path(m: int, d: list[bytes]) -> list[bytes]:
    if len(d) == 1:
        return []
    k = merkle.split_point(len(d))
    return [*_path(m, d[:k]), _mth(d[k:])] if m < k else [*_path(m - k, d[k:]), _mth(d[:k])]


def _subproof(m: int, d: list[bytes], b: bool) -> list[bytes]:
    n = len(d)
    if m == n:
        return [] if b else [_mth(d)]
    k = merkle.split_point(n)
    if m <= k:
        return [*_subproof(m, d[:k], b), _mth(d[k:])]
    return [*_subproof(m - k, d[k:], False), _mth(d[:k])]


def _leaves(n: int) -> list[bytes]:
    return [merkle.leaf_hash(i.to_bytes(4, "big")) for i in range(n)]


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 300), st.data())
def test_every_inclusion_proof_verifies_and_matches_the_rfc_definition(n: int, data: st.DataObject) -> None:
    hashes = _leaves(n)
    root = merkle.root_of(hashes)
    assert root == _mth(hashes)
    index = data.draw(st.integers(0, n - 1))
    proof = merkle.inclusion_proof(index, n, merkle.list_mth(hashes))
    assert proof == _path(index, hashes)
    merkle.verify_inclusion(index, n, hashes[index], proof, root)


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 300), st.data())
def test_every_consistency_proof_verifies_and_matches_the_rfc_definition(n: int, data: st.DataObject) -> None:
    hashes = _leaves(n)
    m = data.draw(st.integers(1, n))
    proof = merkle.consistency_proof(m, n, merkle.list_mth(hashes))
    assert proof == _subproof(m, hashes, True)
    merkle.verify_consistency(m, n, merkle.root_of(hashes[:m]), merkle.root_of(hashes), proof)


@settings(max_examples=150, deadline=None)
@given(st.integers(2, 300), st.data())
def test_a_mutated_inclusion_proof_fails(n: int, data: st.DataObject) -> None:
    hashes = _leaves(n)
    index = data.draw(st.integers(0, n - 1))
    proof = merkle.inclusion_proof(index, n, merkle.list_mth(hashes))
    root = merkle.root_of(hashes)
    # (A different tree size alone may lead to the same root: the checkpoint's signature binds it.)
    which = data.draw(st.sampled_from(["flip", "drop", "extra", "index"]))
    leaf, i = hashes[index], index
    if which == "flip":
        j = data.draw(st.integers(0, len(proof) - 1))
        bit = data.draw(st.integers(0, 255))
        p = bytearray(proof[j])
        p[bit // 8] ^= 1 << (bit % 8)
        proof[j] = bytes(p)
    elif which == "drop":
        proof.pop(data.draw(st.integers(0, len(proof) - 1)))
    elif which == "extra":
        proof.append(hashes[0])
    else:
        i = data.draw(st.integers(0, n - 1).filter(lambda x: x != index))
    with pytest.raises(LogVerificationError):
        merkle.verify_inclusion(i, n, leaf, proof, root)


@settings(max_examples=150, deadline=None)
@given(st.integers(2, 300), st.data())
def test_a_mutated_consistency_proof_fails(n: int, data: st.DataObject) -> None:
    hashes = _leaves(n)
    m = data.draw(st.integers(1, n - 1))
    proof = merkle.consistency_proof(m, n, merkle.list_mth(hashes))
    old, new = merkle.root_of(hashes[:m]), merkle.root_of(hashes)
    which = data.draw(st.sampled_from(["flip", "drop", "extra", "old_root", "new_root"]))
    if which == "flip":
        j = data.draw(st.integers(0, len(proof) - 1))
        p = bytearray(proof[j])
        p[data.draw(st.integers(0, 31))] ^= 0x80
        proof[j] = bytes(p)
    elif which == "drop":
        proof.pop(data.draw(st.integers(0, len(proof) - 1)))
    elif which == "extra":
        proof.append(hashes[0])
    elif which == "old_root":
        old = merkle.leaf_hash(old)
    else:
        new = merkle.leaf_hash(new)
    with pytest.raises(LogVerificationError):
        merkle.verify_consistency(m, n, old, new, proof)


def test_a_proof_for_a_leaf_outside_the_tree_is_refused() -> None:
    with pytest.raises(LogVerificationError):
        merkle.inclusion_proof(5, 5, merkle.list_mth(_leaves(5)))
    with pytest.raises(LogVerificationError):
        merkle.consistency_proof(6, 5, merkle.list_mth(_leaves(5)))
