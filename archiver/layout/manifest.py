"""The archive's manifest and index-entry documents: dataclasses, canonical JSON and strict parsing (pure).

Timestamp convention (manifest and index entry alike): every timestamp field ``X`` is a JSON
number of epoch seconds (UTC, may carry a fraction) and is authoritative; a sibling ``X_iso``
string (ISO 8601 UTC, millisecond precision, ``Z`` suffix, e.g. ``2024-05-01T12:00:00.000Z``)
is written for humans and ``jq`` and ignored when parsing. Absent timestamps are ``null`` in both.

Secrets: ``labels`` are the caller's own session labels (the upstream ``labels.tags`` map) only,
never the container environment (``labels.env``); ``source`` is the request line without any
token or header. Building a manifest is the caller's promise of both.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

from archiver import __version__
from archiver.errors import ManifestError
from archiver.layout import keys
from archiver.vocabulary import OUTCOMES, Outcome

#: Still 1 with ``instance``: that field is additive and optional (absent in archives written
#: before instances existed, which stay readable; readers of version 1 ignore unknown fields).
SCHEMA_VERSION: Final = 1

#: What an item is.
KINDS: Final = ("logs", "artifact")
#: What became of an item (also the `outcome` label of `archiver_items_total`).

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

    kind: str
    source: str
    outcome: str
    key: str | None = None
    size: int | None = None
    sha256: str | None = None
    content_type: str | None = None
    path: str | None = None
    error: str | None = None
    #: The SHA-256 checksum the store verified on arrival and keeps (S3 ``x-amz-checksum-sha256``:
    #: base64 of ``sha256`` for one PUT, ``base64(sha256(part digests))-N`` for N parts); what
    #: `archiver verify` compares without downloading. ``None``: archived without one (older
    #: archives, a directory store) — provable only by re-reading the bytes.
    checksum_sha256: str | None = None

    def __post_init__(self) -> None:
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

    session_id: str
    image: str
    tag: str
    location: str
    host: str
    created: float | None
    labels: Mapping[str, str] = field(hash=False)
    players: tuple[str, ...]
    player_count: int | None
    last_status: str
    last_seen_active: float | None
    first_seen_ended: float | None
    fetch_deadline: float | None
    archived_at: float
    items: tuple[ManifestItem, ...]
    archiver_version: str
    schema_version: int = SCHEMA_VERSION
    #: ``keys.instance_name`` of the upstream creation time: which session of a reused id this is.
    #: ``None`` for archives in the legacy layout (one archive per id, no instance segment).
    instance: str | None = None
    #: What every object was written with (``store/evidence.py``: sse, sse_kms_key_id,
    #: storage_class, tags, object_lock_mode, object_lock_days); empty: nothing set (older archives too).
    evidence: Mapping[str, str] = field(default_factory=dict, hash=False)

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


# --- JSON -------------------------------------------------------------------------------------


def iso_utc(epoch_seconds: float | None) -> str | None:
    """``2024-05-01T12:00:00.000Z`` for an epoch-seconds time (``None`` stays ``None``)."""
    if epoch_seconds is None:
        return None
    stamp = datetime.fromtimestamp(epoch_seconds, UTC).isoformat(timespec="milliseconds")
    return stamp.replace("+00:00", "Z")


def _dumps(doc: Mapping[str, Any]) -> bytes:
    # ensure_ascii keeps the bytes valid UTF-8 even for ids with lone surrogates; sort_keys and a
    # fixed indent make the encoding canonical (same manifest → same bytes → same sha256).
    return (json.dumps(doc, sort_keys=True, indent=2, ensure_ascii=True, allow_nan=False) + "\n").encode("ascii")


def _with_times(doc: dict[str, Any], **times: float | None) -> dict[str, Any]:
    for name, value in times.items():
        doc[name] = value
        doc[f"{name}_iso"] = iso_utc(value)
    return doc


def _item_doc(item: ManifestItem) -> dict[str, Any]:
    doc = {
        "kind": item.kind,
        "source": item.source,
        "path": item.path,
        "key": item.key,
        "size": item.size,
        "sha256": item.sha256,
        "content_type": item.content_type,
        "outcome": item.outcome,
        "error": item.error,
    }
    if item.checksum_sha256 is not None:
        # Only when set: manifests without store checksums keep their exact bytes.
        doc["checksum_sha256"] = item.checksum_sha256
    return doc


def manifest_to_bytes(m: Manifest) -> bytes:
    """Canonical UTF-8 JSON of a manifest (sorted keys, 2-space indent, newline at the end)."""
    doc: dict[str, Any] = {
        "schema_version": m.schema_version,
        "session_id": m.session_id,
        "image": m.image,
        "tag": m.tag,
        "location": m.location,
        "host": m.host,
        "labels": dict(m.labels),
        "players": list(m.players),
        "player_count": m.player_count,
        "last_status": m.last_status,
        "items": [_item_doc(i) for i in m.items],
        "archiver_version": m.archiver_version,
    }
    if m.instance is not None:
        # Only when set: a legacy manifest re-written after a crash stays byte-identical.
        doc["instance"] = m.instance
    if m.evidence:
        doc["evidence"] = dict(m.evidence)  # only when set: older manifests keep their bytes
    _with_times(
        doc,
        created=m.created,
        last_seen_active=m.last_seen_active,
        first_seen_ended=m.first_seen_ended,
        fetch_deadline=m.fetch_deadline,
        archived_at=m.archived_at,
    )
    return _dumps(doc)


class _Reader:
    """Typed field access on a decoded JSON object; every complaint is a ManifestError naming the field."""

    def __init__(self, doc: Mapping[str, Any], where: str, body: bytes) -> None:
        self.doc = doc
        self.where = where
        self.body = body

    def fail(self, message: str) -> ManifestError:
        return ManifestError(f"{self.where}: {message}", body=self.body)

    def _get(self, name: str, types: tuple[type, ...], optional: bool) -> Any:
        if name not in self.doc:
            if optional:
                return None
            raise self.fail(f"missing field {name!r}")
        value = self.doc[name]
        if value is None and optional:
            return None
        # bool is an int subclass: never accept true/false as a number.
        if isinstance(value, bool) and bool not in types:
            raise self.fail(f"field {name!r} has the wrong type ({type(value).__name__})")
        if not isinstance(value, types):
            raise self.fail(f"field {name!r} has the wrong type ({type(value).__name__})")
        return value

    def text(self, name: str) -> str:
        value: str = self._get(name, (str,), False)
        return value

    def opt_text(self, name: str) -> str | None:
        value: str | None = self._get(name, (str,), True)
        return value

    def opt_integer(self, name: str) -> int | None:
        value: int | None = self._get(name, (int,), True)
        return value

    def integer(self, name: str) -> int:
        value: int = self._get(name, (int,), False)
        return value

    def opt_time(self, name: str) -> float | None:
        value: float | int | None = self._get(name, (int, float), True)
        return None if value is None else float(value)

    def time(self, name: str) -> float:
        value: float | int = self._get(name, (int, float), False)
        return float(value)

    def str_map(self, name: str) -> dict[str, str]:
        value = self._get(name, (dict,), True) or {}
        if not all(isinstance(v, str) for v in value.values()):
            raise self.fail(f"field {name!r} must map strings to strings")
        return dict(sorted(value.items()))

    def int_map(self, name: str) -> dict[str, int]:
        value = self._get(name, (dict,), True) or {}
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in value.values()):
            raise self.fail(f"field {name!r} must map strings to integers")
        return dict(sorted(value.items()))

    def array(self, name: str) -> list[Any]:
        value: list[Any] = self._get(name, (list,), True) or []
        return value


def _load(data: bytes, what: str) -> _Reader:
    try:
        doc = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # not UTF-8, not JSON, a 5000-digit number, nesting too deep
        raise ManifestError(f"{what} is not UTF-8 JSON ({type(exc).__name__})", body=data) from None
    if not isinstance(doc, dict):
        raise ManifestError(f"{what} is not a JSON object", body=data)
    reader = _Reader(doc, what, data)
    version = reader.integer("schema_version")
    if version != SCHEMA_VERSION:
        raise reader.fail(f"unsupported schema_version {version} (this archiver reads {SCHEMA_VERSION})")
    return reader


def parse_manifest(data: bytes) -> Manifest:
    """The manifest in ``data``; ``ManifestError`` (with an excerpt) otherwise; unknown fields ignored."""
    r = _load(data, "manifest")
    items = []
    for n, raw in enumerate(r.array("items")):
        if not isinstance(raw, dict):
            raise r.fail(f"items[{n}] is not an object")
        ir = _Reader(raw, f"manifest items[{n}]", data)
        try:
            items.append(
                ManifestItem(
                    kind=ir.text("kind"),
                    source=ir.text("source"),
                    outcome=ir.text("outcome"),
                    key=ir.opt_text("key"),
                    size=ir.opt_integer("size"),
                    sha256=ir.opt_text("sha256"),
                    content_type=ir.opt_text("content_type"),
                    path=ir.opt_text("path"),
                    error=ir.opt_text("error"),
                    checksum_sha256=ir.opt_text("checksum_sha256"),
                )
            )
        except ValueError as exc:
            raise ir.fail(str(exc)) from None
    players = r.array("players")
    if not all(isinstance(p, str) for p in players):
        raise r.fail("field 'players' must be a list of strings")
    try:
        return Manifest(
            session_id=r.text("session_id"),
            image=r.text("image"),
            tag=r.text("tag"),
            location=r.text("location"),
            host=r.text("host"),
            created=r.opt_time("created"),
            labels=r.str_map("labels"),
            players=tuple(players),
            player_count=r.opt_integer("player_count"),
            last_status=r.text("last_status"),
            last_seen_active=r.opt_time("last_seen_active"),
            first_seen_ended=r.opt_time("first_seen_ended"),
            fetch_deadline=r.opt_time("fetch_deadline"),
            archived_at=r.time("archived_at"),
            items=tuple(items),
            archiver_version=r.text("archiver_version"),
            instance=r.opt_text("instance"),
            evidence=r.str_map("evidence"),
        )
    except ValueError as exc:
        raise r.fail(str(exc)) from None


# --- index entries ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class IndexEntry:
    """The small summary stored under ``index/dt=…/hour=…/{sid}[.{instance}].json`` for listing by end time."""

    session_id: str
    ended_at: float
    archived_at: float
    image: str
    tag: str
    location: str
    labels: Mapping[str, str] = field(hash=False)
    counts: Mapping[str, int] = field(hash=False)
    total_bytes: int
    manifest_key: str
    schema_version: int = SCHEMA_VERSION
    #: The manifest's instance (``None``: legacy layout); the entry file is ``{sid}.{instance}.json``.
    instance: str | None = None

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
    doc: dict[str, Any] = {
        "schema_version": e.schema_version,
        "session_id": e.session_id,
        "image": e.image,
        "tag": e.tag,
        "location": e.location,
        "labels": dict(e.labels),
        "counts": dict(e.counts),
        "total_bytes": e.total_bytes,
        "manifest_key": e.manifest_key,
    }
    if e.instance is not None:
        doc["instance"] = e.instance
    return _dumps(_with_times(doc, ended_at=e.ended_at, archived_at=e.archived_at))


def parse_index_entry(data: bytes) -> IndexEntry:
    """The index entry in ``data``; ``ManifestError`` (with a short excerpt) for anything else."""
    r = _load(data, "index entry")
    try:
        return IndexEntry(
            session_id=r.text("session_id"),
            ended_at=r.time("ended_at"),
            archived_at=r.time("archived_at"),
            image=r.text("image"),
            tag=r.text("tag"),
            location=r.text("location"),
            labels=r.str_map("labels"),
            counts=r.int_map("counts"),
            total_bytes=r.integer("total_bytes"),
            manifest_key=r.text("manifest_key"),
            instance=r.opt_text("instance"),
        )
    except ValueError as exc:
        raise r.fail(str(exc)) from None
