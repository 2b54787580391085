"""Writes the manifest and index-entry fixtures next to this script from the archiver's public API.

The files were generated once with the hand-written codec the archive has always used (every
variant it writes or has written: legacy without `instance`, with/without `evidence` and
`checksum_sha256`, each outcome, errors, players, unicode and hostile ids, fractional times);
tests/layout/test_keys_manifest.py checks that today's codec reads each file and writes back the same
bytes, and that building the same documents today gives those bytes. Re-run only to add a variant
(`python tests/data/manifests/make_fixtures.py`), never to "fix" a difference: a difference is a
change to every archive already written.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

from archiver.config.evidence import Evidence
from archiver.layout import keys
from archiver.layout.manifest import (
    IndexEntry,
    Manifest,
    ManifestItem,
    build_manifest,
    index_entry_for,
    index_entry_to_bytes,
    manifest_to_bytes,
)

HERE = Path(__file__).resolve().parent
SHA_A = "0123456789abcdef" * 4
SHA_B = "fedcba9876543210" * 4
#: S3 SHA-256 checksums: one PUT (base64 of 32 bytes) and a 12-part multipart object.
CHECKSUM_ONE = "ASNFZ4mrze8BI0VniavN7wEjRWeJq83vASNFZ4mrze8="
CHECKSUM_PARTS = "/ty6mHZUMhD+3LqYdlQyEP7cuph2VDIQ/ty6mHZUMhA=-12"
HOSTILE_ID = '../../etc/p\u00e4sswd/\x00\n\t"\\\ud800-\U0001f600-\u8a66\u5408'
INSTANCE = "20261122T060305.123Z"


def _logs(sid: str, **extra: object) -> ManifestItem:
    fields: dict[str, object] = dict(
        kind="logs",
        source=f"GET /query/log?matchKey={keys.escape_session_id(sid)}",
        key=keys.logs_key("", sid, "jsonl"),
        size=1234,
        sha256=SHA_A,
        content_type="application/gzip",
        outcome="archived",
    )
    fields.update(extra)
    return ManifestItem(**fields)  # type: ignore[arg-type]


def _artifact(path: str, outcome: str, **extra: object) -> ManifestItem:
    fields: dict[str, object] = dict(kind="artifact", source=f"GET /artifacts?path={path}", path=path, outcome=outcome)
    fields.update(extra)
    return ManifestItem(**fields)  # type: ignore[arg-type]


def _manifest(sid: str = "c595bc6f-8522-4a62-95cd-8742136643ea", **overrides: object) -> Manifest:
    fields: dict[str, object] = dict(
        session_id=sid,
        image="demo-game",
        tag="1.1.0",
        location="eu-west-1",
        host="203.0.113.42",
        created=1_714_560_000.25,
        labels={"tournament": "spring", "mode": "duel"},
        players=["p1", "p2"],
        player_count=2,
        last_status="exited",
        last_seen_active=1_714_563_600.0,
        first_seen_ended=1_714_563_610.5,
        fetch_deadline=1_714_578_010.5,
        archived_at=1_714_563_700.0,
        items=[_logs(sid)],
        archiver_version="0.1.0",
    )
    fields.update(overrides)
    return build_manifest(**fields)  # type: ignore[arg-type]


def manifests() -> Iterator[tuple[str, Manifest]]:
    """(file stem, manifest) for every variant."""
    yield "legacy-minimal", _manifest()
    yield (
        "legacy-no-items-no-times",
        _manifest(
            items=[],
            created=None,
            last_seen_active=None,
            first_seen_ended=None,
            fetch_deadline=None,
            players=[],
            player_count=None,
            labels={},
            last_status="",
        ),
    )
    every_outcome = [
        _logs("s-1"),
        _artifact(
            "/srv/replays/match.replay",
            "archived",
            key="sessions/s-1/artifacts/srv-replays-match.replay-00000000.tar.gz",
            size=1_048_576,
            sha256=SHA_B,
            content_type="application/gzip",
        ),
        _artifact("/srv/crash/core.txt", "source_gone", error="404 RESOURCE_NOT_FOUND"),
        _artifact("/srv/huge.bin", "too_large", size=120_000_001, error="larger than --max-artifact-size 110000000"),
        _artifact("/srv/late.log", "expired", error="retention window closed before the fetch finished"),
        _artifact(
            "/srv/other.bin",
            "conflict",
            key="sessions/s-1/artifacts/srv-other.bin-00000000.tar.gz",
            size=10,
            sha256=SHA_A,
            content_type="application/gzip",
            error="the key holds other bytes",
        ),
        _artifact("/srv/broken", "failed", error='upstream 500: \u00fcnexpected \x07 "quoted" \\ error'),
    ]
    yield "legacy-every-outcome", _manifest(sid="s-1", items=every_outcome)
    yield "instance", _manifest(instance=INSTANCE, items=every_outcome)
    yield (
        "instance-checksums",
        _manifest(
            instance=INSTANCE,
            items=[
                _logs("s-2", checksum_sha256=CHECKSUM_ONE),
                _artifact(
                    "/srv/replays/big.replay",
                    "archived",
                    key="sessions/s-2/artifacts/big.tar.gz",
                    size=600_000_000,
                    sha256=SHA_B,
                    content_type="application/gzip",
                    checksum_sha256=CHECKSUM_PARTS,
                ),
                _artifact(
                    "/srv/empty",
                    "archived",
                    key="sessions/s-2/artifacts/empty.tar.gz",
                    size=0,
                    sha256=SHA_A,
                    content_type="application/octet-stream",
                ),
            ],
        ),
    )
    evidence = Evidence(
        sse="aws:kms",
        kms_key_id="arn:aws:kms:eu-west-1:111122223333:key/1234abcd-12ab-34cd-56ef-1234567890ab",
        storage_class="STANDARD_IA",
        tags={"team": "ops", "case": "a b/c=d+e@f"},
        lock_mode="COMPLIANCE",
        lock_days=365,
    )
    yield "instance-evidence", _manifest(instance=INSTANCE, evidence=evidence.manifest_doc())
    yield "legacy-evidence-sse-only", _manifest(evidence=Evidence(sse="AES256").manifest_doc())
    yield (
        "hostile-unicode",
        _manifest(
            sid=HOSTILE_ID,
            instance="19700101T000000.000Z",
            image="\u8a66\u5408/\u00e9\u00e9",
            tag="\U0001f600",
            location="\x00",
            host="::1",
            labels={"\u00e9": "\ud800", "z": "", "a\nb": "\"'<script>"},
            players=["\u00e9l\u00e8ve", "", "\U0001f600", HOSTILE_ID],
            player_count=0,
            last_status="\u00e9nded",
            created=0.0,
            last_seen_active=0.001,
            first_seen_ended=253402300799.0,
            fetch_deadline=253402300798.999,
            archived_at=1.5,
            items=[_logs(HOSTILE_ID, error=None)],
            archiver_version="0.1.0+\u00e9",
        ),
    )
    yield (
        "float-times",
        _manifest(
            created=1714560000.1234567,
            last_seen_active=0.1 + 0.2,
            first_seen_ended=1714563610.0000002,
            fetch_deadline=1e9,
            archived_at=1714563700.999999,
            players=["p"] * 3,
            player_count=30000,
        ),
    )
    yield "long-id", _manifest(sid="\u00e9" * 500, items=[_logs("\u00e9" * 500)])


def index_entries() -> Iterator[tuple[str, IndexEntry]]:
    """(file stem, index entry) for every variant: each manifest's own, and hand-made edge cases."""
    for stem, manifest in manifests():
        key = keys.manifest_key("archive/", manifest.session_id, manifest.instance)
        yield stem, index_entry_for(manifest, key)
    yield (
        "no-counts",
        IndexEntry(
            session_id="s",
            ended_at=0.0,
            archived_at=253402300799.0,
            image="",
            tag="",
            location="",
            labels={},
            counts={},
            total_bytes=0,
            manifest_key="sessions/s/manifest.json",
        ),
    )


def documents() -> Iterator[tuple[str, bytes]]:
    """(file name, canonical bytes) of every fixture."""
    for stem, manifest in manifests():
        yield f"manifest-{stem}.json", manifest_to_bytes(manifest)
    for stem, entry in index_entries():
        yield f"index-{stem}.json", index_entry_to_bytes(entry)


def main() -> int:
    for name, data in documents():
        (HERE / name).write_bytes(data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
