"""A rotated API token takes effect without a restart: the token file is re-read when it changes
(a Kubernetes Secret's `..data` symlink swap included) and on a 401, against the fake service over
real sockets; the token never reaches a log line or an error."""

from __future__ import annotations

import io
import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from archiver.app import logs
from archiver.app.daemon import Daemon
from archiver.config.credentials import Token
from archiver.config.settings import load_settings
from archiver.errors import UnauthorizedError
from archiver.fake import FakeService
from archiver.retry import RetryPolicy
from archiver.upstream.api import SessionHostClient
from tests.support import wait_until

OLD = "old-t0ken-4f1c9a"
NEW = "new-t0ken-8b2e7d"
FAST = RetryPolicy(attempts=2, max_elapsed=5.0, initial_wait=0.0, max_wait=0.0, jitter=0.0)


class SecretVolume:
    """A directory laid out as the kubelet mounts a Secret: `token -> ..data/token`, `..data -> ..v1`;
    `rotate` writes a new `..vN` and swaps `..data` atomically (rename of a new symlink)."""

    def __init__(self, root: Path, value: str) -> None:
        self.root = root
        self.version = 0
        root.mkdir()
        self.rotate(value)
        (root / "token").symlink_to("..data/token")

    @property
    def path(self) -> Path:
        return self.root / "token"

    def rotate(self, value: str | None) -> None:
        """Swap in a new version; None swaps in a version without the file (a broken Secret)."""
        self.version += 1
        version = self.root / f"..v{self.version}"
        version.mkdir()
        if value is not None:
            (version / "token").write_text(value + "\n")
        (self.root / "..data_tmp").symlink_to(version.name)
        os.replace(self.root / "..data_tmp", self.root / "..data")


@pytest.fixture
def fake() -> Iterator[FakeService]:
    with FakeService((OLD,)) as svc:
        yield svc


def test_a_rotated_secret_is_used_by_the_next_request_without_a_restart(
    fake: FakeService, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    volume = SecretVolume(tmp_path / "secret", OLD)
    fake.add_session(OLD, id="before")
    token = Token.from_file(volume.path)
    with SessionHostClient.connect(fake.base_url, token, policy=FAST) as client:
        assert [s.id for s in client.list_sessions().sessions] == ["before"]
        fake.rotate_token(OLD, NEW)  # the upstream rotates first: the old token is refused
        with pytest.raises(UnauthorizedError) as refused:
            client.list_sessions()
        fake.add_session(NEW, id="after")
        volume.rotate(NEW)  # then the kubelet swaps the Secret's symlink
        assert sorted(s.id for s in client.list_sessions().sessions) == ["after", "before"]
    for text in (str(refused.value), repr(token), str(token), caplog.text):
        assert OLD not in text and NEW not in text
    assert "changed: using the new token" in caplog.text


def test_a_401_re_reads_the_file_even_when_its_stat_did_not_change(fake: FakeService, tmp_path: Path) -> None:
    """Rewritten in place with the same size and mtime (one mtime tick): the 401 forces a re-read and
    the request is sent once more, so the caller never sees the refusal."""
    path = tmp_path / "token"
    path.write_text(OLD)
    before = os.stat(path)
    token = Token.from_file(path)
    with SessionHostClient.connect(fake.base_url, token, policy=FAST) as client:
        client.list_sessions()
        fake.rotate_token(OLD, NEW)
        with path.open("r+") as handle:  # same inode, same size
            handle.write(NEW)
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
        assert list(client.list_sessions().sessions) == []
    assert fake.request_count("GET /session") == 3  # the refused attempt and its retry with the new token


def test_a_secret_briefly_missing_or_empty_keeps_the_previous_token_and_warns_once(
    fake: FakeService, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    volume = SecretVolume(tmp_path / "secret", OLD)
    token = Token.from_file(volume.path)
    with SessionHostClient.connect(fake.base_url, token, policy=FAST) as client:
        volume.rotate(None)  # ..data points at a version without the file
        for _ in range(3):
            client.list_sessions()  # still the old token, which the upstream still accepts
        volume.rotate("   ")
        client.list_sessions()
        volume.rotate(OLD)
        client.list_sessions()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2, warnings  # once per problem, not once per request
    assert "No such file or directory" in warnings[0] and "the API token is empty" in warnings[1]
    assert all(str(volume.path) in w for w in warnings)


def test_the_daemon_recovers_from_a_rotation_without_a_restart_and_logs_no_token(
    fake: FakeService, tmp_path: Path
) -> None:
    volume = SecretVolume(tmp_path / "secret", OLD)
    fake.add_session(OLD, id="before")
    settings = load_settings(
        {
            "api_url": fake.base_url,
            "api_token_file": str(volume.path),
            "state_dir": str(tmp_path / "state"),
            "listen": "127.0.0.1:0",
            "poll_interval": "50ms",
        },
        env={},
    )
    assert settings.api_token is not None
    stream = io.StringIO()
    logs.configure("json", "debug", secrets=settings.api_token.known_values, stream=stream)
    daemon = Daemon(settings)
    daemon.start()
    try:
        wait_until(lambda: daemon.last_poll_summary.sessions == 1)
        fake.rotate_token(OLD, NEW)
        polls = fake.request_count("GET /session")
        wait_until(lambda: fake.request_count("GET /session") >= polls + 3)  # refused polls
        fake.add_session(NEW, id="after")
        volume.rotate(NEW)
        wait_until(lambda: daemon.last_poll_summary.sessions == 2)
    finally:
        daemon.stop()
        logging.getLogger().handlers = [h for h in logging.getLogger().handlers if h.get_name() != "archiver"]
    output = stream.getvalue()
    assert "401" in output  # the refused polls were logged...
    assert OLD not in output and NEW not in output  # ...without the token
    assert settings.api_token.known_values() == (OLD, NEW)
