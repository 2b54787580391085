"""RFC 3161 timestamps of checkpoints from a local TSA (`openssl ts`), carried by bundles and verified."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from prometheus_client import CollectorRegistry

from archiver.archive.log_stage import LogStage
from archiver.archive.state import StateDB
from archiver.cli.base import main
from archiver.errors import LogError, LogVerificationError
from archiver.layout.manifest import Manifest
from archiver.metrics.selfmetrics import SelfMetrics
from archiver.store import ObjectStore, open_store
from archiver.tlog import standalone, timestamp
from archiver.tlog.leaf import Leaf
from archiver.tlog.log import read_object
from archiver.tlog.note import Signer
from archiver.tlog.prove import prove
from tests.fixtures_tsa import LocalTsa
from tests.support import put_session

SIGNER = Signer("archiver.test/log", hashlib.sha256(b"timestamp test key").digest())


def _archived_and_logged(tsa: LocalTsa, tmp_path: Path, sid: str) -> tuple[ObjectStore, Manifest]:
    """A directory store holding an archive of `sid`, appended to a log whose checkpoint `tsa` timestamped."""
    (tmp_path / "store").mkdir()
    store = open_store((tmp_path / "store").as_uri())
    m = put_session(store, sid, ended_at=1_790_000_000)
    data = read_object(store, f"sessions/{sid}/manifest.json")
    leaf = Leaf.of(hashlib.sha256(data).hexdigest(), m.session_id, m.instance, m.archived_at)
    state = StateDB.open(tmp_path / "state")
    try:
        state.add_log_pending("k", leaf.encode(), now=0.0)
        stage = LogStage(
            state, store, SIGNER, "shard-0-replica-0", SelfMetrics(CollectorRegistry()), lambda: 1.8e9,
            interval=1, tsa_url=tsa.url,
        )  # fmt: skip
        assert stage.run_once() == 1
    finally:
        state.close()
    return store, m


def test_a_reply_is_checked_against_the_bytes_and_the_tsa_root(openssl_tsa: LocalTsa) -> None:
    from cryptography import x509

    reply = timestamp.request(openssl_tsa.url, b"a checkpoint\n")
    root = x509.load_pem_x509_certificate(openssl_tsa.root.read_bytes())
    stamp = timestamp.check(reply, b"a checkpoint\n", [root])
    assert stamp.verified and "Archiver Test TSA" in stamp.authority
    with pytest.raises(LogVerificationError, match="other bytes"):
        timestamp.check(reply, b"another checkpoint\n", [root])
    with pytest.raises(LogError):
        timestamp.request("http://127.0.0.1:9/tsa", b"x", timeout=2)


def test_each_checkpoint_is_timestamped_and_the_bundle_carries_it(openssl_tsa: LocalTsa, tmp_path: Path) -> None:
    store, m = _archived_and_logged(openssl_tsa, tmp_path, "stamped-match")
    bundle = prove(store, SIGNER.verifier, m.session_id, m.instance)
    document = json.loads(bundle)
    assert document["timestamp"]
    path = tmp_path / "proof.json"
    path.write_bytes(bundle)
    vkey = SIGNER.verifier.encode()
    ok = CliRunner().invoke(main, ["verify-bundle", str(path), "--key", vkey, "--tsa-cert", str(openssl_tsa.root)])
    assert ok.exit_code == 0, ok.output
    assert "checkpoint timestamped" in ok.output and "verified against --tsa-cert" in ok.output
    # A timestamp of another checkpoint does not vouch for this one.
    document["timestamp"] = base64.b64encode(timestamp.request(openssl_tsa.url, b"other\n")).decode()
    path.write_text(json.dumps(document))
    bad = CliRunner().invoke(main, ["verify-bundle", str(path), "--key", vkey, "--tsa-cert", str(openssl_tsa.root)])
    assert bad.exit_code == 1 and "other bytes than this checkpoint" in bad.output


def test_the_standalone_verifier_says_a_timestamp_is_present_but_not_verified_by_it(
    openssl_tsa: LocalTsa, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store, m = _archived_and_logged(openssl_tsa, tmp_path, "stamped-alone")
    document = json.loads(prove(store, SIGNER.verifier, m.session_id, m.instance))
    path = tmp_path / "proof.json"
    path.write_text(json.dumps(document))
    vkey = SIGNER.verifier.encode()
    assert standalone.main([str(path), "--key", vkey]) == 0
    out = capsys.readouterr().out
    assert "timestamp: present" in out and "NOT verified by this tool" in out and "--tsa-cert" in out
    # A timestamp of other bytes is caught even without the TSA's certificate.
    document["timestamp"] = base64.b64encode(timestamp.request(openssl_tsa.url, b"other\n")).decode()
    path.write_text(json.dumps(document))
    assert standalone.main([str(path), "--key", vkey]) == 1
    assert "other bytes than this checkpoint" in capsys.readouterr().err
    # Without one, the report says there is none (rather than staying silent).
    document["timestamp"] = None
    path.write_text(json.dumps(document))
    assert standalone.main([str(path), "--key", vkey]) == 0
    assert "timestamp: none" in capsys.readouterr().out
