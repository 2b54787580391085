"""`archiver check`: one line per check against a real upstream (the fake) and real stores, no token shown."""

from __future__ import annotations

import io
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from archiver.app import doctor
from archiver.config.settings import Settings
from archiver.fake import FakeService
from archiver.store import ObjectStore, open_store
from archiver.upstream.api import Token
from tests.fixtures_fake import TEST_TOKEN
from tests.support import free_port


def _run(settings: Settings, **factories: Any) -> tuple[int, list[str]]:
    out = io.StringIO()
    code = doctor.check(settings, out, **factories)
    return code, out.getvalue().splitlines()


def _status(lines: list[str]) -> dict[str, str]:
    """check name → status, from the printed report."""
    result = {}
    for line in lines[:-1]:
        status, rest = line.split(maxsplit=1)
        for name in (
            "upstream token",
            "store reachable",
            "store writable",
            "conditional writes",
            "state dir",
        ):
            if rest.startswith(name):
                result[name] = status
    return result


@pytest.fixture
def archive_dir(tmp_path: Path) -> Path:
    path = tmp_path / "archive"
    path.mkdir()
    return path


def test_everything_configured_and_working_is_ready(
    fake_service: FakeService, archive_dir: Path, tmp_path: Path
) -> None:
    """Token accepted, directory store writable with create-once, state dir writable: exit 0, READY."""
    fake_service.add_session(TEST_TOKEN)
    settings = Settings(
        api_url=fake_service.base_url,
        api_token=Token(TEST_TOKEN),
        store=archive_dir.as_uri(),
        state_dir=tmp_path / "state",
    )
    code, lines = _run(settings)
    assert code == 0, lines
    assert _status(lines) == dict.fromkeys(
        ("upstream token", "store reachable", "store writable", "conditional writes", "state dir"), "OK"
    )
    assert "(1 active session(s) visible)" in lines[0]
    assert "does not exist yet" in lines[4]
    assert lines[-1] == "verdict: READY (5 OK)"
    assert TEST_TOKEN not in "\n".join(lines)
    # The probe object was deleted (the file store may keep the empty directories it made).
    assert [p for p in archive_dir.rglob("*") if not p.is_dir()] == []
    assert not (tmp_path / "state").exists()  # checking does not create it


def test_s3_store_on_moto_passes_every_store_check(
    fake_service: FakeService, s3_bucket: tuple[str, str], tmp_path: Path
) -> None:
    endpoint, bucket = s3_bucket
    settings = Settings(
        api_url=fake_service.base_url,
        api_token=Token(TEST_TOKEN),
        store=f"s3://{bucket}/archive/",
        s3_endpoint_url=endpoint,
        state_dir=tmp_path,
    )
    code, lines = _run(settings)
    assert code == 0, lines
    assert f"s3://{bucket}/archive/" in lines[1]
    assert "If-None-Match is honoured" in lines[3]


def test_rejected_token_fails_without_printing_it(fake_service: FakeService, tmp_path: Path) -> None:
    """401 → 'token rejected'; the wrong token never appears in the report."""
    secret = f"wrong-{uuid.uuid4().hex}"
    settings = Settings(api_url=fake_service.base_url, api_token=Token(secret), state_dir=tmp_path)
    code, lines = _run(settings)
    assert code == 1
    assert _status(lines)["upstream token"] == "FAIL"
    assert "token rejected" in lines[0] and "(401)" in lines[0]
    assert secret not in "\n".join(lines)
    assert lines[-1] == "verdict: NOT READY (1 failed: upstream token)"
    # No store configured: its checks are skipped, not failed.
    assert [_status(lines)[n] for n in ("store reachable", "store writable", "conditional writes")] == ["SKIP"] * 3


def test_unreachable_upstream_and_missing_configuration(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    code, lines = _run(Settings(api_url=url, api_token=Token("some-token-value"), state_dir=tmp_path))
    assert code == 1 and f"cannot reach {url}" in lines[0]
    code, lines = _run(Settings(state_dir=tmp_path))
    assert code == 1 and "no upstream configured" in lines[0]
    code, lines = _run(Settings(api_url=url, state_dir=tmp_path))
    assert code == 1 and "no API token" in lines[0]


def test_missing_bucket_fails_reachability_and_skips_the_rest(
    fake_service: FakeService, moto_endpoint: str, tmp_path: Path
) -> None:
    settings = Settings(
        api_url=fake_service.base_url,
        api_token=Token(TEST_TOKEN),
        store=f"s3://no-such-bucket-{uuid.uuid4().hex[:12]}/",
        s3_endpoint_url=moto_endpoint,
        state_dir=tmp_path,
    )
    code, lines = _run(settings)
    status = _status(lines)
    assert code == 1
    assert (status["store reachable"], status["store writable"], status["conditional writes"]) == (
        "FAIL",
        "SKIP",
        "SKIP",
    )
    assert "NoSuchBucket" in lines[1]


def test_a_server_ignoring_if_none_match_fails_the_conditional_write_check(
    fake_service: FakeService, s3_bucket: tuple[str, str], s3_client: Callable[..., Any], tmp_path: Path
) -> None:
    """Modelled by a client that drops If-None-Match before signing: the second probe write then succeeds."""
    _endpoint, bucket = s3_bucket

    def strip_if_none_match(request: Any, **_kwargs: Any) -> None:
        if "If-None-Match" in request.headers:
            del request.headers["If-None-Match"]

    def store_factory(settings: Settings) -> ObjectStore:
        client = s3_client()
        client.meta.events.register("before-sign.s3.PutObject", strip_if_none_match)
        return open_store(f"s3://{bucket}/", s3_client=client)

    settings = Settings(
        api_url=fake_service.base_url,
        api_token=Token(TEST_TOKEN),
        store=f"s3://{bucket}/",
        state_dir=tmp_path,
    )
    code, lines = _run(settings, store_factory=store_factory)
    status = _status(lines)
    assert code == 1
    assert (status["store writable"], status["conditional writes"]) == ("OK", "FAIL")
    assert "ignores If-None-Match" in lines[3]


def test_bad_store_url_and_bad_state_dir(fake_service: FakeService, tmp_path: Path) -> None:
    """A store directory that does not exist and a state dir under a regular file are both reported."""
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    settings = Settings(
        api_url=fake_service.base_url,
        api_token=Token(TEST_TOKEN),
        store=(tmp_path / "missing").as_uri(),
        state_dir=blocker / "state",
    )
    code, lines = _run(settings)
    status = _status(lines)
    assert code == 1
    assert status["store reachable"] == "FAIL" and "does not exist" in lines[1]
    assert status["state dir"] == "FAIL" and "not a directory" in lines[4]
    assert lines[-1] == "verdict: NOT READY (2 failed: store reachable, state dir)"
