"""Evidence-grade archives: integrity the store proves (SHA-256 checksums verified on arrival and
checked by `verify` without a download), against moto and SeaweedFS; the evidence settings
(encryption, storage class, tags, Object Lock retention, legal holds) and `archiver check` on them."""

from __future__ import annotations

import functools
import hashlib
import io
import json
import os
import time
import uuid
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError

from archiver.app import doctor
from archiver.config.evidence import Evidence
from archiver.config.settings import Settings, load_settings
from archiver.errors import ConfigError, ObjectConflictError
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
from archiver.retrieval.proof import checksum_verdict
from archiver.store import S3Store, make_s3_client, open_store
from archiver.store.base import composite_checksum, sha256_checksum
from tests.fixtures_retrieval import archive_from_fake  # noqa: F401  (a fixture: the real pipeline into `store`)
from tests.fixtures_s3 import SeaweedServer

MIB = 1024 * 1024
NOW = 1_795_000_000.0


@pytest.fixture(params=["moto", "seaweedfs"])
def s3_endpoint(request: pytest.FixtureRequest) -> str:
    """moto (in-memory mock) and SeaweedFS (a real S3-compatible server)."""
    if request.param == "moto":
        return str(request.getfixturevalue("moto_endpoint"))
    return str(request.getfixturevalue("seaweed_server").endpoint)


@functools.cache
def admin_client(endpoint: str) -> Any:
    """One raw client per server for the tests' own requests (building a client costs ~0.5 s)."""
    return make_s3_client(endpoint_url=endpoint)


def fresh_bucket(endpoint: str, **create: Any) -> str:
    bucket = f"ev-{uuid.uuid4().hex[:20]}"
    admin_client(endpoint).create_bucket(Bucket=bucket, **create)
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


def archive_files(
    store: S3Store, tmp_path: Path, sid: str, files: dict[str, bytes], *, ended: float = NOW - 60
) -> Manifest:
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
        players=["ann"], player_count=1, last_status="exited", last_seen_active=ended - 10, first_seen_ended=ended,
        fetch_deadline=ended + 3600, archived_at=ended + 30, items=items,
    )  # fmt: skip
    write_manifest(store, manifest)
    return manifest


def write_manifest(store: S3Store, manifest: Manifest, *, replace: bool = False) -> None:
    """The manifest and index entry; ``replace`` forges them behind the archiver's back (raw client)."""
    mkey = keys.manifest_key(store.prefix, manifest.session_id)
    body = manifest_to_bytes(manifest)
    if replace:
        store.client.put_object(Bucket=store.bucket, Key=mkey, Body=body)
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
    s3_store.client.put_object(Bucket=s3_store.bucket, Key=key, Body=b"forged bytes!")
    report = retrieve.verify(s3_store, session_ids=["s3"], now=NOW, deep=False)
    assert [(p.kind, p.key) for p in report.problems] == [("checksum_mismatch", key)]


def test_legacy_archives_are_reported_not_provable_without_deep(s3_store: S3Store, tmp_path: Path) -> None:
    """Items archived before store checksums: present and the right size, but `verify` says plainly
    that only --deep can prove their bytes (and the verdict is not a failure)."""
    m = archive_files(s3_store, tmp_path, "old", {"/srv/a": b"legacy bytes"})
    key = m.items[0].key
    assert key is not None
    s3_store.client.delete_object(Bucket=s3_store.bucket, Key=key)
    s3_store.client.put_object(Bucket=s3_store.bucket, Key=key, Body=b"legacy bytes")  # as older versions did
    write_manifest(s3_store, with_item(m, 0, checksum_sha256=None), replace=True)
    report = retrieve.verify(s3_store, session_ids=["old"], now=NOW, deep=False)
    assert report.ok and (report.proved, report.unproven) == (0, 1)
    out = io.StringIO()
    retrieve.render_verify(report, out)
    assert "NOT PROVABLE without --deep: 1 object(s) not provable by the store" in out.getvalue()
    assert retrieve.verify(s3_store, session_ids=["old"], now=NOW, deep=True).bytes == len(b"legacy bytes")


def test_verify_since_reads_only_the_index_entries_of_the_edge_hours(moto_endpoint: str, tmp_path: Path) -> None:
    """`verify --since` takes each archive from its index entry's name; only the entries of the
    first and last hour (which may lie outside the range) are read. The same archives are checked
    as `ls` lists, a forged one among them is found, one that ended before the range is not."""
    store = open_store(f"s3://{fresh_bucket(moto_endpoint)}/", s3_endpoint_url=moto_endpoint)
    assert isinstance(store, S3Store)
    hour_start = NOW - NOW % 3600
    ends = {f"h{k}": NOW - 1800 - 3600 * k for k in range(6)} | {"now": hour_start + 1, "before": NOW - 21960}
    manifests = {sid: archive_files(store, tmp_path, sid, {"/srv/a": sid.encode()}, ended=e) for sid, e in ends.items()}
    forged = manifests["h3"].items[0].key
    assert forged is not None
    store.client.put_object(Bucket=store.bucket, Key=forged, Body=b"XX")
    since = NOW - 6 * 3600
    listed = {e.session_id for e in retrieve.list_sessions(store, since=since, now=NOW)}
    assert listed == set(ends) - {"before"}
    store.requests_made.reset()
    report = retrieve.verify(store, since=since, now=NOW, deep=False)
    assert report.sessions == len(listed) and [(p.session_id, p.kind) for p in report.problems] == [
        ("h3", "checksum_mismatch")
    ]
    # 7 manifests, and the entries of the edge hours only: h5 and "before" (oldest hour), "now".
    assert store.requests_made["GetObject"] == 7 + 3


def test_verify_spread_over_processes_reports_the_same_as_one_process(moto_endpoint: str, tmp_path: Path) -> None:
    """`verify --since` over processes (each opening its own store) finds the same archives, counts
    and problems, in the same order, as the threads of one process; the parent sends no HEAD itself."""
    opener = functools.partial(open_store, f"s3://{fresh_bucket(moto_endpoint)}/", s3_endpoint_url=moto_endpoint)
    store = opener()
    assert isinstance(store, S3Store)
    manifests = {
        f"p{k}": archive_files(store, tmp_path, f"p{k}", {"/srv/a": b"%d" % k}, ended=NOW - 600 - 900 * k)
        for k in range(6)
    }
    forged, gone = manifests["p2"].items[0].key, manifests["p4"].items[0].key
    assert forged is not None and gone is not None
    store.client.put_object(Bucket=store.bucket, Key=forged, Body=b"X")  # same size, other bytes
    store.client.delete_object(Bucket=store.bucket, Key=gone)
    since = NOW - 3 * 3600
    single = retrieve.verify(store, since=since, now=NOW, deep=False, workers=2)
    store.requests_made.reset()
    found: list[retrieve.Problem] = []
    spread = retrieve.verify(
        store, since=since, now=NOW, deep=False, workers=2, opener=opener, processes=2, chunk=2, on_problem=found.append
    )
    assert store.requests_made["HeadObject"] == 0  # every archive was verified in a child process
    assert (spread.sessions, spread.objects, spread.proved, spread.problems) == (
        single.sessions, single.objects, single.proved, single.problems
    )  # fmt: skip
    assert found == spread.problems
    assert spread.sessions == 6 and sorted((p.session_id, p.kind) for p in spread.problems) == [
        ("p2", "checksum_mismatch"), ("p4", "missing_object")
    ]  # fmt: skip


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


def test_verify_cli_proves_without_download(moto_endpoint: str, tmp_path: Path) -> None:
    """`archiver verify ID` (no --deep) reports the objects proved by the store; --format json counts them."""
    from click.testing import CliRunner

    from archiver.cli.base import main

    s3_store = open_store(f"s3://{fresh_bucket(moto_endpoint)}/", s3_endpoint_url=moto_endpoint)
    assert isinstance(s3_store, S3Store)
    archive_files(s3_store, tmp_path, "cli", {"/srv/a": b"abc"})
    args = ["verify", "cli", "--store", s3_store.url, "--s3-endpoint-url", moto_endpoint]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "1 proved by the store's SHA-256 checksum without download" in result.output
    doc = json.loads(CliRunner().invoke(main, [*args, "--format", "json"]).output)
    assert (doc["ok"], doc["proved"], doc["unproven"], doc["bytes"]) == (True, 1, 0, 0)


# --- evidence settings ------------------------------------------------------------------------------

LOCKED = Evidence(
    sse="AES256", storage_class="STANDARD_IA", tags={"case": "c-42", "team": "anti cheat"},
    lock_mode="GOVERNANCE", lock_days=2,
)  # fmt: skip


@pytest.fixture
def lock_bucket(moto_endpoint: str) -> str:
    """A moto bucket created with Object Lock enabled (versioned, as S3 requires)."""
    return fresh_bucket(moto_endpoint, ObjectLockEnabledForBucket=True)


@pytest.fixture
def store(moto_endpoint: str, lock_bucket: str) -> S3Store:
    """The store `archive_from_fake` archives into: the Object Lock bucket, every evidence setting on."""
    opened = open_store(f"s3://{lock_bucket}/ev/", s3_endpoint_url=moto_endpoint, evidence=LOCKED)
    assert isinstance(opened, S3Store)
    return opened


def test_an_object_locked_archive_cannot_be_deleted_or_overwritten(
    store: S3Store, request: pytest.FixtureRequest, moto_endpoint: str
) -> None:
    """The pipeline writes every object with retention, SSE, storage class and tags, and records them
    in the manifest; deleting a locked version is refused, an overwrite leaves the original version
    (and `verify` reports the forged current one)."""
    m = request.getfixturevalue("archive_from_fake")(shape="text")
    shown = io.StringIO()
    retrieve.show_session(store, m.session_id, shown)
    assert "Evidence          object_lock_days=2,object_lock_mode=GOVERNANCE,sse=AES256," in shown.getvalue()
    assert f"checksum     {m.items[0].checksum_sha256}" in shown.getvalue()
    assert m.evidence == {
        "sse": "AES256", "storage_class": "STANDARD_IA", "tags": "case=c-42&team=anti%20cheat",
        "object_lock_mode": "GOVERNANCE", "object_lock_days": "2",
    }  # fmt: skip
    client = admin_client(moto_endpoint)
    bucket = store.bucket
    archived = [i for i in m.items if i.outcome == "archived"]
    object_keys = [i.key for i in archived] + [keys.manifest_key(store.prefix, m.session_id, m.instance)]
    for key in object_keys:
        head = client.head_object(Bucket=bucket, Key=key)
        assert head["ObjectLockMode"] == "GOVERNANCE"
        assert head["ObjectLockRetainUntilDate"].timestamp() > time.time() + 86400
        assert (head["ServerSideEncryption"], head["StorageClass"]) == ("AES256", "STANDARD_IA")
        tags = client.get_object_tagging(Bucket=bucket, Key=key)["TagSet"]
        assert {t["Key"]: t["Value"] for t in tags} == {"case": "c-42", "team": "anti cheat"}
        version = head["VersionId"]
        with pytest.raises(ClientError, match="AccessDenied"):
            client.delete_object(Bucket=bucket, Key=key, VersionId=version)

    target = archived[0]
    assert target.key is not None
    original = b"".join(store.iter_bytes(target.key))
    with pytest.raises(ObjectConflictError):
        store.put_bytes(target.key, b"forged", content_type="application/gzip")
    version = client.head_object(Bucket=bucket, Key=target.key)["VersionId"]
    forged = bytes(len(original))
    client.put_object(Bucket=bucket, Key=target.key, Body=forged)  # a new version, beside the locked one
    assert client.get_object(Bucket=bucket, Key=target.key, VersionId=version)["Body"].read() == original
    report = retrieve.verify(store, session_ids=[m.session_id], now=time.time(), deep=False)
    assert [(p.kind, p.key) for p in report.problems] == [("checksum_mismatch", target.key)]


def test_hold_and_release_every_object_of_an_archive(
    store: S3Store, request: pytest.FixtureRequest, moto_endpoint: str, tmp_path: Path
) -> None:
    """`archiver hold ID` puts a legal hold on the archive's objects, manifest and index entry;
    `release` clears it; a bucket without Object Lock refuses with one line, no traceback."""
    from click.testing import CliRunner

    from archiver.cli.base import main

    m = request.getfixturevalue("archive_from_fake")(shape="text")
    base = ["--store", store.url, "--s3-endpoint-url", moto_endpoint]
    result = CliRunner().invoke(main, ["hold", m.session_id, *base])
    assert result.exit_code == 0, result.output
    archived = [i.key for i in m.items if i.outcome == "archived"]
    held = [
        *archived,
        keys.manifest_key(store.prefix, m.session_id, m.instance),
        keys.index_key(store.prefix, m.ended_at, m.session_id, m.instance),
    ]
    assert f"legal hold placed on {len(held)} object(s) of {m.session_id} ({m.instance})" in result.output
    assert all(store.legal_hold(str(k)) for k in held)
    assert CliRunner().invoke(main, ["release", m.session_id, "--instance", str(m.instance), *base]).exit_code == 0
    assert not any(store.legal_hold(str(k)) for k in held)

    plain = open_store(f"s3://{fresh_bucket(moto_endpoint)}/", s3_endpoint_url=moto_endpoint)
    assert isinstance(plain, S3Store)
    archive_files(plain, tmp_path, "unlocked", {"/srv/a": b"abc"})
    result = CliRunner().invoke(main, ["hold", "unlocked", "--store", plain.url, "--s3-endpoint-url", moto_endpoint])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "missing ObjectLockConfiguration" in result.output and len(result.output.splitlines()) == 1


def _check(settings: Settings) -> dict[str, tuple[str, str]]:
    return {r.name: (r.status, r.detail) for r in doctor.check_evidence(settings)}


def test_check_reports_object_lock_and_write_settings_against_the_bucket(moto_endpoint: str, lock_bucket: str) -> None:
    """Object Lock asked for: OK on a bucket that has it, FAIL naming the cause on one that does not;
    SSE, storage class and tags are written to a probe object and read back."""
    ok = _check(Settings(store=f"s3://{lock_bucket}/ev/", s3_endpoint_url=moto_endpoint, evidence=LOCKED))
    assert ok["object lock"] == ("OK", "enabled: every archived object is kept GOVERNANCE for 2 day(s)")
    assert ok["evidence settings"][0] == "OK"
    plain = Settings(store=f"s3://{fresh_bucket(moto_endpoint)}/", s3_endpoint_url=moto_endpoint, evidence=LOCKED)
    status, detail = _check(plain)["object lock"]
    assert status == "FAIL" and "the bucket has no Object Lock" in detail


def test_check_asks_kms_whether_the_key_is_usable(moto_endpoint: str) -> None:
    """A real moto KMS key passes; a bogus key id fails with KMS's own answer (moto's S3 would accept it)."""
    kms = boto3.client("kms", endpoint_url=moto_endpoint)
    key_id = kms.create_key()["KeyMetadata"]["KeyId"]
    bucket = fresh_bucket(moto_endpoint)
    verdicts = {}
    for kid in (key_id, "0000dead-beef-0000-0000-000000000000"):
        evidence = Evidence(sse="aws:kms", kms_key_id=kid)
        settings = Settings(
            store=f"s3://{bucket}/", s3_endpoint_url=moto_endpoint, kms_endpoint_url=moto_endpoint, evidence=evidence
        )
        verdicts[kid] = _check(settings)["kms key"]
    assert verdicts[key_id] == ("OK", f"{key_id} is enabled for encryption")
    status, detail = verdicts["0000dead-beef-0000-0000-000000000000"]
    assert status == "FAIL" and "NotFoundException" in detail


def test_check_says_seaweedfs_refuses_server_side_encryption(seaweed_server: SeaweedServer) -> None:
    settings = Settings(
        store=f"s3://{fresh_bucket(seaweed_server.endpoint)}/", s3_endpoint_url=seaweed_server.endpoint,
        evidence=Evidence(sse="AES256"),
    )  # fmt: skip
    status, detail = _check(settings)["evidence settings"]
    assert status == "FAIL" and "SeaweedFS implement no server-side encryption" in detail


def test_evidence_settings_are_validated_once(tmp_path: Path) -> None:
    """Bad combinations are one ConfigError naming the options; a directory store refuses them."""
    with pytest.raises(ConfigError, match="Object Lock needs both"):
        load_settings({"s3_object_lock_mode": "governance"}, env={})
    with pytest.raises(ConfigError, match="KMS key id needs --s3-sse aws:kms"):
        load_settings({"s3_sse_kms_key_id": "k"}, env={})
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        load_settings({"s3_object_tag": ["novalue"]}, env={})
    loaded = load_settings(
        {"s3_sse": "aws:kms", "s3_object_tag": ["a=1,b=2"], "s3_object_lock_mode": "compliance",
         "s3_object_lock_days": "30", "s3_storage_class": "GLACIER_IR"}, env={},
    )  # fmt: skip
    assert loaded.evidence == Evidence(
        sse="aws:kms", tags={"a": "1", "b": "2"}, lock_mode="COMPLIANCE", lock_days=30, storage_class="GLACIER_IR"
    )
    with pytest.raises(ConfigError, match="S3 settings"):
        open_store(tmp_path.as_uri(), evidence=loaded.evidence)
