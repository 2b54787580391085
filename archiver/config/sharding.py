"""Which shard owns a session: the stable hash of its id, and a daemon's place (shard, replica) in a fleet.

The rule is a contract between versions and machines (ARCHITECTURE.md, "Ownership"): a session id
belongs to shard ``stable_hash(id) % total_shards``, where ``stable_hash`` is the first 8 bytes of
the SHA-256 of the id's UTF-8 bytes, read as a big-endian unsigned integer. Python's ``hash()`` is
salted per process and must never be used for this.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass

#: A StatefulSet pod is named `{statefulset}-{ordinal}`.
_ORDINAL = re.compile(r"-(\d+)$")
#: Environment variables that may carry the pod name, in order of preference.
POD_NAME_ENV = ("POD_NAME", "HOSTNAME")


def stable_hash(session_id: str) -> int:
    """The first 8 bytes of SHA-256(UTF-8 id), big-endian: the same on every machine, forever.

    Ids that are not valid UTF-8 (lone surrogates) are encoded with `surrogatepass`, so every
    string has exactly one owner.
    """
    digest = hashlib.sha256(session_id.encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(digest[:8], "big")


def shard_of(session_id: str, total_shards: int) -> int:
    """The shard that owns this session id among `total_shards`."""
    return stable_hash(session_id) % total_shards


@dataclass(frozen=True, slots=True)
class Shard:
    """This daemon's place in the fleet: shard `index` of `total`, replica `replica` of that shard."""

    index: int = 0
    total: int = 1
    replica: int = 0

    @property
    def whole(self) -> bool:
        """One shard: every session is ours (today's behaviour, and no hashing at all)."""
        return self.total == 1

    def owns(self, session_id: str | None) -> bool:
        """Whether this shard handles the session. An entry without a usable id (it will be
        quarantined anyway) belongs to shard 0, so it is reported once."""
        if self.total == 1:
            return True
        if session_id is None:
            return self.index == 0
        return stable_hash(session_id) % self.total == self.index


def ordinal_from_pod_name(name: str) -> int:
    """The ordinal of a StatefulSet pod name (`archiver-3` → 3); ValueError when it has none."""
    match = _ORDINAL.search(name.strip())
    if match is None:
        raise ValueError(f"cannot take a shard from pod name {name!r}: expected NAME-ORDINAL, e.g. archiver-3")
    return int(match.group(1))


def shard_from_ordinal(ordinal: int, total_shards: int, replicas_per_shard: int) -> Shard:
    """Pods `0..N*R-1` of one StatefulSet: ordinal `o` is shard `o // R`, replica `o % R`, so the
    pods of one shard are neighbours (scaling R up or down keeps each shard's first replica)."""
    index, replica = divmod(ordinal, replicas_per_shard)
    if index >= total_shards:
        raise ValueError(
            f"pod ordinal {ordinal} is beyond {total_shards} shards x {replicas_per_shard} replicas "
            f"(ordinals 0..{total_shards * replicas_per_shard - 1})"
        )
    return Shard(index, total_shards, replica)


def pod_name(env: Mapping[str, str]) -> str | None:
    """The pod name from the environment (POD_NAME, else HOSTNAME), None when neither is set."""
    for name in POD_NAME_ENV:
        if env.get(name):
            return env[name]
    return None
