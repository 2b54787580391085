"""The transparency log of archives: Merkle tree, signed checkpoints, tiles in the store, proofs."""
