"""A witness: a copy of every checkpoint in a second store (another account, its own Object Lock), and reads of it.

Whoever can rewrite the archive store cannot also rewrite the witness store, so the newest
checkpoint there is one the log must still extend: the daemon checks that at start and before
each checkpoint, and `verify --log` with ``--tlog-witness-store`` checks every log against it.
Copies are create-once under ``{prefix}witness/{writer}/{size}``.
"""

from __future__ import annotations

from archiver.errors import LogVerificationError, ObjectConflictError
from archiver.layout import keys
from archiver.store.base import ObjectStore
from archiver.tlog.checkpoint import Checkpoint, open_signed
from archiver.tlog.log import CHECKPOINT_TYPE, read_object
from archiver.tlog.note import Verifier


class Witness:
    """Checkpoint copies of every writer's log in ``store``."""

    def __init__(self, store: ObjectStore) -> None:
        self.store = store

    def record(self, writer: str, size: int, signed: bytes) -> None:
        """Keep a copy of a signed checkpoint; another checkpoint of the same size there is a fork."""
        try:
            key = keys.witness_key(self.store.prefix, writer, size)
            self.store.put_bytes(key, signed, content_type=CHECKPOINT_TYPE)
        except ObjectConflictError:
            raise LogVerificationError(
                f"the witness holds another checkpoint of log {writer!r} at size {size}: a fork"
            ) from None

    def latest(self, writer: str, verifier: Verifier) -> Checkpoint | None:
        """The newest checkpoint copy of ``writer``'s log (verified), None when it has none."""
        # The newest is the greatest key (sizes are zero-padded): whatever order the store lists in.
        last = max(self.store.list_keys(keys.witness_prefix(self.store.prefix, writer)), default=None)
        return None if last is None else open_signed(read_object(self.store, last), verifier)

    def all_latest(self, verifier: Verifier) -> list[Checkpoint]:
        """The newest copy of every log the witness knows."""
        root = keys.check_prefix(self.store.prefix) + "witness/"
        newest: dict[str, str] = {}
        for key in self.store.list_keys(root):
            writer = key[len(root) :].split("/", 1)[0]
            newest[writer] = max(key, newest.get(writer, key))
        return [open_signed(read_object(self.store, key), verifier) for key in newest.values()]
