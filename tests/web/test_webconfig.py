"""Tests of the exporter-toolkit web config: parsing, clear errors for bad files, basic auth checks."""

from __future__ import annotations

import base64
import logging
from pathlib import Path

import bcrypt
import pytest

from archiver.errors import ConfigError
from archiver.web.webconfig import BasicAuth, WebConfig, load_web_config, parse_web_config
from tests.fixtures_http import TLSFiles

#: Cost 4 keeps the tests fast; production hashes use 10-12.
HASH = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(4)).decode()


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "web.yml"
    path.write_text(text)
    return path


def test_a_full_config_is_parsed_with_paths_relative_to_the_file(tmp_path: Path, self_signed_cert: TLSFiles) -> None:
    (tmp_path / "certs").mkdir()
    (tmp_path / "certs" / "c.pem").write_bytes(self_signed_cert.cert.read_bytes())
    (tmp_path / "certs" / "k.pem").write_bytes(self_signed_cert.key.read_bytes())
    path = write(
        tmp_path,
        f"""
tls_server_config:
  cert_file: certs/c.pem
  key_file: certs/k.pem
  client_auth_type: VerifyClientCertIfGiven
  client_ca_file: certs/c.pem
  min_version: TLS13
basic_auth_users:
  prometheus: '{HASH}'
""",
    )
    config = load_web_config(path)
    assert config.tls is not None
    assert config.tls.cert_file == tmp_path / "certs" / "c.pem"
    assert config.tls.client_auth_type == "VerifyClientCertIfGiven"
    assert config.tls.min_version == "TLS13"
    assert dict(config.basic_auth_users) == {"prometheus": HASH}
    assert config.ssl_context() is not None


def test_an_empty_file_means_no_tls_and_no_auth(tmp_path: Path) -> None:
    assert load_web_config(write(tmp_path, "")) == WebConfig()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("tls_config: {}\n", "unknown key 'tls_config'"),
        ("tls_server_config:\n  cert_file: a\n  key_file: b\n  certfile: c\n", "unknown key 'certfile'"),
        (
            "tls_server_config:\n  cert_file: a\n  key_file: b\n  cipher_suites: [x]\n",
            "cipher_suites is not supported",
        ),
        ("tls_server_config:\n  key_file: b\n", "cert_file is required"),
        ("tls_server_config:\n  cert_file: a\n  key_file: b\n  min_version: TLS9\n", "min_version is 'TLS9'"),
        (
            "tls_server_config:\n  cert_file: a\n  key_file: b\n  client_auth_type: RequireAndVerifyClientCert\n",
            "client_ca_file is required",
        ),
        (
            "tls_server_config:\n  cert_file: a\n  key_file: b\n  client_auth_type: RequireAnyClientCert\n",
            "RequireAnyClientCert is not supported",
        ),
        ("basic_auth_users:\n  bob: plaintext-password\n", "user 'bob' is not a bcrypt hash"),
        ("- a list\n", "must be a mapping"),
        ("basic_auth_users: [\n", "not valid YAML"),
    ],
)
def test_bad_files_are_config_errors_that_name_the_problem(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_web_config(write(tmp_path, text))


def test_a_plaintext_password_is_never_echoed_in_the_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_web_config(write(tmp_path, "basic_auth_users:\n  bob: hunter2\n"))
    assert "hunter2" not in str(info.value)


def test_missing_certificate_files_fail_at_load_time(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="TLS certificate"):
        load_web_config(write(tmp_path, "tls_server_config:\n  cert_file: nope.pem\n  key_file: nope.key\n"))


def test_a_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="web config file"):
        load_web_config(tmp_path / "absent.yml")


def test_http_server_config_is_ignored_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="archiver.webconfig"):
        config = parse_web_config({"http_server_config": {"http2": True}}, base_dir=Path("."))
    assert config == WebConfig()
    assert "http_server_config is not supported" in caplog.text


def test_basic_auth_accepts_only_the_right_user_and_password() -> None:
    auth = BasicAuth({"prometheus": HASH})
    assert auth.check(basic("prometheus", "s3cret"))
    assert auth.check(basic("prometheus", "s3cret"))  # again, from the cache
    assert not auth.check(basic("prometheus", "wrong"))
    assert not auth.check(basic("someone", "s3cret"))
    assert not auth.check(basic("prometheu", "s3cret"))
    assert not auth.check(None)
    assert not auth.check("Bearer abc")
    assert not auth.check("Basic !!!not-base64")
    assert not auth.check("Basic " + base64.b64encode(b"no-colon").decode())
    assert not auth.check(basic("prometheus", "x" * 100))  # longer than bcrypt's 72 bytes


def test_a_successful_check_is_remembered_so_scrapes_do_not_pay_bcrypt_each_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The second check of the same credentials runs no bcrypt at all; a wrong password is never
    cached (counted, not timed: a wall-clock ratio flakes on a loaded machine)."""
    calls: list[bytes] = []
    real_checkpw = bcrypt.checkpw

    def counting_checkpw(password: bytes, hashed: bytes) -> bool:
        calls.append(password)
        return real_checkpw(password, hashed)

    monkeypatch.setattr(bcrypt, "checkpw", counting_checkpw)
    auth = BasicAuth({"prometheus": bcrypt.hashpw(b"pw", bcrypt.gensalt(4)).decode()})
    assert auth.check(basic("prometheus", "pw"))
    assert auth.check(basic("prometheus", "pw"))
    assert calls == [b"pw"]
    assert not auth.check(basic("prometheus", "nope"))
    assert not auth.check(basic("prometheus", "nope"))
    assert calls == [b"pw", b"nope", b"nope"]  # wrong attempts paid bcrypt again
