"""Proofs for someone outside: find an archive's leaf in the store's logs and write a self-contained bundle.

The bundle (``standalone.FORMAT``) carries the manifest, the leaf, its index, the inclusion proof to
the log's current checkpoint and that signed checkpoint; ``standalone.verify`` checks it offline.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from archiver.errors import LogError, ObjectConflictError, ObjectNotFoundError, SessionNotArchivedError
from archiver.layout import keys
from archiver.store.base import ObjectStore
from archiver.tlog import leaf as leaves
from archiver.tlog.log import LogReader, read_object, writers
from archiver.tlog.note import Verifier
from archiver.tlog.standalone import FORMAT
from archiver.tlog.timestamp import timestamps_path

LOCATOR_TYPE = "application/json"


@dataclass(frozen=True, slots=True)
class Location:
    """Where an archive's leaf is: which writer's log, which index, since when (if known)."""

    writer: str
    index: int
    logged_at: str | None = None


def kept_checkpoint(data: bytes) -> bytes:
    """The signed checkpoint in a file someone kept: a checkpoint note itself, or a proof bundle's
    (the bundle a third party received is the checkpoint they hold; ``verify --log --checkpoint``)."""
    if not data.lstrip().startswith(b"{"):
        return data
    try:
        bundle = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        raise LogError("the kept file is neither a signed checkpoint nor a proof bundle") from None
    note = bundle.get("checkpoint") if isinstance(bundle, dict) and bundle.get("format") == FORMAT else None
    if not isinstance(note, str):
        raise LogError(f"the kept file is neither a signed checkpoint nor a proof bundle ({FORMAT})")
    return note.encode()


def locator_bytes(location: Location) -> bytes:
    body = {"index": location.index, "logged_at": location.logged_at, "writer": location.writer}
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def write_locator(store: ObjectStore, leaf: leaves.Leaf, location: Location) -> None:
    key = keys.log_locator_key(store.prefix, leaf.session, leaf.instance)
    store.put_bytes(key, locator_bytes(location), content_type=LOCATOR_TYPE)


#: Locators written at once (each is one small create-once write; a store's latency, not its bandwidth, bounds them).
LOCATOR_WORKERS = 8


def write_locators(store: ObjectStore, writer: str, logged: Sequence[tuple[int, bytes]], since: str) -> int:
    """A locator for each (index, entry) just logged, ``LOCATOR_WORKERS`` at a time; how many were new.
    One already there (a retry after a crash) is kept: it is a finding aid, the proof never needs it."""

    def one(item: tuple[int, bytes]) -> int:
        index, entry = item
        try:
            write_locator(store, leaves.Leaf.decode(entry), Location(writer, index, since))
        except (ObjectConflictError, LogError):
            return 0
        return 1

    if len(logged) < 2:
        return sum(map(one, logged))
    with ThreadPoolExecutor(LOCATOR_WORKERS, thread_name_prefix="tlog-locator") as pool:
        return sum(pool.map(one, logged))


def read_locator(store: ObjectStore, sid: str, instance: str | None) -> Location | None:
    try:
        raw = read_object(store, keys.log_locator_key(store.prefix, sid, instance))
        body = json.loads(raw)
        return Location(str(body["writer"]), int(body["index"]), body.get("logged_at"))
    except ObjectNotFoundError:
        return None
    except (ValueError, KeyError, TypeError):
        return None  # a damaged finding aid: fall back to searching the logs


def find_leaf(store: ObjectStore, verifier: Verifier | None, manifest_sha256: str, hint: Location | None) -> Location:
    """The leaf of the manifest with this SHA-256: at the locator's place if it holds it there, else
    found by reading every writer's entries (``SessionNotArchivedError`` when no log has it)."""
    if hint is not None:
        reader = LogReader(store, hint.writer)
        head = reader.head(verifier)
        if head is not None and hint.index < head.checkpoint.size:
            size = head.checkpoint.size
            for _, entry in reader.entries(hint.index, hint.index + 1, size):
                if leaves.Leaf.decode(entry).manifest_sha256 == manifest_sha256:
                    return hint
    for writer in writers(store):
        reader = LogReader(store, writer)
        head = reader.head(verifier)
        if head is None:
            continue
        for index, entry in reader.entries(0, head.checkpoint.size, head.checkpoint.size):
            try:
                if leaves.Leaf.decode(entry).manifest_sha256 == manifest_sha256:
                    return Location(writer, index)
            except LogError:
                continue
    raise SessionNotArchivedError("the archive is in no transparency log of this store (yet?)")


def prove(store: ObjectStore, verifier: Verifier | None, sid: str, instance: str | None) -> bytes:
    """The proof bundle of one archive (its manifest must exist, its leaf be in a log). ``verifier``
    None: the checkpoint is not checked here (the browser has no key; the recipient checks)."""
    key = keys.manifest_key(store.prefix, sid, instance)
    try:
        manifest = read_object(store, key)
    except ObjectNotFoundError:
        raise SessionNotArchivedError(f"no archive of session {sid!r} (instance {instance or 'legacy'})") from None
    sha = hashlib.sha256(manifest).hexdigest()
    location = find_leaf(store, verifier, sha, read_locator(store, sid, instance))
    reader = LogReader(store, location.writer)
    head = reader.head(verifier)
    if head is None:
        raise LogError(f"log {location.writer!r} has no checkpoint")
    size = head.checkpoint.size
    ((_, entry),) = list(reader.entries(location.index, location.index + 1, size))
    proof = reader.inclusion(location.index, size)
    try:
        stamp: str | None = base64.b64encode(read_object(store, reader.key(timestamps_path(size)))).decode()
    except ObjectNotFoundError:
        stamp = None
    bundle = {
        "format": FORMAT,
        "checkpoint": head.note.decode("utf-8"),
        "inclusion_proof": [base64.b64encode(p).decode() for p in proof],
        "leaf": base64.b64encode(entry).decode(),
        "leaf_index": location.index,
        "log": location.writer,
        "logged_at": location.logged_at,
        "manifest": base64.b64encode(manifest).decode(),
        "timestamp": stamp,
    }
    return (json.dumps(bundle, indent=1, sort_keys=True) + "\n").encode()
