"""1,040 random mutations of logged archives and their log: `verify --log` catches each and names it."""

from __future__ import annotations

import hashlib
import os
import random
import shutil
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from archiver.layout import keys
from archiver.layout.manifest import Manifest
from archiver.store import open_store
from archiver.tlog.audit import audit
from archiver.tlog.checkpoint import Checkpoint, open_signed
from archiver.tlog.leaf import Leaf
from archiver.tlog.log import TileLog
from archiver.tlog.note import Signer
from tests import fixtures_retrieval
from tests.support import put_session

memory_dir = fixtures_retrieval.memory_dir

MUTATIONS = 1_040  # 80 of each of the 13 kinds
SIGNER = Signer("archiver.test/log", hashlib.sha256(b"tamper test key").digest())
THIEF = Signer("archiver.test/log", hashlib.sha256(b"someone else's key").digest())
WRITER = "shard-0-replica-0"
#: Findings that say "the log itself is damaged" (which one depends on where the byte fell).
LOG_DAMAGE = {"tile-altered", "bundle-altered", "root-mismatch", "entries-unreadable", "leaf-malformed", "tile-missing"}


class World:
    """A store holding 8 archives logged in three batches (sizes 3, 6, 8), and the two checkpoints a
    third party kept (size 3 and size 8). Every mutation is undone from a snapshot of the directory."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.store = open_store(root.as_uri())
        self.manifests: list[Manifest] = [
            put_session(self.store, f"match-{i}", ended_at=1_790_000_000 + 60 * i, artifacts={"replay": b"r%d" % i})
            for i in range(8)
        ]
        self.entries = [self.leaf(m) for m in self.manifests]
        log = TileLog(self.store, WRITER, SIGNER)
        log.open()
        self.checkpoints: list[bytes] = []
        for lo, hi in [(0, 3), (3, 6), (6, 8)]:
            log.append(self.entries[lo:hi])
            assert log.last is not None
            self.checkpoints.append(log.last.note)
        self.kept = [open_signed(self.checkpoints[i], SIGNER.verifier) for i in (0, 2)]
        self.snapshot = self.files()
        #: Keys a mutation touched through `write`/`remove`; None: it wrote through the store too
        #: (a rewritten log, a replaced archive), so `restore` compares every file.
        self.touched: set[str] | None = set()

    def leaf(self, m: Manifest) -> bytes:
        data = self.read(keys.manifest_key("", m.session_id, m.instance))
        return Leaf.of(hashlib.sha256(data).hexdigest(), m.session_id, m.instance, m.archived_at).encode()

    def files(self) -> dict[str, bytes]:
        out = {}
        for dirpath, _, names in os.walk(self.root):
            for name in names:
                path = Path(dirpath) / name
                out[str(path.relative_to(self.root))] = path.read_bytes()
        return out

    def read(self, key: str) -> bytes:
        return (self.root / key).read_bytes()

    def write(self, key: str, data: bytes) -> None:
        if self.touched is not None:
            self.touched.add(key)
        path = self.root / key
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists():
            path.chmod(0o644)
            path.unlink()
        path.write_bytes(data)

    def remove(self, key: str) -> None:
        if self.touched is not None:
            self.touched.add(key)
        (self.root / key).unlink()

    def restore(self) -> None:
        touched, self.touched = self.touched, None
        if touched is None:
            now = self.files()
            for key in now.keys() - self.snapshot.keys():
                self.remove(key)
            touched = set(self.snapshot)
        for key in touched:
            path = self.root / key
            if key in self.snapshot and (not path.exists() or path.read_bytes() != self.snapshot[key]):
                self.write(key, self.snapshot[key])
        self.touched = set()

    def keys_under(self, prefix: str) -> list[str]:
        return sorted(k for k in self.snapshot if k.startswith(prefix))

    def findings(self) -> set[str]:
        report = audit(self.store, SIGNER.verifier, kept=self.kept, objects=True)
        return {f.kind for f in report.findings}

    def rewrite_log(self, signer: Signer, entries: list[bytes]) -> None:
        self.touched = None
        shutil.rmtree(self.root / "log" / WRITER)
        log = TileLog(self.store, WRITER, signer)
        log.open()
        log.append(entries)

    def replace_archive(self, i: int, rng: random.Random) -> bytes:
        """Replace archive i's objects and manifest consistently (a new replay); its new leaf."""
        self.touched = None
        m = self.manifests[i]
        for key in self.keys_under(keys.session_prefix("", m.session_id, m.instance)):
            self.remove(key)
        for key in self.keys_under("index/"):
            if key.rsplit("/", 1)[-1].startswith(f"{m.session_id}."):
                self.remove(key)
        other = put_session(
            self.store, m.session_id, ended_at=1_790_000_000 + 60 * i,
            artifacts={"replay": rng.randbytes(8)}, instance=m.instance,
        )  # fmt: skip
        return self.leaf(other)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    shm = Path("/dev/shm")
    base = Path(tmp_path_factory.mktemp("tamper")) if not os.access(shm, os.W_OK) else shm
    root = Path(os.path.join(base, f"archiver-tamper-{os.getpid()}"))
    root.mkdir()
    try:
        yield World(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _flip(world: World, key: str, rng: random.Random) -> None:
    data = bytearray(world.read(key))
    i = rng.randrange(len(data))
    data[i] ^= 1 << rng.randrange(8)
    world.write(key, bytes(data))


def _pick_archive(world: World, rng: random.Random) -> Manifest:
    return rng.choice(world.manifests)


def flip_manifest(w: World, rng: random.Random) -> set[str]:
    m = _pick_archive(w, rng)
    _flip(w, keys.manifest_key("", m.session_id, m.instance), rng)
    return {"manifest-replaced"}


def flip_object(w: World, rng: random.Random) -> set[str]:
    m = _pick_archive(w, rng)
    item = rng.choice([i for i in m.items if i.key])
    assert item.key
    _flip(w, item.key, rng)
    return {"object-altered"}


def delete_object(w: World, rng: random.Random) -> set[str]:
    m = _pick_archive(w, rng)
    item = rng.choice([i for i in m.items if i.key])
    assert item.key
    w.remove(item.key)
    return {"object-missing"}


def flip_tile(w: World, rng: random.Random) -> set[str]:
    _flip(w, rng.choice(w.keys_under(f"log/{WRITER}/tile/")), rng)
    return LOG_DAMAGE


def delete_tile(w: World, rng: random.Random) -> set[str]:
    w.remove(rng.choice(w.keys_under(f"log/{WRITER}/tile/")))
    return LOG_DAMAGE


def flip_checkpoint(w: World, rng: random.Random) -> set[str]:
    _flip(w, f"log/{WRITER}/checkpoint", rng)
    return {"checkpoint-signature"}


def delete_checkpoint(w: World, rng: random.Random) -> set[str]:
    w.remove(f"log/{WRITER}/checkpoint")
    return {"checkpoint-missing"}


def delete_archive(w: World, rng: random.Random) -> set[str]:
    m = _pick_archive(w, rng)
    for key in w.keys_under(keys.session_prefix("", m.session_id, m.instance)):
        w.remove(key)
    return {"archive-deleted"}


def replace_consistently(w: World, rng: random.Random) -> set[str]:
    w.replace_archive(rng.randrange(len(w.manifests)), rng)
    return {"manifest-replaced"}


def plant_archive(w: World, rng: random.Random) -> set[str]:
    w.touched = None
    put_session(w.store, f"planted-{rng.randrange(10**9)}", ended_at=1_790_000_000 + rng.randrange(10**6))
    return {"archive-not-logged"}


def resign_with_another_key(w: World, rng: random.Random) -> set[str]:
    entries = list(w.entries)
    i = rng.randrange(len(entries))
    entries[i] = w.replace_archive(i, rng)
    w.rewrite_log(THIEF, entries)
    return {"checkpoint-signature"}


def fork_with_the_key(w: World, rng: random.Random) -> set[str]:
    """Someone holding the log's key rewrites history: an early archive replaced and re-logged."""
    entries = list(w.entries)
    i = rng.randrange(3)  # inside the checkpoint kept at size 3
    entries[i] = w.replace_archive(i, rng)
    w.rewrite_log(SIGNER, entries)
    return {"fork"}


def roll_back(w: World, rng: random.Random) -> set[str]:
    w.write(f"log/{WRITER}/checkpoint", w.checkpoints[rng.randrange(2)])
    return {"rollback"}


KINDS: list[Callable[[World, random.Random], set[str]]] = [
    flip_manifest, flip_object, delete_object, flip_tile, delete_tile, flip_checkpoint, delete_checkpoint,
    delete_archive, replace_consistently, plant_archive, resign_with_another_key, fork_with_the_key, roll_back,
]  # fmt: skip


def test_the_untouched_store_verifies(world: World) -> None:
    assert world.findings() == set()
    assert world.kept[1] == Checkpoint(f"{SIGNER.name}/{WRITER}", 8, world.kept[1].root)


def test_every_random_mutation_is_caught_and_named(world: World) -> None:
    rng = random.Random(33)
    caught: Counter[str] = Counter()
    for n in range(MUTATIONS):
        mutate = KINDS[n % len(KINDS)]
        expected = mutate(world, rng)
        found = world.findings()
        assert found & expected, (n, mutate.__name__, sorted(found))
        caught[mutate.__name__] += 1
        world.restore()
    assert world.findings() == set()
    assert sum(caught.values()) == MUTATIONS and len(caught) == len(KINDS)
