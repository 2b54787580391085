"""Evidence-grade archives: integrity the store proves (SHA-256 checksums verified on arrival and
checked by `verify` without a download), against moto and SeaweedFS."""

from __future__ import annotations

import hashlib
import io
import json
import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from archiver.layout import keys
from archiver.layout.manifest import (
    Manifest,
    ManifestItem,
    build_manifest,
    index_entry_for,
    index_entry_to_bytes,
    manifest_to_bytes,
    parse_manifest,
)
from archiver.retrieval import retrieve
from archiver.retrieval.verify import checksum_verdict
from archiver.store import S3Store, make_s3_client, open_store
from archiver.store.base import composite_checksum, sha256_checksum

MIB = 1024 * 1024
NOW = 1_795_000_000.0


@pytest.fixture(params=["moto", "seaweedfs"])
def s3_endpoint(request: pytest.FixtureRequest) -> str:
    """moto (in-memory mock) and SeaweedFS (a real S3-compatible server)."""
    if request.param == "moto":
        return str(request.getfixturevalue("moto_endpoint"))
    return str(request.getfixturevalue("seaweed_server").endpoint)


def fresh_bucket(endpoint: str, **create: Any) -> str:
    bucket = f"ev-{uuid.uuid4().hex[:20]}"
    make_s3_client(endpoint_url=endpoint).create_bucket(Bucket=bucket, **create)
    return bucket


@pytest.fixture
def s3_store(s3_endpoint: str) -> S3Store:
    """An S3 store whose multipart threshold is one part (5 MiB), so a 6 MiB file has two parts."""
    store = open_store(
        f"s3://{fresh_bucket(s3_endpoint)}/ev/",
        s3_endpoint_url=s3_endpoint,
        multipart_threshold=5 * MIB,
        part_size=5 * MIB,
    )
    assert isinstance(store, S3Store)
    return store


def archive_files(store: S3Store, tmp_path: Path, sid: str, files: dict[str, bytes]) -> Manifest:
    """Store each file with put_file (as the upload stage does), then the manifest (with the store's
    checksums, as `Uploader.write_manifest` records them) and its index entry."""
    items = []
    for path, data in files.items():
        key = keys.artifact_key(store.prefix, sid, path)
        spool = tmp_path / f"spool-{uuid.uuid4().hex}"
        spool.write_bytes(data)
        sha = hashlib.sha256(data).hexdigest()
        store.put_file(key, spool, sha256=sha, size=len(data), content_type="application/gzip")
        items.append(
            ManifestItem(
                kind="artifact", source=f"GET /artifacts?path={path}", outcome="archived", key=key, size=len(data),
                sha256=sha, content_type="application/gzip", path=path,
                checksum_sha256=store.store_checksum(key, sha256=sha, size=len(data)),
            )
        )  # fmt: skip
    manifest = build_manifest(
        session_id=sid, image="demo-game", tag="1", location="eu", host="h", created=NOW - 600, labels={},
        players=["ann"], player_count=1, last_status="exited", last_seen_active=NOW - 70, first_seen_ended=NOW - 60,
        fetch_deadline=NOW + 3600, archived_at=NOW - 30, items=items,
    )  # fmt: skip
    write_manifest(store, manifest)
    return manifest


def write_manifest(store: S3Store, manifest: Manifest, *, replace: bool = False) -> None:
    """The manifest and index entry; ``replace`` forges them behind the archiver's back (raw client)."""
    mkey = keys.manifest_key(store.prefix, manifest.session_id)
    body = manifest_to_bytes(manifest)
    if replace:
        store._client.put_object(Bucket=store._bucket, Key=mkey, Body=body)
        return
    store.put_bytes(mkey, body, content_type="application/json")
    store.put_bytes(
        keys.index_key(store.prefix, manifest.ended_at, manifest.session_id),
        index_entry_to_bytes(index_entry_for(manifest, mkey)),
        content_type="application/json",
    )


def with_item(manifest: Manifest, n: int, **changes: Any) -> Manifest:
    items = list(manifest.items)
    fields = {name: getattr(items[n], name) for name in ManifestItem.__slots__}
    items[n] = ManifestItem(**{**fields, **changes})
    values = {name: getattr(manifest, name) for name in Manifest.__dataclass_fields__}
    return Manifest(**{**values, "items": tuple(items)})


def test_store_checksums_are_sha256_whole_or_composite_and_verify_needs_no_download(
    s3_store: S3Store, tmp_path: Path
) -> None:
    """One PUT keeps base64(sha256); a 2-part upload keeps base64(sha256(part digests))-2. `verify`
    proves both with HEADs only (the manifest is the one GET); `--deep` re-reads the bytes."""
    small, large = os.urandom(3000), os.urandom(6 * MIB)
    m = archive_files(s3_store, tmp_path, "s1", {"/srv/small": small, "/srv/large": large})
    assert m.items[0].checksum_sha256 == sha256_checksum(hashlib.sha256(small).digest())
    parts = [hashlib.sha256(large[:5 * MIB]).digest(), hashlib.sha256(large[5 * MIB :]).digest()]  # fmt: skip
    assert m.items[1].checksum_sha256 == composite_checksum(parts)

    s3_store.requests_made.reset()
    report = retrieve.verify(s3_store, session_ids=["s1"], now=NOW, deep=False)
    assert report.ok, report.problems
    assert (report.objects, report.proved, report.unproven, report.bytes) == (2, 2, 0, 0)
    assert s3_store.requests_made["GetObject"] == 1  # the manifest; no object was downloaded
    out = io.StringIO()
    retrieve.render_verify(report, out)
    assert "2 proved by the store's SHA-256 checksum without download" in out.getvalue()

    deep = retrieve.verify(s3_store, session_ids=["s1"], now=NOW, deep=True)
    assert deep.ok and deep.bytes == len(small) + len(large) and deep.proved == 0


def test_verify_without_download_detects_a_forged_manifest(s3_store: S3Store, tmp_path: Path) -> None:
    """A manifest whose recorded sha256 (or composite) differs from the store's checksum is reported,
    whether or not the forger also fixed the recorded checksum; nothing is downloaded."""
    data, large = os.urandom(2000), os.urandom(6 * MIB)
    m = archive_files(s3_store, tmp_path, "s2", {"/srv/replay": data, "/srv/large": large})
    forged_sha = hashlib.sha256(b"other bytes").hexdigest()
    for forged in (
        with_item(m, 0, sha256=forged_sha),
        with_item(m, 0, sha256=forged_sha, checksum_sha256=sha256_checksum(bytes.fromhex(forged_sha))),
        with_item(m, 1, checksum_sha256=composite_checksum([hashlib.sha256(b"x").digest()] * 2)),
    ):
        write_manifest(s3_store, forged, replace=True)
        s3_store.requests_made.reset()
        report = retrieve.verify(s3_store, session_ids=["s2"], now=NOW, deep=False)
        assert [p.kind for p in report.problems] == ["checksum_mismatch"]
        assert s3_store.requests_made["GetObject"] == 1
    assert [p.kind for p in retrieve.verify(s3_store, session_ids=["s2"], now=NOW, deep=True).problems] == []


def test_a_replaced_object_without_checksum_is_a_problem(s3_store: S3Store, tmp_path: Path) -> None:
    """An object overwritten behind the archiver's back (plain PUT, no SHA-256) no longer proves the manifest."""
    m = archive_files(s3_store, tmp_path, "s3", {"/srv/replay": b"genuine bytes"})
    key = m.items[0].key
    assert key is not None
    s3_store._client.put_object(Bucket=s3_store._bucket, Key=key, Body=b"forged bytes!")
    report = retrieve.verify(s3_store, session_ids=["s3"], now=NOW, deep=False)
    assert [(p.kind, p.key) for p in report.problems] == [("checksum_mismatch", key)]


def test_legacy_archives_are_reported_not_provable_without_deep(s3_store: S3Store, tmp_path: Path) -> None:
    """Items archived before store checksums: present and the right size, but `verify` says plainly
    that only --deep can prove their bytes (and the verdict is not a failure)."""
    m = archive_files(s3_store, tmp_path, "old", {"/srv/a": b"legacy bytes"})
    key = m.items[0].key
    assert key is not None
    s3_store._client.delete_object(Bucket=s3_store._bucket, Key=key)
    s3_store._client.put_object(Bucket=s3_store._bucket, Key=key, Body=b"legacy bytes")  # as older versions did
    write_manifest(s3_store, with_item(m, 0, checksum_sha256=None), replace=True)
    report = retrieve.verify(s3_store, session_ids=["old"], now=NOW, deep=False)
    assert report.ok and (report.proved, report.unproven) == (0, 1)
    out = io.StringIO()
    retrieve.render_verify(report, out)
    assert "NOT PROVABLE without --deep: 1 object(s) archived without a store checksum" in out.getvalue()
    assert retrieve.verify(s3_store, session_ids=["old"], now=NOW, deep=True).bytes == len(b"legacy bytes")


@pytest.mark.parametrize(
    ("recorded", "stored", "sha", "ok"),
    [
        (sha256_checksum(b"\x01" * 32), sha256_checksum(b"\x01" * 32), "01" * 32, True),
        (sha256_checksum(b"\x01" * 32), sha256_checksum(b"\x01" * 32), "02" * 32, False),  # forged sha256
        (sha256_checksum(b"\x02" * 32), sha256_checksum(b"\x01" * 32), "01" * 32, False),  # forged checksum
        (sha256_checksum(b"\x01" * 32) + "-3", sha256_checksum(b"\x01" * 32), "02" * 32, True),  # moto: no -N
        (sha256_checksum(b"\x01" * 32) + "-3", sha256_checksum(b"\x01" * 32) + "-2", "02" * 32, False),
        (sha256_checksum(b"\x01" * 32), None, "01" * 32, False),
    ],
)
def test_checksum_verdict(recorded: str, stored: str | None, sha: str, ok: bool) -> None:
    assert (checksum_verdict(recorded, stored, sha) is None) is ok


def test_manifest_checksums_round_trip_and_old_manifests_stay_readable() -> None:
    item = dict(kind="logs", source="GET /logs", outcome="archived", key="k", size=1, sha256="0" * 64,
                content_type="text/plain")  # fmt: skip
    m = build_manifest(
        session_id="s", image="i", tag="t", location="l", host="h", created=None, labels={}, players=[],
        player_count=None, last_status="exited", last_seen_active=None, first_seen_ended=None, fetch_deadline=None,
        archived_at=NOW, items=[ManifestItem(**item, checksum_sha256=sha256_checksum(b"\0" * 32) + "-2")],
    )  # fmt: skip
    assert parse_manifest(manifest_to_bytes(m)) == m
    old = json.loads(manifest_to_bytes(m))
    del old["items"][0]["checksum_sha256"]
    assert parse_manifest(json.dumps(old).encode()).items[0].checksum_sha256 is None
    with pytest.raises(ValueError, match="checksum_sha256"):
        ManifestItem(**item, checksum_sha256="not base64")


def test_verify_cli_proves_without_download(s3_store: S3Store, tmp_path: Path, s3_endpoint: str) -> None:
    """`archiver verify ID` (no --deep) reports the objects proved by the store; --format json counts them."""
    from click.testing import CliRunner

    from archiver.cli import main

    archive_files(s3_store, tmp_path, "cli", {"/srv/a": b"abc"})
    args = ["verify", "cli", "--store", s3_store.url, "--s3-endpoint-url", s3_endpoint]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "1 proved by the store's SHA-256 checksum without download" in result.output
    doc = json.loads(CliRunner().invoke(main, [*args, "--format", "json"]).output)
    assert (doc["ok"], doc["proved"], doc["unproven"], doc["bytes"]) == (True, 1, 0, 0)


Factory = Callable[..., Any]
