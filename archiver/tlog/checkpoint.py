"""C2SP tlog-checkpoint note texts: origin, tree size, base64 root hash, optional extension lines.

https://c2sp.org/tlog-checkpoint. The text is what a signed note signs. One key signs the logs of
a whole fleet (one Secret), so a log's origin is the key's name or the key's name, ``/`` and the
writer (``archiver.example/log/shard-0-replica-1``): the spec's "key name SHOULD match the origin",
relaxed to a prefix so that a verifier needs one public key for every writer's log.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Sequence
from dataclasses import dataclass

from archiver.errors import LogError
from archiver.tlog import note
from archiver.tlog.merkle import HASH_SIZE

_SIZE = re.compile(r"^(0|[1-9][0-9]{0,19})$")


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A tree head: which log, how many leaves, their root."""

    origin: str
    size: int
    root: bytes
    extensions: tuple[str, ...] = ()

    def text(self) -> str:
        if not self.origin or any(c.isspace() or c == "+" for c in self.origin):
            raise LogError(f"invalid log origin {self.origin[:80]!r}: no spaces or '+'")
        if len(self.root) != HASH_SIZE or self.size < 0:
            raise LogError("a checkpoint needs a tree size ≥ 0 and a 32-byte root")
        if any(not e or "\n" in e for e in self.extensions):
            raise LogError("checkpoint extension lines must be non-empty single lines")
        lines = [self.origin, str(self.size), base64.b64encode(self.root).decode(), *self.extensions]
        return "".join(line + "\n" for line in lines)

    @classmethod
    def parse(cls, text: str) -> Checkpoint:
        """A checkpoint note text; ``LogError`` when it is not one."""
        if not text.endswith("\n"):
            raise LogError("a checkpoint text ends with a newline")
        lines = text[:-1].split("\n")
        if len(lines) < 3 or any(not line for line in lines):
            raise LogError("a checkpoint has an origin, a tree size and a root hash, each on a non-empty line")
        origin, size, root = lines[:3]
        if not _SIZE.match(size):
            raise LogError("a checkpoint's tree size is a decimal number without leading zeroes")
        try:
            raw = base64.b64decode(root.encode("ascii"), validate=True)
        except (binascii.Error, UnicodeEncodeError) as exc:
            raise LogError("a checkpoint's root hash is not base64") from exc
        if len(raw) != HASH_SIZE:
            raise LogError("a checkpoint's root hash is not 32 bytes")
        return cls(origin, int(size), raw, tuple(lines[3:]))


def covers(key_name: str, origin: str) -> bool:
    """Whether a key of this name signs the log of this origin (equal, or the origin below the name)."""
    return origin == key_name or origin.startswith(key_name + "/")


def sign(checkpoint: Checkpoint, signer: note.Signer, *, cosignatures: Sequence[str] = ()) -> bytes:
    """The signed checkpoint note (the log's signature first, then any kept cosignature lines)."""
    if not covers(signer.name, checkpoint.origin):
        raise LogError(f"the log key is named {signer.name!r}, the checkpoint's origin is {checkpoint.origin!r}")
    body = note.sign(checkpoint.text(), [signer])
    return body + "".join(cosignatures).encode()


def open_signed(msg: bytes, verifier: note.Verifier) -> Checkpoint:
    """A signed checkpoint verified by the log's key and parsed; its origin must be the key's name."""
    opened = note.open_note(msg, [verifier])
    checkpoint = Checkpoint.parse(opened.text)
    if not covers(verifier.name, checkpoint.origin):
        raise LogError(f"the checkpoint's origin {checkpoint.origin!r} is not the key's name {verifier.name!r}")
    return checkpoint
