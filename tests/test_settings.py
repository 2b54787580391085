"""Configuration: precedence flag > env > file > default, clear errors, the token only from env or file."""

from __future__ import annotations

from pathlib import Path

import pytest

from archiver.errors import ConfigError
from archiver.settings import load_settings, parse_duration, parse_listen, parse_size


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(text)
    return path


def test_precedence_is_flag_then_env_then_file_then_default(tmp_path: Path) -> None:
    config = write(tmp_path, 'poll_interval = "30s"\nmax_sessions = 5\nlog_format = "json"\n')
    env = {"ARCHIVER_POLL_INTERVAL": "20s", "ARCHIVER_MAX_SESSIONS": "7"}
    settings = load_settings({"poll_interval": "15s"}, env, config)
    assert settings.poll_interval == 15.0  # flag
    assert settings.max_sessions == 7  # env over file
    assert settings.log_format == "json"  # file over default
    assert settings.retention == 4 * 3600  # default


def test_unknown_key_in_the_file_is_an_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown key 'poll_intervall'"):
        load_settings({}, {}, write(tmp_path, "poll_intervall = 3\n"))


def test_token_comes_from_env_or_file_and_is_never_shown(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("s3cr3t-token\n")
    settings = load_settings({"api_token_file": str(token_file)}, {})
    assert settings.api_token is not None and settings.api_token.reveal() == "s3cr3t-token"
    assert "s3cr3t" not in repr(settings)
    from_env = load_settings({}, {"ARCHIVER_API_TOKEN": "envtoken"})
    assert from_env.api_token is not None and from_env.api_token.reveal() == "envtoken"
    with pytest.raises(ConfigError, match="never goes in the config file"):
        load_settings({}, {}, write(tmp_path, 'api_token = "x"\n'))


def test_missing_token_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="api-token-file"):
        load_settings({"api_token_file": str(tmp_path / "nope")}, {})


def test_per_image_artifact_paths_merge_with_global_ones(tmp_path: Path) -> None:
    config = write(
        tmp_path,
        'artifact_path = ["/srv/replays"]\n[images."demo-game"]\nartifact_path = ["/srv/crash", "/srv/replays"]\n',
    )
    settings = load_settings({"artifact_path": ("/var/log/game",)}, {}, config)
    assert settings.artifact_paths == ("/var/log/game",)  # the flag wins over the file's global list
    assert settings.artifact_paths_for("demo-game") == ("/var/log/game", "/srv/crash", "/srv/replays")
    assert settings.artifact_paths_for("other") == ("/var/log/game",)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"poll_interval": "soon"}, "--poll-interval: not a duration"),
        ({"store": "ftp://x"}, "--store: expected s3://"),
        ({"listen": "nope"}, "--listen: expected HOST:PORT"),
        ({"artifact_path": ("relative/path",)}, "absolute paths"),
        ({"log_format": "xml"}, "expected one of text, json"),
    ],
)
def test_bad_values_name_the_option(flags: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_settings(flags, {})


def test_invalid_toml_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_settings({}, {}, write(tmp_path, "a = [\n"))


def test_value_parsers() -> None:
    assert parse_duration("2h30m") == 9000
    assert parse_duration("90") == 90
    assert parse_duration("1d") == 86400
    assert parse_listen(":9877") == ("0.0.0.0", 9877)
    assert parse_listen("[::1]:80") == ("::1", 80)
    assert parse_size("100MB") == 100_000_000
    assert parse_size("1MiB") == 1 << 20


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e400"])
def test_non_finite_durations_are_refused(value: str) -> None:
    """nan would make the poll loop spin; inf would kill it in Event.wait."""
    with pytest.raises(ConfigError, match="--poll-interval"):
        load_settings({"poll_interval": value}, {})
