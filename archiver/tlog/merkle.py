"""RFC 6962 Merkle tree hashing, inclusion and consistency proofs (RFC 9162 §2.1), pure and stdlib-only.

Proofs are generated over a ``mth(lo, hi)`` callback (the Merkle Tree Hash of leaves ``[lo, hi)``)
so that an in-memory list and the tiles in a store share one algorithm; verification needs only
the hashes. Every function here is also copied verbatim into the standalone verifier's logic
(``archiver/tlog/standalone.py`` imports nothing from the archiver).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence

from archiver.errors import LogVerificationError

HASH_SIZE = 32
#: SHA-256 of nothing: the root of the empty tree.
EMPTY_ROOT = hashlib.sha256(b"").digest()

#: The Merkle Tree Hash of leaves [lo, hi).
SubtreeHash = Callable[[int, int], bytes]


def leaf_hash(data: bytes) -> bytes:
    """RFC 6962 leaf hash: SHA-256(0x00 || data)."""
    return hashlib.sha256(b"\x00" + data).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    """RFC 6962 interior node hash: SHA-256(0x01 || left || right)."""
    return hashlib.sha256(b"\x01" + left + right).digest()


def split_point(n: int) -> int:
    """The largest power of two smaller than ``n`` (n ≥ 2): where RFC 6962 splits a tree."""
    return 1 << ((n - 1).bit_length() - 1)


def root_of(hashes: Sequence[bytes]) -> bytes:
    """The Merkle Tree Hash of already-hashed leaves (a perfect or left-perfect tree), iteratively."""
    if not hashes:
        return EMPTY_ROOT
    # Fold the perfect subtrees of the binary decomposition of n from the right.
    stack: list[tuple[int, bytes]] = []  # (size, hash) of complete subtrees, left to right
    for h in hashes:
        size, value = 1, h
        while stack and stack[-1][0] == size:
            left_size, left = stack.pop()
            value = node_hash(left, value)
            size += left_size
        stack.append((size, value))
    root = stack[-1][1]
    for _, left in reversed(stack[:-1]):
        root = node_hash(left, root)
    return root


def list_mth(hashes: Sequence[bytes]) -> SubtreeHash:
    """A ``mth`` over an in-memory list of leaf hashes."""

    def mth(lo: int, hi: int) -> bytes:
        return root_of(hashes[lo:hi])

    return mth


def inclusion_proof(index: int, size: int, mth: SubtreeHash) -> list[bytes]:
    """PATH(index, D[0:size]) of RFC 6962 §2.1.1, bottom-up."""
    if not 0 <= index < size:
        raise LogVerificationError(f"leaf {index} is not in a tree of size {size}")
    proof: list[bytes] = []
    lo, hi, m = 0, size, index
    # Walk down, collecting siblings top-down; reversed at the end.
    while hi - lo > 1:
        k = split_point(hi - lo)
        if m < k:
            proof.append(mth(lo + k, hi))
            hi = lo + k
        else:
            proof.append(mth(lo, lo + k))
            lo, m = lo + k, m - k
    proof.reverse()
    return proof


def consistency_proof(old_size: int, new_size: int, mth: SubtreeHash) -> list[bytes]:
    """PROOF(old_size, D[0:new_size]) of RFC 6962 §2.1.2, bottom-up."""
    if not 0 < old_size <= new_size:
        raise LogVerificationError(f"no consistency proof from size {old_size} to {new_size}")
    proof: list[bytes] = []
    lo, hi, m, complete = 0, new_size, old_size, True
    while m != hi - lo:
        k = split_point(hi - lo)
        if m <= k:
            proof.append(mth(lo + k, hi))
            hi = lo + k
        else:
            proof.append(mth(lo, lo + k))
            lo, m, complete = lo + k, m - k, False
    if not complete:
        proof.append(mth(lo, hi))
    proof.reverse()
    return proof


def root_from_inclusion(index: int, size: int, leaf: bytes, proof: Sequence[bytes]) -> bytes:
    """The root an inclusion proof leads to (RFC 9162 §2.1.3.2); ``LogVerificationError`` when malformed."""
    if not 0 <= index < size:
        raise LogVerificationError(f"leaf index {index} is outside a tree of size {size}")
    if len(leaf) != HASH_SIZE or any(len(p) != HASH_SIZE for p in proof):
        raise LogVerificationError("a hash of the proof is not 32 bytes")
    fn, sn = index, size - 1
    r = leaf
    for p in proof:
        if sn == 0:
            raise LogVerificationError("inclusion proof is too long")
        if fn & 1 or fn == sn:
            r = node_hash(p, r)
            if not fn & 1:
                while fn and not fn & 1:
                    fn >>= 1
                    sn >>= 1
        else:
            r = node_hash(r, p)
        fn >>= 1
        sn >>= 1
    if sn != 0:
        raise LogVerificationError("inclusion proof is too short")
    return r


def verify_inclusion(index: int, size: int, leaf: bytes, proof: Sequence[bytes], root: bytes) -> None:
    """Raise ``LogVerificationError`` unless ``proof`` shows leaf hash ``leaf`` at ``index`` under ``root``."""
    if root_from_inclusion(index, size, leaf, proof) != root:
        raise LogVerificationError(f"inclusion proof of leaf {index} does not lead to the root of size {size}")


def verify_consistency(old_size: int, new_size: int, old_root: bytes, new_root: bytes, proof: Sequence[bytes]) -> None:
    """Raise ``LogVerificationError`` unless ``proof`` shows the tree ``old_root`` is a prefix of ``new_root``
    (RFC 9162 §2.1.4.2)."""
    if any(len(p) != HASH_SIZE for p in proof):
        raise LogVerificationError("a hash of the consistency proof is not 32 bytes")
    if old_size > new_size:
        raise LogVerificationError(f"tree size went back from {old_size} to {new_size}")
    if old_size == 0:
        # Every tree extends the empty one: such a proof proves nothing, so none is accepted.
        raise LogVerificationError("a consistency proof from the empty tree is meaningless")
    if old_size == new_size:
        if proof:
            raise LogVerificationError("consistency proof between equal sizes must be empty")
        if old_root != new_root:
            raise LogVerificationError(f"two different roots for the same tree size {old_size}")
        return
    if not proof:
        raise LogVerificationError("consistency proof is empty")
    path = list(proof)
    if old_size & (old_size - 1) == 0:  # a power of two: the old root is the first node
        path.insert(0, old_root)
    fn, sn = old_size - 1, new_size - 1
    while fn & 1:
        fn >>= 1
        sn >>= 1
    fr = sr = path[0]
    for c in path[1:]:
        if sn == 0:
            raise LogVerificationError("consistency proof is too long")
        if fn & 1 or fn == sn:
            fr = node_hash(c, fr)
            sr = node_hash(c, sr)
            if not fn & 1:
                while fn and not fn & 1:
                    fn >>= 1
                    sn >>= 1
        else:
            sr = node_hash(sr, c)
        fn >>= 1
        sn >>= 1
    if sn != 0:
        raise LogVerificationError("consistency proof is too short")
    if fr != old_root:
        raise LogVerificationError(f"consistency proof does not lead to the old root of size {old_size}")
    if sr != new_root:
        raise LogVerificationError(f"consistency proof does not lead to the new root of size {new_size}")
