"""The log in the store: C2SP tiles paths and contents, create-once tiles, repair after a crash, one writer."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from archiver.errors import LogError, LogVerificationError, StoreUnavailableError
from archiver.store import ObjectStore, open_store
from archiver.tlog import merkle, note
from archiver.tlog.leaf import Leaf
from archiver.tlog.log import TileLog, writers
from archiver.tlog.tiles import TreeEdge, decode_bundle, encode_bundle, index_path, tile_path, widths
from tests import fixtures_retrieval

file_store = fixtures_retrieval.file_store
s3_store = fixtures_retrieval.s3_store
store = fixtures_retrieval.store

SIGNER = note.Signer("archiver.test/log", hashlib.sha256(b"test key").digest())


def _entries(n: int, start: int = 0) -> list[bytes]:
    return [
        Leaf.of(hashlib.sha256(str(i).encode()).hexdigest(), f"s{i}", None, 1_790_000_000 + i).encode()
        for i in range(start, start + n)
    ]


def test_tile_paths_follow_the_spec_examples() -> None:
    assert index_path(1234067) == "x001/x234/067"
    assert index_path(0) == "000"
    assert tile_path(0, 1234067) == "tile/0/x001/x234/067"
    assert tile_path(1, 5, 17) == "tile/1/005.p/17"
    assert tile_path(-1, 1000, 3) == "tile/entries/x001/000.p/3"
    # "a tree of size 70,000 will be represented by 273 full level 0 tiles, one partial level 0
    # tile of width 112, one full level 1 tile, one partial level 1 tile of width 17, and one
    # partial level 2 tile of width 1" / "a tree of size 256 ... a partial level 1 tile of width 1".
    assert widths(70_000) == [(0, 273, 112), (1, 1, 17), (2, 0, 1)]
    assert widths(256) == [(1, 0, 1)]


def test_entry_bundles_are_uint16_length_prefixed() -> None:
    bundle = encode_bundle([b"", b"a", b"x" * 300])
    assert bundle[:5] == bytes.fromhex("0000000161")
    assert decode_bundle(bundle) == [b"", b"a", b"x" * 300]
    with pytest.raises(LogError):
        decode_bundle(bundle[:-1])
    with pytest.raises(LogError):
        encode_bundle([b"x" * 65_536])


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 1_300))
@example(256)
@example(65_536)
@example(65_536 + 257)
def test_the_edge_root_is_the_rfc_root_and_its_tiles_rebuild_it(size: int) -> None:
    # Small trees (levels 0 and 1) and trees just around 256**2 leaves (the first level-2 tile).
    entries = [i.to_bytes(4, "big") for i in range(size)]
    edge = TreeEdge()
    written: dict[str, bytes] = {}
    for e in entries:
        written.update(edge.append(e))
    written.update(edge.partials())
    assert edge.root() == merkle.root_of([merkle.leaf_hash(e) for e in entries])

    def read(level: int, n: int, width: int) -> bytes:
        return written[tile_path(level, n, width)]

    assert TreeEdge.from_partials(size, read).root() == edge.root()


class RecordingStore:
    """A real store that records every write and can fail the checkpoint's replacement."""

    def __init__(self, inner: ObjectStore) -> None:
        self.inner = inner
        self.created: list[str] = []
        self.replaced: list[str] = []
        self.fail_replace = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def put_bytes(self, key: str, data: bytes, **kwargs: Any) -> Any:
        self.created.append(key)
        return self.inner.put_bytes(key, data, **kwargs)

    def replace_bytes(self, key: str, data: bytes, **kwargs: Any) -> None:
        if self.fail_replace:
            raise StoreUnavailableError("injected: the checkpoint write failed")
        self.replaced.append(key)
        self.inner.replace_bytes(key, data, **kwargs)


def _log(store: Any, writer: str = "shard-0-replica-0") -> TileLog:
    log = TileLog(store, writer, SIGNER)
    log.open()
    return log


def test_batches_append_and_every_proof_from_stored_tiles_verifies(store: ObjectStore) -> None:
    recording = RecordingStore(store)
    log = _log(recording)
    entries = _entries(700)
    for lo, hi in [(0, 1), (1, 255), (255, 256), (256, 300), (300, 700)]:
        assert log.append(entries[lo:hi]) == lo
    head = log.head(SIGNER.verifier)
    assert head is not None
    assert head.checkpoint.size == 700 and head.checkpoint.origin == "archiver.test/log/shard-0-replica-0"
    assert head.checkpoint.root == merkle.root_of([merkle.leaf_hash(e) for e in entries])
    for index in (0, 255, 256, 511, 699):
        merkle.verify_inclusion(
            index, 700, merkle.leaf_hash(entries[index]), log.inclusion(index, 700), head.checkpoint.root
        )
    assert [e for _, e in log.entries(250, 520, 700)] == entries[250:520]
    # Every tile and bundle was written create-once; the checkpoint is the only replaced object.
    assert {k.rsplit("/", 1)[-1] for k in recording.replaced} == {"checkpoint"}
    assert not any(k.endswith("checkpoint") for k in recording.created)
    assert f"{store.prefix}log/shard-0-replica-0/tile/0/001" in recording.created
    assert f"{store.prefix}log/shard-0-replica-0/tile/entries/002.p/188" in recording.created
    # A reopened log continues the same tree.
    again = _log(store)
    assert again.size == 700
    again.append(_entries(5, 700))
    assert again.head(SIGNER.verifier).checkpoint.size == 705  # type: ignore[union-attr]
    assert writers(store) == ["shard-0-replica-0"]


def test_a_crash_before_the_checkpoint_is_repaired_on_open_without_duplicates(tmp_path: Path) -> None:
    root = tmp_path / "store"
    root.mkdir()
    recording = RecordingStore(open_store(root.as_uri()))
    log = _log(recording)
    log.append(_entries(10))
    recording.fail_replace = True
    with pytest.raises(StoreUnavailableError):
        log.append(_entries(300, 10))  # bundles and tiles written, the checkpoint not
    recording.fail_replace = False
    reopened = TileLog(recording, "shard-0-replica-0", SIGNER)
    adopted = reopened.open()
    assert adopted == _entries(300, 10)
    head = reopened.head(SIGNER.verifier)
    assert head is not None and head.checkpoint.size == 310
    assert head.checkpoint.root == merkle.root_of([merkle.leaf_hash(e) for e in _entries(310)])


def test_a_second_writer_of_the_same_name_is_refused(file_store: ObjectStore) -> None:
    first, second = _log(file_store), _log(file_store)
    first.append(_entries(3))
    with pytest.raises(LogVerificationError, match="changed behind its writer"):
        second.append(_entries(1, 3))
    assert first.head(SIGNER.verifier).checkpoint.size == 3  # type: ignore[union-attr]


def test_tiles_that_do_not_give_the_checkpoint_root_are_refused_at_open(file_store: ObjectStore) -> None:
    log = _log(file_store)
    log.append(_entries(20))
    path = Path(file_store.url.removeprefix("file://")) / log.key("tile/0/000.p/20")
    data = bytearray(path.read_bytes())
    data[5] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(LogVerificationError, match="does not match its hash tile"):
        TileLog(file_store, "shard-0-replica-0", SIGNER).open()


def test_a_rolled_back_log_is_caught_against_a_kept_checkpoint(file_store: ObjectStore) -> None:
    log = _log(file_store)
    log.append(_entries(5))
    kept = log.head(SIGNER.verifier).checkpoint  # type: ignore[union-attr]
    log.append(_entries(5, 5))
    # Someone rewrites the log from scratch with fewer leaves (its own writer restarts on an empty log).
    other = TileLog(file_store, "shard-1-replica-0", SIGNER)
    other.open()
    other.append(_entries(2))
    with pytest.raises(LogVerificationError, match="two logs"):
        TileLog(file_store, "shard-1-replica-0", SIGNER).open(kept=kept)
    assert TileLog(file_store, "shard-0-replica-0", SIGNER).open(kept=kept) == []


def test_a_leaf_has_one_canonical_encoding() -> None:
    leaf = Leaf.of("ab" * 32, "match-7 é", "20261122T060305.123Z", 1_790_000_000.5)
    data = leaf.encode()
    assert data == (
        b'{"archived_at":"2026-09-21T14:13:20.500Z","instance":"20261122T060305.123Z",'
        b'"manifest_sha256":"' + b"ab" * 32 + b'","session":"match-7 \\u00e9","v":1}'
    )
    assert Leaf.decode(data) == leaf
    for bad in (data.replace(b",", b", ", 1), data.replace(b'"v":1', b'"v":2'), b"[]", b"\xff"):
        with pytest.raises(LogError):
            Leaf.decode(bad)


def test_the_log_on_seaweedfs_appends_reopens_and_is_found(seaweed_server: Any) -> None:
    """A real S3 server that lists in directory order, not key order: logs are still found, reopened
    and proved from their tiles."""
    import uuid

    from archiver.store import make_s3_client

    bucket = f"tlog-{uuid.uuid4().hex[:16]}"
    make_s3_client(endpoint_url=seaweed_server.endpoint).create_bucket(Bucket=bucket)
    store = open_store(f"s3://{bucket}/arch/", s3_endpoint_url=seaweed_server.endpoint)
    for writer in ("shard-1-replica-0", "shard-0-replica-1"):
        log = _log(store, writer)
        log.append(_entries(300))
        log.append(_entries(5, 300))
    assert writers(store) == ["shard-0-replica-1", "shard-1-replica-0"]
    again = _log(store, "shard-1-replica-0")
    head = again.head(SIGNER.verifier)
    assert again.size == 305 and head is not None
    leaf = merkle.leaf_hash(_entries(1, 299)[0])
    merkle.verify_inclusion(299, 305, leaf, again.inclusion(299, 305), head.checkpoint.root)
