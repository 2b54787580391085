"""Configuration: precedence flag > env > file > default, clear errors, the token only from env or file,
and each command taking only its own options."""

from __future__ import annotations

import dataclasses
import json
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from archiver.cli.base import main, resolve_values, settings_options
from archiver.config.option import Alias, Option, check_options
from archiver.config.options import OPTIONS
from archiver.config.settings import COMPOSED, Settings, load_settings
from archiver.config.values import as_int, parse_duration, parse_listen, parse_size
from archiver.errors import ConfigError
from tests.support import settings_from


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(text)
    return path


def test_precedence_is_flag_then_env_then_file_then_default(tmp_path: Path) -> None:
    config = write(
        tmp_path, 'poll_interval = "30s"\nmax_sessions = 5\nlog_format = "json"\nartifact_path = ["/srv/a"]\n'
    )
    env = {"ARCHIVER_POLL_INTERVAL": "20s", "ARCHIVER_MAX_SESSIONS": "7", "ARCHIVER_ARTIFACT_PATH": "/srv/b,/srv/c"}
    settings = settings_from(["--poll-interval", "15s", "--config", str(config)], env)
    assert settings.poll_interval == 15.0  # flag
    assert settings.max_sessions == 7  # env over file
    assert settings.artifact_paths == ("/srv/b", "/srv/c")  # env over file, comma-separated
    assert settings.log_format == "json"  # file over default
    assert settings.retention == 4 * 3600  # default


def test_the_config_file_can_come_from_its_env_var(tmp_path: Path) -> None:
    config = write(tmp_path, 'state_dir = "/var/lib/x"\nsession_label_allowlist = "mode"\n')
    settings = settings_from([], {"ARCHIVER_CONFIG": str(config)})
    assert settings.state_dir == Path("/var/lib/x")
    assert settings.session_label_allowlist == ("mode",)  # a TOML string is a one-item list


def test_unknown_key_in_the_file_is_an_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown key 'poll_intervall'"):
        settings_from(["--config", str(write(tmp_path, "poll_intervall = 3\n"))])


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["--poll-interval", "soon"], {}, "--poll-interval: not a duration"),
        ([], {"ARCHIVER_POLL_INTERVAL": "soon"}, "ARCHIVER_POLL_INTERVAL: not a duration"),
        (["--max-sessions", "many"], {}, "--max-sessions: expected an integer"),
        (["--max-sessions", "--5"], {}, "--max-sessions: expected an integer"),  # isdigit() says yes
    ],
)
def test_a_bad_value_names_where_it_came_from(args: list[str], env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        settings_from(args, env)


def test_a_bad_value_in_the_file_names_the_file_and_key(tmp_path: Path) -> None:
    config = write(tmp_path, "max_sessions = true\n")
    with pytest.raises(ConfigError, match=re.escape(f"{config}: max_sessions: expected an integer")):
        settings_from(["--config", str(config)])


@pytest.mark.parametrize("text", ['log_format = ["json"]\n', "log_level = { a = 1 }\n"])
def test_a_table_or_array_for_a_choice_is_a_config_error(tmp_path: Path, text: str) -> None:
    config = write(tmp_path, text)
    with pytest.raises(ConfigError, match=re.escape(f"{config}: {text.split()[0]}: expected one of")):
        settings_from(["--config", str(config)])


def test_the_token_is_never_a_flag() -> None:
    with pytest.raises(ConfigError, match="No such option"):
        settings_from(["--api-token", "x"])


def test_prune_after_must_cover_two_retention_windows() -> None:
    with pytest.raises(ConfigError, match="prune-after must be at least twice"):
        settings_from(["--retention", "4h", "--prune-after", "7h"])


def test_worker_counts_must_be_positive() -> None:
    with pytest.raises(ConfigError, match="--fetch-workers must be between 1 and 256, got 0"):
        settings_from(["--fetch-workers", "0"])


def help_options(*command: str) -> set[str]:
    result = CliRunner().invoke(main, [*command, "--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    return set(re.findall(r"^\s+(--[a-z0-9.-]+)", result.output, re.M)) - {"--help"}


@pytest.mark.parametrize("command", ["ls", "show", "logs", "get", "verify"])
def test_retrieval_commands_take_only_the_store_options_besides_their_own(command: str) -> None:
    options = help_options(command)
    assert {"--store", "--s3-endpoint-url", "--s3-checksum", "--config"} <= options
    assert not options & {"--api-url", "--poll-interval", "--state-dir", "--listen", "--fetch-workers"}


def test_status_takes_only_the_state_dir() -> None:
    assert help_options("status") == {"--config", "--state-dir", "--format"}


@pytest.mark.parametrize("command", ["run", "check", "archive"])
def test_daemon_commands_take_every_daemon_option(command: str) -> None:
    assert {opt.flag for opt in OPTIONS} <= help_options(command)


@pytest.mark.parametrize("command", ["status", "ls", "show", "verify", "check"])
def test_every_reporting_command_has_one_format_convention(command: str) -> None:
    result = CliRunner().invoke(main, [command, "--help"], terminal_width=200)
    assert re.search(r"--format \[table\|json\]", result.output), result.output


def test_check_reports_as_json(tmp_path: Path) -> None:
    """`check --format json`: one document with the verdict and every check; exit 1 when not ready."""
    result = CliRunner().invoke(
        main,
        ["check", "--format", "json", "--state-dir", str(tmp_path / "state"), "--store", (tmp_path / "a").as_uri()],
        env={"ARCHIVER_API_TOKEN": None, "ARCHIVER_API_URL": None, "ARCHIVER_CONFIG": None},
    )
    document = json.loads(result.stdout)
    assert document["ready"] is False and result.exit_code == 1  # no upstream configured
    assert {"status", "name", "detail"} <= set(document["checks"][0])


def test_token_comes_from_env_or_file_and_is_never_shown(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("s3cr3t-token\n")
    settings = load_settings({"api_token_file": str(token_file)}, {})
    assert settings.api_token is not None and settings.api_token.reveal() == "s3cr3t-token"
    assert "s3cr3t" not in repr(settings)
    from_env = load_settings({}, {"ARCHIVER_API_TOKEN": "envtoken"})
    assert from_env.api_token is not None and from_env.api_token.reveal() == "envtoken"
    with pytest.raises(ConfigError, match="never goes in the config file"):
        settings_from(["--config", str(write(tmp_path, 'api_token = "x"\n'))])


def test_missing_token_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="api-token-file"):
        load_settings({"api_token_file": str(tmp_path / "nope")}, {})


def test_per_image_artifact_paths_merge_with_global_ones(tmp_path: Path) -> None:
    config = write(
        tmp_path,
        'artifact_path = ["/srv/replays"]\n[images."demo-game"]\nartifact_path = ["/srv/crash", "/srv/replays"]\n',
    )
    settings = settings_from(["--artifact-path", "/var/log/game", "--config", str(config)])
    assert settings.artifact_paths == ("/var/log/game",)  # the flag wins over the file's global list
    assert settings.artifact_paths_for("demo-game") == ("/var/log/game", "/srv/crash", "/srv/replays")
    assert settings.artifact_paths_for("other") == ("/var/log/game",)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"poll_interval": "soon"}, "--poll-interval: not a duration"),
        ({"store": "ftp://x"}, "--store: expected s3://"),
        ({"web_listen_address": "nope"}, "--web.listen-address: expected HOST:PORT"),
        ({"artifact_path": ("relative/path",)}, "absolute paths"),
        ({"log_format": "xml"}, "--log.format: expected one of logfmt, json"),
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


# --- one declaration per option ------------------------------------------------------------------


def test_every_option_fills_one_settings_field_whose_default_is_the_tables() -> None:
    """Each option's value lands in one Settings field; a field of its own defaults to the table's
    converted default, a COMPOSED one to what the table's defaults make; no field is left over
    but the file's per-image paths."""
    fields = {f.name for f in dataclasses.fields(Settings)}
    defaults = Settings()
    own = Counter(opt.field for opt in OPTIONS if opt.field not in COMPOSED)
    assert own and all(count == 1 for count in own.values()), own
    for opt in OPTIONS:
        assert opt.field in fields, opt.name
        if opt.field not in COMPOSED:
            assert getattr(defaults, opt.field) == opt.converted_default, opt.name
    assert {opt.field for opt in OPTIONS if opt.field in COMPOSED} == COMPOSED
    assert fields - {opt.field for opt in OPTIONS} == {"image_artifact_paths"}
    assert defaults == load_settings({}, {})  # the composed fields too
    assert (defaults.retention, defaults.max_artifact_size, defaults.listen) == (
        4 * 3600,
        110_000_000,
        ("0.0.0.0", 9877),
    )


# --- deprecated aliases (a throwaway table: the real one has none yet) ----------------------------

RENAMED = (
    Option("web.poll-every", "How often.", "10", as_int, metavar="N", aliases=(Alias("poll-every"),)),
    Option("other", "Another option.", None, as_int, metavar="N"),
)


def values_from(
    args: Sequence[str], env: Mapping[str, str] | None = None, options: tuple[Option, ...] = RENAMED
) -> dict[str, object]:
    """The converted values of `options` as a command declaring them resolves `args` and `env`."""
    resolved: list[dict[str, object]] = []

    @click.command()
    @settings_options(frozenset({"daemon"}), options)
    def probe(**kwargs: object) -> None:
        resolved.append(resolve_values(dict(kwargs), options))

    result = CliRunner().invoke(probe, list(args), env={"ARCHIVER_CONFIG": None, **(env or {})})
    if isinstance(result.exception, ConfigError):
        raise result.exception
    assert result.exit_code == 0, result.output
    return resolved[0]


def deprecations(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "archiver.config.settings" and r.levelname == "WARNING"]


def test_a_new_option_name_derives_its_flag_env_var_and_toml_key() -> None:
    opt = RENAMED[0]
    assert (opt.flag, opt.env, opt.key) == ("--web.poll-every", "ARCHIVER_WEB_POLL_EVERY", "web_poll_every")
    assert (opt.aliases[0].flag, opt.aliases[0].env, opt.aliases[0].key) == (
        "--poll-every",
        "ARCHIVER_POLL_EVERY",
        "poll_every",
    )


@pytest.mark.parametrize(
    ("args", "env", "file", "line"),
    [
        (["--poll-every", "7"], {}, "", "--poll-every is deprecated and will be removed in a future release: "
         "use --web.poll-every instead"),
        ([], {"ARCHIVER_POLL_EVERY": "7"}, "", "ARCHIVER_POLL_EVERY is deprecated and will be removed in a future "
         "release: use ARCHIVER_WEB_POLL_EVERY instead"),
        ([], {}, "poll_every = 7\n", "config.toml: poll_every is deprecated and will be removed in a future release: "
         "use web_poll_every instead"),
    ],
    ids=["flag", "env", "file"],
)  # fmt: skip
def test_an_old_name_still_works_and_logs_one_deprecation_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, args: list[str], env: dict[str, str], file: str, line: str
) -> None:
    if file:
        args = [*args, "--config", str(write(tmp_path, file))]
    assert values_from(args, env) == {"web_poll_every": 7, "other": None}
    assert [text.replace(str(tmp_path) + "/", "") for text in deprecations(caplog)] == [line]


def test_new_names_log_nothing_and_the_default_comes_from_the_table(caplog: pytest.LogCaptureFixture) -> None:
    assert values_from([]) == {"web_poll_every": 10, "other": None}
    assert values_from(["--web.poll-every", "3"], {"ARCHIVER_OTHER": "4"}) == {"web_poll_every": 3, "other": 4}
    assert deprecations(caplog) == []


def test_precedence_holds_across_old_and_new_names(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """flag > env > file whatever the spelling; at the same level the new name wins, and the old one
    given beside it is still reported."""
    assert values_from(["--web.poll-every", "1", "--poll-every", "2"])["web_poll_every"] == 1
    assert values_from(["--poll-every", "2"], {"ARCHIVER_WEB_POLL_EVERY": "3"})["web_poll_every"] == 2
    assert values_from([], {"ARCHIVER_POLL_EVERY": "4", "ARCHIVER_WEB_POLL_EVERY": "3"})["web_poll_every"] == 3
    config = write(tmp_path, "poll_every = 5\nweb_poll_every = 6\n")
    assert values_from(["--config", str(config)], {"ARCHIVER_POLL_EVERY": "4"})["web_poll_every"] == 4
    assert values_from(["--config", str(config)])["web_poll_every"] == 6
    named = [line.split(" is deprecated")[0].replace(f"{tmp_path}/", "") for line in deprecations(caplog)]
    assert named == [
        "--poll-every",
        "--poll-every",
        "ARCHIVER_POLL_EVERY",
        "ARCHIVER_POLL_EVERY",
        "config.toml: poll_every",
    ]


def test_a_bad_value_under_an_old_name_names_the_old_name() -> None:
    with pytest.raises(ConfigError, match="--poll-every: expected an integer"):
        values_from(["--poll-every", "many"])


def test_old_names_are_accepted_but_not_shown_in_help() -> None:
    @click.command()
    @settings_options(frozenset({"daemon"}), RENAMED)
    def probe(**kwargs: object) -> None:
        pass

    result = CliRunner().invoke(probe, ["--help"], terminal_width=200)
    assert "--web.poll-every" in result.output and "ARCHIVER_WEB_POLL_EVERY" in result.output
    assert "--poll-every" not in result.output.replace("--web.poll-every", "")


@pytest.mark.parametrize(
    "clash",
    [
        Option("a", "A.", None, as_int, aliases=(Alias("other"),)),
        Option("a", "A.", None, as_int, aliases=(Alias("b", env="ARCHIVER_OTHER"),)),
        Option("a", "A.", None, as_int, aliases=(Alias("b", env=None, key="other"),)),
        Option("a/b", "A.", None, as_int),
    ],
    ids=["alias name", "alias env", "key", "bad key"],
)
def test_the_table_refuses_a_spelling_that_names_two_things(clash: Option) -> None:
    with pytest.raises(ValueError, match=r"^option (a|other): .+ is also (a|other)$|not a bare identifier"):
        check_options((clash, RENAMED[1]))
    assert check_options(RENAMED) == RENAMED


def test_live_capture_is_on_by_default_and_switched_by_flag_env_or_file(tmp_path: Path) -> None:
    """--follow-logs / --no-follow-logs: a flag pair, its env var takes true/false, the file a
    boolean; flag > env > file as for every option; --follow-logs-max takes a count."""
    assert settings_from([]).follow_logs is True and settings_from([]).follow_logs_max == 5000
    config = write(tmp_path, "follow_logs = false\nfollow_logs_max = 12\n")
    assert settings_from(["--config", str(config)]).follow_logs is False
    assert settings_from(["--config", str(config)]).follow_logs_max == 12
    assert settings_from(["--config", str(config)], {"ARCHIVER_FOLLOW_LOGS": "true"}).follow_logs is True
    assert settings_from(["--no-follow-logs"], {"ARCHIVER_FOLLOW_LOGS": "true"}).follow_logs is False
    assert settings_from(["--follow-logs", "--config", str(config)]).follow_logs is True
    assert load_settings({"follow_logs": "off"}).follow_logs is False
    with pytest.raises(ConfigError):
        settings_from([], {"ARCHIVER_FOLLOW_LOGS": "maybe"})
    with pytest.raises(ConfigError, match="'sometimes' is not a valid boolean"):
        settings_from(["--config", str(write(tmp_path, 'follow_logs = "sometimes"\n'))])
    with pytest.raises(ConfigError, match="--follow-logs-max must be at least 0"):
        settings_from(["--follow-logs-max", "-1"])


@pytest.mark.parametrize(
    ("args", "cap"),
    [
        (["--follow-logs-max", "12"], 12),
        (["--follow-logs-max", "12", "--no-follow-logs"], 0),
        (["--follow-logs-max", "0"], 0),
    ],
)
def test_the_follow_cap_the_file_limit_is_raised_for_is_the_max_only_when_live_capture_runs(
    args: list[str], cap: int
) -> None:
    """Live capture runs with a store and an upstream; without either the daemon follows nothing."""
    token = {"ARCHIVER_API_TOKEN": "t"}
    api, store = ["--api-url", "http://upstream.invalid"], ["--store", "file:///tmp/archive"]
    assert settings_from([*api, *store, *args], token).follow_cap == cap
    assert settings_from([*store, *args], token).follow_cap == 0
    assert settings_from([*api, *args], token).follow_cap == 0
    assert settings_from([*api, *store, *args]).follow_cap == 0
