"""keygen, log backfill, prove, verify-bundle, verify --log and the standalone verifier, end to end."""

from __future__ import annotations

import base64
import json
import os
import re
import shlex
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import cryptography
import pytest
from click.testing import CliRunner

from archiver.cli.base import main
from archiver.layout import keys
from archiver.layout.manifest import Manifest
from archiver.store import ObjectStore
from archiver.tlog import standalone
from tests import fixtures_retrieval
from tests.fixtures_retrieval import archive_from_fake  # noqa: F401  (a fixture: the real pipeline into `store`)
from tests.support import REPO, Browsers, put_session, run_cli

file_store = fixtures_retrieval.file_store
STANDALONE = Path(standalone.__file__)


@pytest.fixture
def store(file_store: ObjectStore) -> ObjectStore:
    return file_store


def _keygen(tmp_path: Path) -> tuple[Path, str]:
    result = CliRunner().invoke(main, ["keygen", "--name", "archiver.test/log", "-o", str(tmp_path / "log.key")])
    assert result.exit_code == 0, result.output
    return tmp_path / "log.key", result.output.strip()


def _root(store: ObjectStore) -> Path:
    return Path(store.url.removeprefix("file://"))


@pytest.fixture
def logged(
    store: ObjectStore, request: pytest.FixtureRequest, tmp_path: Path
) -> tuple[ObjectStore, list[Manifest], Path, str]:
    """Three archives made by the pipeline, then appended by `archiver log backfill`."""
    archive: Callable[..., Manifest] = request.getfixturevalue("archive_from_fake")
    manifests = [archive() for _ in range(3)]
    key, vkey = _keygen(tmp_path)
    result = run_cli(store, ["log", "backfill", "--min-age", "0", "--tlog-key-file", str(key)])
    assert result.exit_code == 0, result.output
    assert "appended 3 archives to log backfill (now 3 leaves); 0 already logged" in result.output
    return store, manifests, key, vkey


def test_keygen_writes_a_private_key_only_its_owner_reads_and_refuses_to_replace_it(tmp_path: Path) -> None:
    key, vkey = _keygen(tmp_path)
    assert stat.S_IMODE(os.stat(key).st_mode) == 0o600
    assert key.read_text().startswith("PRIVATE+KEY+archiver.test/log+")
    assert (tmp_path / "log.pub").read_text().strip() == vkey
    again = CliRunner().invoke(main, ["keygen", "--name", "x.test/log", "-o", str(key)])
    assert again.exit_code == 2 and "never replaces a key" in again.output
    assert key.read_text().startswith("PRIVATE+KEY+archiver.test/log+")


@pytest.mark.parametrize("given", ["missing-file", "nul\x00in-name", "not+a+key"])
def test_a_verifier_key_that_cannot_be_read_is_one_error_line(tmp_path: Path, given: str) -> None:
    bundle = tmp_path / "bundle.json"
    bundle.write_text("{}")
    result = CliRunner().invoke(main, ["verify-bundle", str(bundle), "--key", str(tmp_path / given)])
    assert (result.exit_code == 2 and result.exception is None) or isinstance(result.exception, SystemExit)
    assert result.exit_code == 2, result.output
    assert len(result.output.strip().splitlines()) == 1 and result.output.startswith("error: "), result.output


Logged = tuple[ObjectStore, list[Manifest], Path, str]


def test_a_backfill_twice_appends_nothing_the_second_time(logged: Logged) -> None:
    store, _, key, _ = logged
    result = run_cli(store, ["log", "backfill", "--min-age", "0", "--tlog-key-file", str(key)])
    assert "appended 0 archives" in result.output and "3 already logged" in result.output


def test_prove_then_verify_bundle_with_the_downloaded_files(
    logged: tuple[ObjectStore, list[Manifest], Path, str], tmp_path: Path
) -> None:
    store, manifests, _, vkey = logged
    m = manifests[1]
    bundle = tmp_path / "proof.json"
    result = run_cli(store, ["prove", m.session_id, "-o", str(bundle), "--key", vkey])
    assert result.exit_code == 0, result.output
    objects = [_root(store) / item.key for item in m.items if item.outcome == "archived" and item.key]
    assert objects
    ok = CliRunner().invoke(main, ["verify-bundle", str(bundle), "--key", vkey, *map(str, objects)])
    assert ok.exit_code == 0, ok.output
    assert f"OK: session {m.session_id!r}" in ok.output and "leaf 1 of log archiver.test/log/backfill" in ok.output
    # A downloaded file that was altered is named.
    altered = tmp_path / "altered.bin"
    altered.write_bytes(objects[0].read_bytes() + b"x")
    bad = CliRunner().invoke(main, ["verify-bundle", str(bundle), "--key", vkey, str(altered)])
    assert bad.exit_code == 1 and "altered.bin" in bad.output and "not in the manifest" in bad.output


def test_the_standalone_verifier_needs_only_the_stdlib_and_cryptography(
    logged: tuple[ObjectStore, list[Manifest], Path, str], tmp_path: Path
) -> None:
    store, manifests, key, vkey = logged
    bundle = tmp_path / "proof.json"
    run_cli(store, ["prove", manifests[0].session_id, "-o", str(bundle), "--tlog-key-file", str(key)])
    script = tmp_path / "verify_bundle.py"
    script.write_bytes(STANDALONE.read_bytes())
    # Only cryptography's site directory on the path (the editable install's finder removed too), and
    # after the run no module of the archiver may have been imported.
    site = str(Path(cryptography.__file__).parent.parent)
    code = (
        "import sys, runpy\n"
        f"sys.path[:] = [p for p in sys.path if 'site-packages' not in p and 'editable' not in p] + [{site!r}]\n"
        "sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in getattr(f, '__module__', '')]\n"
        "sys.path_importer_cache.clear()\n"
        "sys.argv = ['verify_bundle.py', *sys.argv[1:]]\n"
        "try:\n"
        f"    runpy.run_path({str(script)!r}, run_name='__main__')\n"
        "except SystemExit as exc:\n"
        "    status = exc.code\n"
        "assert not [m for m in sys.modules if m.split('.')[0] == 'archiver'], 'imported the archiver'\n"
        "sys.exit(status)\n"
    )
    env = {"PATH": os.environ.get("PATH", ""), "LC_ALL": "C.UTF-8"}
    run = subprocess.run(
        [sys.executable, "-I", "-c", code, str(bundle), "--key", vkey],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "OK: session" in run.stdout
    # Tampered: the manifest swapped for another archive's.
    doc = json.loads(bundle.read_text())
    other = (_root(store) / keys.manifest_key("", manifests[2].session_id, manifests[2].instance)).read_bytes()
    doc["manifest"] = base64.b64encode(other).decode()
    bundle.write_text(json.dumps(doc))
    failed = subprocess.run(
        [sys.executable, "-I", "-c", code, str(bundle), "--key", vkey],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60, check=False,
    )  # fmt: skip
    assert failed.returncode == 1
    assert "FAILED: the manifest is not the one the log holds" in failed.stderr


def test_verify_log_passes_then_names_a_replaced_manifest(
    logged: tuple[ObjectStore, list[Manifest], Path, str], tmp_path: Path
) -> None:
    store, manifests, _, vkey = logged
    checkpoint = tmp_path / "kept.checkpoint"
    checkpoint.write_bytes((_root(store) / "log" / "backfill" / "checkpoint").read_bytes())
    ok = run_cli(store, ["verify", "--log", "--deep", "--checkpoint", str(checkpoint), "--key", vkey])
    assert ok.exit_code == 0, ok.output
    assert "1 logs (backfill 3 leaves), 3 archives: 0 problems" in ok.output
    m = manifests[0]
    path = _root(store) / keys.manifest_key("", m.session_id, m.instance)
    path.chmod(0o644)
    path.write_bytes(path.read_bytes().replace(b'"archived_at"', b'"archived_at" ', 1))
    bad = run_cli(store, ["verify", "--log", "--key", vkey, "--format", "json"])
    assert bad.exit_code == 1
    (finding,) = json.loads(bad.output)["findings"]
    assert finding["kind"] == "manifest-replaced" and m.session_id in finding["where"]


def test_the_browser_shows_since_when_an_archive_is_logged_and_offers_its_bundle(logged: Logged) -> None:
    store, manifests, _, vkey = logged
    browsers = Browsers()
    try:
        client = browsers.start(store)
        m = manifests[2]
        page = client.get(f"/sessions/{m.session_id}")
        assert page.status_code == 200
        assert "In the transparency log since" in page.text and "leaf 2 of log" in page.text
        bundle = client.get(f"/sessions/{m.session_id}/proof")
        assert bundle.status_code == 200
        assert "attachment" in bundle.headers["content-disposition"]
        assert standalone.verify(bundle.content, vkey).session == m.session_id
        # An archive made after the backfill is in no log yet: no line, and no bundle (404).
        late = put_session(store, "late-match", ended_at=1_790_000_000)
        assert "In the transparency log" not in client.get(f"/sessions/{late.session_id}").text
        assert client.get(f"/sessions/{late.session_id}/proof").status_code == 404
    finally:
        browsers.close()


def test_verify_log_catches_a_rollback_against_the_witness_store(
    store: ObjectStore, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    archive: Callable[..., Manifest] = request.getfixturevalue("archive_from_fake")
    key, vkey = _keygen(tmp_path)
    witness = tmp_path / "witness"
    witness.mkdir()
    options = ["--tlog-key-file", str(key), "--tlog-witness-store", witness.as_uri()]
    archive()
    run_cli(store, ["log", "backfill", "--min-age", "0", *options])
    first = (_root(store) / "log" / "backfill" / "checkpoint").read_bytes()
    archive()
    run_cli(store, ["log", "backfill", "--min-age", "0", *options])
    assert sorted(p.name for p in (witness / "witness" / "backfill").iterdir()) == [f"{1:020d}", f"{2:020d}"]
    # Rewound to one leaf: the checkpoint put back, the size-2 tiles and history entry deleted.
    log = _root(store) / "log" / "backfill"
    for path in ("tile/0/000.p/2", "tile/entries/000.p/2", f"checkpoints/{2:020d}"):
        (log / path).unlink()
    (log / "checkpoint").write_bytes(first)
    plain = run_cli(store, ["verify", "--log", "--key", vkey])
    assert "archive-not-logged" in plain.output  # the second archive's manifest is in no log
    checked = run_cli(store, ["verify", "--log", "--key", vkey, "--tlog-witness-store", witness.as_uri()])
    assert checked.exit_code == 1
    assert "rollback: log backfill: a kept checkpoint has 2 leaves, the log now 1" in checked.output


def _readme_example() -> list[str]:
    """The worked example of docs/transparency-log.md (the indented block after its heading): commands and output."""
    text = (REPO / "docs" / "transparency-log.md").read_text(encoding="utf-8")
    start = text.index("**Worked example: checking a bundle without the archiver.**")
    lines = text[start:].split("\n")
    first = next(i for i, line in enumerate(lines) if line.startswith("    $ "))
    block = []
    for line in lines[first:]:
        if not line.startswith("    "):
            break
        block.append(line[4:])
    return block


def _shape(text: str) -> str:
    """Output with what differs from archive to archive made uniform: hashes, times, leaf numbers."""
    text = re.sub(r"\b[0-9a-f]{64}\b", "<sha256>", text)
    text = re.sub(r"\b[0-9a-f]{16}…", "<sha256 prefix>…", text)
    text = re.sub(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z", "<time>", text)
    return re.sub(r"leaf \d+|has \d+ leaves", lambda m: re.sub(r"\d+", "<n>", m.group()), text)


def test_the_readme_worked_example_prints_what_the_readme_says(
    store: ObjectStore, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    archive: Callable[..., Manifest] = request.getfixturevalue("archive_from_fake")
    manifests = [archive() for _ in range(3)]
    made = CliRunner().invoke(main, ["keygen", "--name", "games.example.com/archiver", "-o", str(tmp_path / "log.key")])
    assert made.exit_code == 0, made.output
    assert (
        run_cli(store, ["log", "backfill", "--min-age", "0", "--tlog-key-file", str(tmp_path / "log.key")]).exit_code
        == 0
    )
    m = manifests[2]
    block = _readme_example()
    sid, instance = re.search(r"OK: session '([^']+)' instance (\S+)", "\n".join(block)).groups()  # type: ignore[union-attr]
    # The studio's side, as docs/transparency-log.md tells it: prove, get.
    run_cli(
        store,
        ["prove", m.session_id, "-o", str(tmp_path / f"{sid}.proof"), "--tlog-key-file", str(tmp_path / "log.key")],
    )
    got = run_cli(store, ["get", m.session_id, "--out", str(tmp_path / "get")])
    assert got.exit_code == 0, got.output
    (downloaded,) = (tmp_path / "get").iterdir()
    assert (downloaded / "manifest.json").is_file() and (downloaded / "logs.txt.gz").is_file()
    # The other party's directory: the bundle, the key, the script and the files under their names.
    for path in downloaded.rglob("*"):
        if path.is_file():
            (tmp_path / path.name).write_bytes(path.read_bytes())
    (tmp_path / "verify_bundle.py").write_bytes(STANDALONE.read_bytes())
    env = {"PATH": os.environ.get("PATH", ""), "LC_ALL": "C.UTF-8"}
    commands = [i for i, line in enumerate(block) if line.startswith("$ ")]
    assert len(commands) >= 3
    for at, end in zip(commands, [*commands[1:], len(block)], strict=True):
        command, expected = block[at][2:], block[at + 1 : end]
        if command.startswith("pip install"):
            continue
        assert command.startswith(("python verify_bundle.py ", "echo ")), command
        command = command.replace("python ", shlex.quote(sys.executable) + " ", 1)
        run = subprocess.run(
            command, shell=True, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60, check=False
        )  # fmt: skip
        printed = (run.stdout + run.stderr).replace(m.session_id, sid).replace(str(m.instance), instance)
        assert _shape(printed).splitlines() == [_shape(line) for line in expected], command
    # And every file `archiver get` wrote, the manifest among them, verifies against the bundle.
    files = sorted(str(p) for p in downloaded.rglob("*") if p.is_file())
    whole = subprocess.run(
        [sys.executable, str(STANDALONE), str(tmp_path / f"{sid}.proof"), "--key", str(tmp_path / "log.pub"), *files],
        capture_output=True, text=True, env=env, timeout=60, check=False,
    )  # fmt: skip
    assert whole.returncode == 0, whole.stderr
    assert "file manifest.json: matches the manifest the log holds" in whole.stdout


def test_verify_log_takes_a_received_proof_bundle_as_the_kept_checkpoint(
    logged: Logged, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    store, _, key, vkey = logged
    archive: Callable[..., Manifest] = request.getfixturevalue("archive_from_fake")
    fourth = archive()
    run_cli(store, ["log", "backfill", "--min-age", "0", "--tlog-key-file", str(key)])
    bundle = tmp_path / "received.proof"
    run_cli(store, ["prove", fourth.session_id, "-o", str(bundle), "--key", vkey])
    assert json.loads(bundle.read_text())["checkpoint"].split("\n")[1] == "4"
    ok = run_cli(store, ["verify", "--log", "--checkpoint", str(bundle), "--key", vkey])
    assert ok.exit_code == 0, ok.output
    # The log is rolled back to the 3 leaves of its first checkpoint (the 4th archive hidden).
    log = _root(store) / "log" / "backfill"
    for path in ("tile/0/000.p/4", "tile/entries/000.p/4", f"checkpoints/{4:020d}"):
        (log / path).unlink()
    (log / "checkpoint").write_bytes((log / "checkpoints" / f"{3:020d}").read_bytes())
    checked = run_cli(store, ["verify", "--log", "--checkpoint", str(bundle), "--key", vkey])
    assert checked.exit_code == 1
    assert "rollback: log backfill: a kept checkpoint has 4 leaves, the log now 3" in checked.output
    # A kept file that is neither a checkpoint nor a bundle: one line naming both, as for a bad checkpoint.
    (tmp_path / "notes.json").write_text('{"format": "something else"}')
    wrong = run_cli(store, ["verify", "--log", "--checkpoint", str(tmp_path / "notes.json"), "--key", vkey])
    assert wrong.exit_code == 1 and "neither a signed checkpoint nor a proof bundle" in wrong.output
