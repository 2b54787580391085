"""The exporter conventions' names (`--web.listen-address`, `--web.config.file`, `--log.level`,
`--log.format`) on `run`, `check`, `demo` and friends, logfmt lines, and the 0.x names still working
with one deprecation line each, in the configured log format."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from archiver.errors import ConfigError
from archiver.fake import FakeService
from tests.fixtures_fake import TEST_TOKEN
from tests.support import ARCHIVER, free_port, settings_from, wait_until

#: One logfmt line: key=value pairs, a value bare or a JSON-quoted string.
LOGFMT = re.compile(
    r'^ts=\S+ level=(debug|info|warn|error) logger=\S+ msg=("(?:[^"\\]|\\.)*"|\S+)( \w+=("(?:[^"\\]|\\.)*"|\S+))*$'
)


def _env(**extra: str) -> dict[str, str]:
    """The environment without any ARCHIVER_* a developer may have set, plus the token and ``extra``."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ARCHIVER_")}
    return {**clean, "ARCHIVER_API_TOKEN": TEST_TOKEN, **extra}


class _Run:
    """`archiver run` against the fake service, until it is ready on ``port``; its stderr once stopped."""

    def __init__(self, fake: FakeService, tmp_path: Path, args: list[str], env: dict[str, str], port: int) -> None:
        self.log = tmp_path / "archiver.log"
        command = [ARCHIVER, "run", "--api-url", fake.base_url, "--state-dir", str(tmp_path / "state"), *args]
        self.process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=self.log.open("wb"))
        self.url = f"http://127.0.0.1:{port}"

    def ready(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(f"archiver exited: {self.log.read_text()[-3000:]}")
        try:
            return httpx.get(self.url + "/readyz", timeout=5).status_code == 200
        except httpx.TransportError:
            return False

    def stop(self) -> list[str]:
        self.process.terminate()
        assert self.process.wait(15) == 0
        return self.log.read_text().splitlines()


@pytest.fixture
def running(fake_service: FakeService, tmp_path: Path) -> Iterator[list[_Run]]:
    runs: list[_Run] = []
    yield runs
    for run in runs:
        if run.process.poll() is None:
            run.process.kill()
            run.process.wait()


def test_run_takes_the_exporter_names_and_logs_logfmt_at_warn(
    fake_service: FakeService, tmp_path: Path, running: list[_Run]
) -> None:
    """`archiver run --web.listen-address … --log.level warn --log.format logfmt`: served there, no
    deprecation, and every line it logs is logfmt at warn or above."""
    port = free_port()
    args = ["--web.listen-address", f"127.0.0.1:{port}", "--log.level", "warn", "--log.format", "logfmt"]
    run = _Run(fake_service, tmp_path, args, _env(), port)
    running.append(run)
    wait_until(run.ready, message="archiver /readyz")
    lines = run.stop()
    assert all(LOGFMT.match(line) for line in lines), lines
    assert not [line for line in lines if "level=info" in line or "deprecated" in line]


def test_run_under_the_0x_names_works_and_logs_one_deprecation_line_each(
    fake_service: FakeService, tmp_path: Path, running: list[_Run]
) -> None:
    """ARCHIVER_LISTEN, --web-config-file, --log-level warning and --log-format text: the daemon serves
    on that address, and says once per name, as a logfmt warn line, what to use instead."""
    port = free_port()
    web = tmp_path / "web.yml"
    web.write_text("")
    args = ["--web-config-file", str(web), "--log-level", "warning", "--log-format", "text"]
    run = _Run(fake_service, tmp_path, args, _env(ARCHIVER_LISTEN=f"127.0.0.1:{port}"), port)
    running.append(run)
    wait_until(run.ready, message="archiver /readyz")
    lines = run.stop()
    deprecated = [line for line in lines if "deprecated" in line]
    said = [re.search(r'msg="(\S+) is deprecated and will be removed in a future release: use (\S+) instead"', line)
            for line in deprecated]  # fmt: skip
    assert sorted((m.group(1), m.group(2)) for m in said if m) == [
        ("--log-format", "--log.format"),
        ("--log-level", "--log.level"),
        ("--web-config-file", "--web.config.file"),
        ("ARCHIVER_LISTEN", "ARCHIVER_WEB_LISTEN_ADDRESS"),
    ]
    assert all(LOGFMT.match(line) and " level=warn logger=archiver.config.settings " in line for line in deprecated)


def test_check_says_a_deprecated_name_once_in_its_log_and_keeps_stdout_clean(tmp_path: Path) -> None:
    archive = tmp_path / "archive"
    archive.mkdir()
    args = ["check", "--format", "json", "--listen", "127.0.0.1:1", "--log.format", "json"]
    args += ["--store", archive.as_uri(), "--state-dir", str(tmp_path / "state")]
    result = subprocess.run([ARCHIVER, *args], env=_env(), capture_output=True, text=True, timeout=60)
    assert json.loads(result.stdout)["ready"] is False  # no upstream configured: exit 1, as before
    [line] = [json.loads(line) for line in result.stderr.splitlines() if "deprecated" in line]
    assert line["level"] == "warn" and line["msg"].startswith("--listen is deprecated")


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--web.listen-address", "nowhere"], "--web.listen-address: expected HOST:PORT"),
        (["--listen", "nowhere"], "--listen: expected HOST:PORT"),
    ],
)
def test_demo_takes_the_new_address_name_and_the_old_one(tmp_path: Path, args: list[str], says: str) -> None:
    """A bad address is refused before anything starts, naming the spelling it was given as."""
    result = subprocess.run(
        [ARCHIVER, "demo", "--archive-dir", str(tmp_path / "a"), "--state-dir", str(tmp_path / "s"), *args],
        env=_env(), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2 and says in result.stderr and "Traceback" not in result.stderr


def test_level_and_format_keep_their_0x_values_as_synonyms(tmp_path: Path) -> None:
    assert settings_from(["--log.level", "warn"]).log_level == "warn"
    assert settings_from(["--log.level", "warning"]).log_level == "warn"
    assert settings_from(["--log-level", "error"]).log_level == "error"
    assert settings_from(["--log.format", "text"]).log_format == "logfmt"
    assert settings_from([], {"ARCHIVER_LOG_FORMAT": "json"}).log_format == "json"
    assert settings_from([]).log_format == "logfmt"
    with pytest.raises(ConfigError, match=r"--log\.format: expected one of logfmt, json, got 'xml'"):
        settings_from(["--log.format", "xml"])
    with pytest.raises(ConfigError, match=r"--log\.level: expected one of debug, info, warn, error"):
        settings_from(["--log.level", "verbose"])


def test_the_listen_address_under_every_spelling(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    old_file = tmp_path / "old.toml"
    old_file.write_text('listen = ":9100"\n')
    new_file = tmp_path / "new.toml"
    new_file.write_text('web_listen_address = ":9101"\n')
    with caplog.at_level(logging.WARNING, "archiver.config.settings"):
        assert settings_from(["--config", str(old_file)]).listen == ("0.0.0.0", 9100)
        assert settings_from(["--config", str(new_file)]).listen == ("0.0.0.0", 9101)
        assert settings_from([], {"ARCHIVER_WEB_LISTEN_ADDRESS": ":9102"}).listen == ("0.0.0.0", 9102)
        # The new name in the file outranks nothing given on the command line under the old one.
        assert settings_from(["--listen", ":9103", "--config", str(new_file)]).listen == ("0.0.0.0", 9103)
    said = [r.getMessage().split(" is deprecated")[0].replace(f"{tmp_path}/", "") for r in caplog.records]
    assert said == ["old.toml: listen", "--listen"]
