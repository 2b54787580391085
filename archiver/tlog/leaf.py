"""The log's leaf: one archive (its manifest's SHA-256, session id, instance, archive time), canonically encoded.

Encoding (version 1): compact JSON, keys sorted, ASCII only (``json.dumps(..., sort_keys=True,
separators=(",", ":"), ensure_ascii=True)``) of ``{"archived_at": "<UTC, ms, Z>", "instance":
"<instance>" or null (legacy layout), "manifest_sha256": "<64 lowercase hex>", "session": "<id>",
"v": 1}``. Python's encoder is deterministic for this shape, and a decoder re-encodes what it read
and refuses anything that differs, so one archive has exactly one leaf and its hash.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime

from archiver.errors import LogError

VERSION = 1
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_TIME = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$")


def format_time(epoch: float) -> str:
    """Epoch seconds as ``YYYY-MM-DDTHH:MM:SS.mmmZ`` (milliseconds, UTC)."""
    ms = round(epoch * 1000)
    moment = datetime.fromtimestamp(ms // 1000, UTC)
    return f"{moment:%Y-%m-%dT%H:%M:%S}.{ms % 1000:03d}Z"


@dataclass(frozen=True, slots=True)
class Leaf:
    """What the log says about one archive."""

    manifest_sha256: str
    session: str
    instance: str | None
    archived_at: str

    def __post_init__(self) -> None:
        if not _SHA256.match(self.manifest_sha256):
            raise LogError("a leaf's manifest_sha256 is 64 lowercase hex digits")
        if not self.session:
            raise LogError("a leaf names a session")
        if not _TIME.match(self.archived_at):
            raise LogError("a leaf's archived_at reads YYYY-MM-DDTHH:MM:SS.mmmZ")

    def encode(self) -> bytes:
        body = {
            "archived_at": self.archived_at,
            "instance": self.instance,
            "manifest_sha256": self.manifest_sha256,
            "session": self.session,
            "v": VERSION,
        }
        return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode("ascii")

    @classmethod
    def decode(cls, data: bytes) -> Leaf:
        try:
            body = json.loads(data)
        except (ValueError, UnicodeDecodeError) as exc:
            raise LogError("a log entry is not a leaf of this archiver (not JSON)") from exc
        if (
            not isinstance(body, dict)
            or body.get("v") != VERSION
            or set(body)
            != {
                "archived_at",
                "instance",
                "manifest_sha256",
                "session",
                "v",
            }
        ):
            raise LogError("a log entry is not a version 1 leaf")
        sha, session, instance, when = body["manifest_sha256"], body["session"], body["instance"], body["archived_at"]
        if not (isinstance(sha, str) and isinstance(session, str) and isinstance(when, str)) or not (
            instance is None or isinstance(instance, str)
        ):
            raise LogError("a leaf's fields are strings")
        leaf = cls(sha, session, instance, when)
        if leaf.encode() != data:
            raise LogError("a log entry is not canonically encoded")
        return leaf

    @classmethod
    def of(cls, manifest_sha256: str, session: str, instance: str | None, archived_at: float) -> Leaf:
        return cls(manifest_sha256, session, instance, format_time(archived_at))
