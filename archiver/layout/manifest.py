"""The archive's manifest and index-entry documents: dataclasses whose fields declare their JSON
shape once (``archiver.layout.codec`` encodes them canonically and parses them strictly; pure).

Timestamp convention (manifest and index entry alike): every timestamp field ``X`` is a JSON
number of epoch seconds (UTC, may carry a fraction) and is authoritative; a sibling ``X_iso``
string (ISO 8601 UTC, millisecond precision, ``Z`` suffix, e.g. ``2024-05-01T12:00:00.000Z``)
is written for humans and ``jq`` and ignored when parsing. Absent timestamps are ``null`` in both.

Secrets: ``labels`` are the caller's own session labels (the upstream ``labels.tags`` map) only,
never the container environment (``labels.env``); ``source`` is the request line without any
token or header. Building a manifest is the caller's promise of both.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from archiver import __version__
from archiver.layout import codec, keys
from archiver.layout.codec import (
    INT_MAP,
    INTEGER,
    NEW_STR_MAP,
    NEW_TEXT,
    OPT_INTEGER,
    OPT_TEXT,
    OPT_TIME,
    STR_LIST,
    STR_MAP,
    TEXT,
    TIME,
    Shape,
    wire,
)
from archiver.vocabulary import OUTCOMES, Outcome

#: Still 1 with ``instance``: that field is additive and optional (absent in archives written
#: before instances existed, which stay readable; readers of version 1 ignore unknown fields).
SCHEMA_VERSION: Final = 1

#: What an item is.
KINDS: Final = ("logs", "artifact")
#: How complete a logs item filled from a live capture is (``archiver.live.policy.Finish``): it saw
#: the end of the log, or has a known gap at its end, or a later replay of the log differed from it.
CAPTURES: Final = ("complete", "gap", "diverged")

_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")


def is_sha256(value: object) -> bool:
    """A sha256 hex digest as the archive writes them: 64 lowercase hex digits."""
    return isinstance(value, str) and _SHA256_RE.match(value) is not None


_STORE_CHECKSUM_RE = re.compile(r"^[A-Za-z0-9+/]{43}=(-[1-9][0-9]{0,4})?$")


def is_store_checksum(value: object) -> bool:
    """An S3 SHA-256 checksum: base64 of 32 bytes, with ``-N`` (parts) for a multipart object."""
    return isinstance(value, str) and _STORE_CHECKSUM_RE.match(value) is not None


#: 9999-12-31T23:59:59Z: the last instant datetime (and so every printed time) can represent.
LATEST_TIME: Final = 253402300799.0


def _check_time(name: str, value: float | None) -> None:
    if value is not None and (isinstance(value, bool) or not math.isfinite(value) or not 0 <= value <= LATEST_TIME):
        raise ValueError(f"{name} must be epoch seconds between 1970 and 9999, got {value!r}")


def _check_instance(value: str | None) -> None:
    if value is not None and not keys.is_instance_name(value):
        raise ValueError(f"instance must be a name like 20261122T060305.123Z, got {str(value)[:60]!r}")


@dataclass(frozen=True, slots=True)
class ManifestItem:
    """One archived (or not archivable) item of a session: its logs or one artifact path.

    For ``archived`` items ``key``, ``size``, ``sha256`` and ``content_type`` describe the stored
    object. For ``conflict`` they describe the bytes we fetched (the key holds other bytes). For
    the other outcomes they may be ``None``; ``error`` says why.
    """

    kind: str = field(metadata=TEXT)
    source: str = field(metadata=TEXT)
    outcome: str = field(metadata=TEXT)
    key: str | None = field(default=None, metadata=OPT_TEXT)
    size: int | None = field(default=None, metadata=OPT_INTEGER)
    sha256: str | None = field(default=None, metadata=OPT_TEXT)
    content_type: str | None = field(default=None, metadata=OPT_TEXT)
    path: str | None = field(default=None, metadata=OPT_TEXT)
    error: str | None = field(default=None, metadata=OPT_TEXT)
    #: The SHA-256 checksum the store verified on arrival and keeps (S3 ``x-amz-checksum-sha256``:
    #: base64 of ``sha256`` for one PUT, ``base64(sha256(part digests))-N`` for N parts); what
    #: `archiver verify` compares without downloading. ``None``: archived without one (older
    #: archives, a directory store) — provable only by re-reading the bytes. Written only when set.
    checksum_sha256: str | None = field(default=None, metadata=NEW_TEXT)
    #: A logs item whose bytes come from the live capture (``source`` is the follow request): how
    #: complete that capture is, one of ``CAPTURES``. ``None``: the logs read after the end (and
    #: every archive written before live capture existed); written only when set.
    capture: str | None = field(default=None, metadata=NEW_TEXT)

    def __post_init__(self) -> None:
        if self.capture is not None and (self.kind != "logs" or self.capture not in CAPTURES):
            raise ValueError(f"item capture must be one of {CAPTURES} on a logs item, got {self.capture!r}")
        if self.kind not in KINDS:
            raise ValueError(f"item kind must be one of {KINDS}, got {self.kind!r}")
        if self.outcome not in OUTCOMES:
            raise ValueError(f"item outcome must be one of {OUTCOMES}, got {self.outcome!r}")
        if not self.source:
            raise ValueError("item source request must not be empty")
        if self.kind == "artifact" and not self.path:
            raise ValueError("an artifact item needs its path")
        if self.size is not None and (isinstance(self.size, bool) or self.size < 0):
            raise ValueError(f"item size must be a non-negative int, got {self.size!r}")
        if self.sha256 is not None and not is_sha256(self.sha256):
            raise ValueError(f"item sha256 must be 64 lowercase hex digits, got {self.sha256!r}")
        if self.checksum_sha256 is not None and not is_store_checksum(self.checksum_sha256):
            raise ValueError(f"item checksum_sha256 must be base64 of 32 bytes [-N], got {self.checksum_sha256[:80]!r}")
        if self.outcome == Outcome.ARCHIVED and (
            self.key is None or self.size is None or self.sha256 is None or self.content_type is None
        ):
            raise ValueError("an archived item needs key, size, sha256 and content_type")


@dataclass(frozen=True, slots=True)
class Manifest:
    """Everything known about one archived session; written last, it is the session's commit marker."""

    session_id: str = field(metadata=TEXT)
    image: str = field(metadata=TEXT)
    tag: str = field(metadata=TEXT)
    location: str = field(metadata=TEXT)
    host: str = field(metadata=TEXT)
    created: float | None = field(metadata=OPT_TIME)
    labels: Mapping[str, str] = field(hash=False, metadata=STR_MAP)
    players: tuple[str, ...] = field(metadata=STR_LIST)
    player_count: int | None = field(metadata=OPT_INTEGER)
    last_status: str = field(metadata=TEXT)
    last_seen_active: float | None = field(metadata=OPT_TIME)
    first_seen_ended: float | None = field(metadata=OPT_TIME)
    fetch_deadline: float | None = field(metadata=OPT_TIME)
    archived_at: float = field(metadata=TIME)
    items: tuple[ManifestItem, ...] = field(metadata=wire(Shape.OBJECTS, element=ManifestItem))
    archiver_version: str = field(metadata=TEXT)
    schema_version: int = field(default=SCHEMA_VERSION, metadata=INTEGER)
    #: ``keys.instance_name`` of the upstream creation time: which session of a reused id this is.
    #: ``None`` for archives in the legacy layout (one archive per id, no instance segment); written
    #: only when set, so a legacy manifest re-written after a crash stays byte-identical.
    instance: str | None = field(default=None, metadata=NEW_TEXT)
    #: What every object was written with (``store/evidence.py``: sse, sse_kms_key_id,
    #: storage_class, tags, object_lock_mode, object_lock_days); empty: nothing set (older archives
    #: too), and then not written.
    evidence: Mapping[str, str] = field(default_factory=dict, hash=False, metadata=NEW_STR_MAP)

    def __post_init__(self) -> None:
        if not self.session_id:
            raise ValueError("manifest session_id must not be empty")
        _check_instance(self.instance)
        for name in ("created", "last_seen_active", "first_seen_ended", "fetch_deadline", "archived_at"):
            _check_time(name, getattr(self, name))
        if any(not isinstance(k, str) or not isinstance(v, str) for k, v in self.labels.items()):
            raise ValueError("manifest labels must map strings to strings")
        if any(not isinstance(k, str) or not isinstance(v, str) for k, v in self.evidence.items()):
            raise ValueError("manifest evidence must map strings to strings")

    @property
    def ended_at(self) -> float:
        """When the end was first seen (falls back to ``archived_at``); the index partition time."""
        return self.first_seen_ended if self.first_seen_ended is not None else self.archived_at

    @property
    def total_bytes(self) -> int:
        """Bytes stored for this session (archived items only)."""
        return sum(i.size or 0 for i in self.items if i.outcome == Outcome.ARCHIVED)

    def counts_by_outcome(self) -> dict[str, int]:
        """Number of items per outcome (only outcomes that occur)."""
        return dict(sorted(Counter(i.outcome for i in self.items).items()))


def build_manifest(
    *,
    session_id: str,
    image: str,
    tag: str,
    location: str,
    host: str,
    created: float | None,
    labels: Mapping[str, str],
    players: Sequence[str],
    player_count: int | None,
    last_status: str,
    last_seen_active: float | None,
    first_seen_ended: float | None,
    fetch_deadline: float | None,
    archived_at: float,
    items: Iterable[ManifestItem],
    archiver_version: str = __version__,
    instance: str | None = None,
    evidence: Mapping[str, str] | None = None,
) -> Manifest:
    """A validated manifest; ``labels`` are caller labels only (never ``labels.env``), times epoch seconds.

    ``instance`` (``keys.instance_name`` of the creation time) names the archive of this session
    among others with the same id; ``None`` writes a legacy-layout manifest.
    """
    items = tuple(items)
    keys = [i.key for i in items if i.key is not None and i.outcome == Outcome.ARCHIVED]
    if len(keys) != len(set(keys)):
        raise ValueError("two archived items share one key")
    return Manifest(
        session_id=session_id,
        image=image,
        tag=tag,
        location=location,
        host=host,
        created=created,
        labels=dict(sorted(labels.items())),
        players=tuple(players),
        player_count=player_count,
        last_status=last_status,
        last_seen_active=last_seen_active,
        first_seen_ended=first_seen_ended,
        fetch_deadline=fetch_deadline,
        archived_at=archived_at,
        items=items,
        archiver_version=archiver_version,
        instance=instance,
        evidence=dict(sorted((evidence or {}).items())),
    )


# --- JSON ---------------------------------------------------------------------------------------


def manifest_to_bytes(m: Manifest) -> bytes:
    """Canonical UTF-8 JSON of a manifest (sorted keys, 2-space indent, newline at the end)."""
    return codec.to_bytes(m)


def parse_manifest(data: bytes) -> Manifest:
    """The manifest in ``data``; ``ManifestError`` (with an excerpt) otherwise; unknown fields ignored."""
    return codec.from_bytes(Manifest, data, "manifest", schema_version=SCHEMA_VERSION)


# --- index entries ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class IndexEntry:
    """The small summary stored under ``index/dt=…/hour=…/{sid}[.{instance}].json`` for listing by end time."""

    session_id: str = field(metadata=TEXT)
    ended_at: float = field(metadata=TIME)
    archived_at: float = field(metadata=TIME)
    image: str = field(metadata=TEXT)
    tag: str = field(metadata=TEXT)
    location: str = field(metadata=TEXT)
    labels: Mapping[str, str] = field(hash=False, metadata=STR_MAP)
    counts: Mapping[str, int] = field(hash=False, metadata=INT_MAP)
    total_bytes: int = field(metadata=INTEGER)
    manifest_key: str = field(metadata=TEXT)
    schema_version: int = field(default=SCHEMA_VERSION, metadata=INTEGER)
    #: The manifest's instance (``None``: legacy layout, and not written); the entry file is
    #: ``{sid}.{instance}.json``.
    instance: str | None = field(default=None, metadata=NEW_TEXT)

    def __post_init__(self) -> None:
        _check_instance(self.instance)
        _check_time("ended_at", self.ended_at)
        _check_time("archived_at", self.archived_at)
        unknown = set(self.counts) - set(OUTCOMES)
        if unknown:
            raise ValueError(f"index counts have unknown outcomes {sorted(unknown)}")


def index_entry_for(m: Manifest, manifest_key: str) -> IndexEntry:
    """The index entry summarising a manifest stored at ``manifest_key``."""
    return IndexEntry(
        session_id=m.session_id,
        ended_at=m.ended_at,
        archived_at=m.archived_at,
        image=m.image,
        tag=m.tag,
        location=m.location,
        labels=dict(m.labels),
        counts=m.counts_by_outcome(),
        total_bytes=m.total_bytes,
        manifest_key=manifest_key,
        instance=m.instance,
    )


def index_entry_to_bytes(e: IndexEntry) -> bytes:
    """Canonical UTF-8 JSON of an index entry (same conventions as the manifest)."""
    return codec.to_bytes(e)


def parse_index_entry(data: bytes) -> IndexEntry:
    """The index entry in ``data``; ``ManifestError`` (with a short excerpt) for anything else."""
    return codec.from_bytes(IndexEntry, data, "index entry", schema_version=SCHEMA_VERSION)
