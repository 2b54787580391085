"""The player index: which keys and bytes list an archive under each of its players (pure).

An entry of ``players/{player}/…`` holds exactly the bytes of the archive's index entry
(``index/dt=…/hour=…/``), so `ls --player` reads it as it reads the index and the pipeline and
the backfill write identical, create-once entries.
"""

from __future__ import annotations

from archiver.layout import keys
from archiver.layout.manifest import Manifest, index_entry_for, index_entry_to_bytes


def player_entries(prefix: str, manifest: Manifest, manifest_key: str) -> list[tuple[str, bytes]]:
    """``(key, bytes)`` of every player index entry of the archive, one per distinct non-empty player id."""
    body = index_entry_to_bytes(index_entry_for(manifest, manifest_key))
    players = sorted({player for player in manifest.players if player})
    return [
        (keys.player_key(prefix, player, manifest.ended_at, manifest.session_id, manifest.instance), body)
        for player in players
    ]
