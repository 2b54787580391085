"""One naming rule for every command: an option's env var is ``ARCHIVER_`` plus its flag name, its
config file key the flag name with ``_`` (a command's own options in the file's table of that
command), and every former spelling is a hidden alias that still works with one deprecation line.

The commands are walked by click introspection of `archiver.cli.main`, so a new command or option
is checked without being listed here; only the per-invocation arguments (what to list, where to
write) are listed, and they must take no env var.
"""

from __future__ import annotations

import logging
import os
import ssl
import subprocess
from pathlib import Path

import click
import httpx
import pytest
from click.core import ParameterSource

from archiver.cli.base import main, read_command
from archiver.config.command_options import COMMAND_OPTIONS, COMMAND_SCOPES
from archiver.config.option import Option
from archiver.config.options import DAEMON_SCOPES, OPTIONS, STATUS_SCOPES, STORE_SCOPES
from tests.fixtures_http import TLSFiles
from tests.support import ARCHIVER, free_port, wait_until

#: Arguments of one invocation (what to show, where to write it): not configuration, so no env var
#: and no config key. Every other option of every command must follow the rule.
INVOCATION: dict[str, set[str]] = {
    "archive": {"--timeout"},
    "check": {"--format"},
    "status": {"--format"},
    "get": {"--out", "--extract", "--progress", "--instance"},
    "grep": {
        "--since",
        "--until",
        "--image",
        "--location",
        "--label",
        "--player",
        "--fixed-strings",
        "--ignore-case",
        "--workers",
        "--progress",
        "--format",
    },
    "hold": {"--instance"},
    "release": {"--instance"},
    "index-players": {"--checkpoint"},
    "logs": {"--stream", "--grep", "--ignore-case", "--capture", "--instance"},
    "ls": {"--since", "--until", "--image", "--location", "--label", "--limit", "--player", "--format"},
    "show": {"--format", "--instance"},
    "verify": {
        "--since",
        "--until",
        "--deep",
        "--require-store-proof",
        "--processes",
        "--instance",
        "--format",
        "--log",
        "--checkpoint",
        "--key",
    },
    "compact": {"--since", "--until", "--progress"},
    "sql": {"--since", "--until", "--format", "--ddl", "--index-url"},
    "keygen": {"--name", "--out", "--public"},
    "prove": {"--instance", "--out", "--key"},
    "verify-bundle": {"--key", "--tsa-cert"},
    "log backfill": {"--writer", "--min-age"},
}
#: Hidden spellings that are no alias of a table option: `fake-service --token` (its value is a
#: token, not the file its replacement takes; deprecated by the command itself).
OWN_DEPRECATIONS = {("fake-service", "--token")}
#: The daemon's table scopes each command takes (the rest: `COMMAND_SCOPES`).
SCOPES = {
    "run": DAEMON_SCOPES,
    "archive": DAEMON_SCOPES,
    "check": DAEMON_SCOPES,
    "status": STATUS_SCOPES,
    # Offline: they read no store and no configuration, only their arguments.
    "keygen": frozenset(),
    "verify-bundle": frozenset(),
}


def rule_env(flag: str) -> str:
    return "ARCHIVER_" + flag.removeprefix("--").replace(".", "_").replace("-", "_").upper()


def rule_key(flag: str) -> str:
    return flag.removeprefix("--").replace(".", "_").replace("-", "_")


def table_of(command: str) -> list[Option]:
    """The table options a command takes: the daemon table's of its scopes, then its own."""
    scopes = SCOPES.get(command, COMMAND_SCOPES.get(command, STORE_SCOPES))
    return [opt for opt in OPTIONS if opt.scope in scopes] + list(COMMAND_OPTIONS.get(command, ()))


def long_flag(param: click.Option) -> str:
    return next(opt for opt in param.opts if opt.startswith("--"))


def command_of(name: str) -> click.Command:
    """A command by its name on the command line ("log backfill": a group's subcommand)."""
    cmd: click.Command = main
    for word in name.split():
        assert isinstance(cmd, click.Group)
        cmd = cmd.commands[word]
    return cmd


#: Every command, a group's subcommands by their full name ("log backfill"), never the group itself.
COMMANDS = sorted(
    f"{name} {sub}" if sub else name
    for name, cmd in main.commands.items()
    for sub in (sorted(cmd.commands) if isinstance(cmd, click.Group) else [""])
)


def test_every_command_is_walked() -> None:
    assert {"run", "browse", "demo", "fake-service", "archive", "check", "ls", "status"} <= set(COMMANDS)
    assert set(INVOCATION) <= set(COMMANDS)
    assert "log backfill" in COMMANDS and "log" not in COMMANDS


@pytest.mark.parametrize("command", COMMANDS)
def test_every_option_of_the_command_follows_the_naming_rule(command: str) -> None:
    """Each visible option is a table option (env var and key by the rule, the key read from the
    file) or a per-invocation argument (no env var); each hidden one is a declared alias."""
    cmd = command_of(command)
    table = {opt.flag: opt for opt in table_of(command)}
    aliases = {alias.flag: (opt, alias) for opt in table.values() for alias in opt.aliases if alias.flag}
    visible = set()
    for param in cmd.params:
        if not isinstance(param, click.Option) or param.name == "help":
            continue
        flag = long_flag(param)
        if param.hidden:
            if (command, flag) in OWN_DEPRECATIONS:
                continue
            assert flag in aliases, f"{command} {flag}: hidden, but no alias of a table option"
            opt, alias = aliases[flag]
            assert param.envvar == alias.env, f"{command} {flag}"
            continue
        visible.add(flag)
        if flag == "--config":
            assert param.envvar == rule_env(flag)
        elif flag in table:
            opt = table[flag]
            assert param.envvar == rule_env(flag) == opt.env, f"{command} {flag}"
            assert opt.key == rule_key(flag) == param.name, f"{command} {flag}"
            assert param.show_envvar, f"{command} {flag}: --help does not name its env var"
        else:
            assert flag in INVOCATION.get(command, set()), f"{command} {flag}: neither configuration nor listed"
            assert not param.envvar, f"{command} {flag}: an invocation argument with an env var"
    assert set(table) <= visible, f"{command}: table options not on the command: {set(table) - visible}"
    if table:
        assert "--config" in visible, f"{command}: its options cannot come from a config file"


@pytest.mark.parametrize("command", [c for c in COMMANDS if table_of(c)])
def test_every_configuration_option_comes_from_the_env_var_and_the_file(
    command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """click itself resolves each option from ``ARCHIVER_<FLAG>`` and from the file's key (top level
    for the daemon's table, the command's own table for its own options)."""
    for name in [name for name in os.environ if name.startswith("ARCHIVER_")]:
        monkeypatch.delenv(name)
    cmd = command_of(command)
    own = {opt.key for opt in COMMAND_OPTIONS.get(command, ())}
    top, section = [], []
    for opt in table_of(command):
        value = "true" if opt.switch else f'"{opt.key}-from-file"'
        (section if opt.key in own else top).append(f"{opt.key} = {value}")
    config = tmp_path / "archiver.toml"
    config.write_text("\n".join([*top, f'["{command}"]', *section, ""]) if own else "\n".join([*top, ""]))
    ctx = cmd.make_context(command, ["--config", str(config), *_required_arguments(cmd)])
    for opt in table_of(command):
        assert ctx.get_parameter_source(opt.param) is ParameterSource.DEFAULT_MAP, f"{command} {opt.key}"
        expected = True if opt.switch else f"{opt.key}-from-file"
        assert ctx.params[opt.param] in (expected, (expected,)), f"{command} {opt.key}"
        monkeypatch.setenv(opt.env, "false" if opt.switch else f"{opt.key}-from-env")
    ctx = cmd.make_context(command, ["--config", str(config), *_required_arguments(cmd)])
    for opt in table_of(command):
        assert ctx.get_parameter_source(opt.param) is ParameterSource.ENVIRONMENT, f"{command} {opt.env}"


def _required_arguments(cmd: click.Command) -> list[str]:
    """Placeholder values of the command's required arguments and required options (`prove -o`)."""
    arguments = ["x" for param in cmd.params if isinstance(param, click.Argument) and param.required]
    options = [
        part
        for param in cmd.params
        if isinstance(param, click.Option) and param.required
        for part in (long_flag(param), "x")
    ]
    return arguments + options


def test_a_command_table_in_the_file_holds_only_that_commands_options(tmp_path: Path) -> None:
    config = tmp_path / "archiver.toml"
    config.write_text('[browse]\nstate_dir = "/tmp/x"\n')
    result = subprocess.run([ARCHIVER, "browse", "--config", str(config)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "unknown key 'state_dir' in [browse]" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("command", "env", "key", "value"),
    [
        ("browse", "ARCHIVER_BROWSE_LISTEN", "web_listen_address", ("127.0.0.1", 9300)),
        ("browse", "ARCHIVER_BROWSE_EXTERNAL_URL", "web_external_url", "https://example.test/evidence"),
        ("browse", "ARCHIVER_BROWSE_ROUTE_PREFIX", "web_route_prefix", "/evidence"),
        ("demo", "ARCHIVER_DEMO_LISTEN_ADDRESS", "web_listen_address", ("127.0.0.1", 9300)),
    ],
)
def test_a_former_env_var_still_works_with_one_deprecation_line(
    command: str, env: str, key: str, value: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in [name for name in os.environ if name.startswith("ARCHIVER_")]:
        monkeypatch.delenv(name)
    raw = f"{value[0]}:{value[1]}" if isinstance(value, tuple) else str(value)
    monkeypatch.setenv(env, raw)
    ctx = main.commands[command].make_context(command, [])
    with ctx:
        _, values, early = read_command(dict(ctx.params), command)
    assert values[key] == value
    new = "ARCHIVER_" + key.upper()
    assert [r.getMessage() for r in early] == [
        f"{env} is deprecated and will be removed in a future release: use {new} instead"
    ]
    assert all(r.levelno == logging.WARNING for r in early)
    # The new name wins over the old one.
    monkeypatch.setenv(new, "127.0.0.1:9301" if isinstance(value, tuple) else f"{raw}/new")
    with main.commands[command].make_context(command, []) as ctx:
        _, values, _ = read_command(dict(ctx.params), command)
    assert values[key] != value


def test_browse_does_not_take_the_daemons_address_from_a_shared_file(tmp_path: Path) -> None:
    """A file shared with the daemon names the daemon's address at its top level; the browser's is
    in [browse] (else its default)."""
    config = tmp_path / "archiver.toml"
    config.write_text('web_listen_address = "0.0.0.0:9877"\n')
    with main.commands["browse"].make_context("browse", ["--config", str(config)]) as ctx:
        _, values, _ = read_command(dict(ctx.params), "browse")
    assert values["web_listen_address"] == ("127.0.0.1", 9878)
    config.write_text('web_listen_address = "0.0.0.0:9877"\n[browse]\nweb_listen_address = "0.0.0.0:9900"\n')
    with main.commands["browse"].make_context("browse", ["--config", str(config)]) as ctx:
        _, values, _ = read_command(dict(ctx.params), "browse")
    assert values["web_listen_address"] == ("0.0.0.0", 9900)


def _fake_env(**extra: str) -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if not k.startswith("ARCHIVER_")}, **extra}


def test_fake_service_takes_the_web_and_log_names_and_a_token_file(tmp_path: Path) -> None:
    """`ARCHIVER_WEB_LISTEN_ADDRESS`, `--api-token-file` and `--log.level`: served there, the
    file's tokens accepted, another refused."""
    port = free_port()
    tokens = tmp_path / "tokens"
    tokens.write_text("org-a-token\n\norg-b-token\n")
    log = tmp_path / "fake.log"
    process = subprocess.Popen(
        [ARCHIVER, "fake-service", "--api-token-file", str(tokens), "--log.level", "debug", "--log.format", "json"],
        env=_fake_env(ARCHIVER_WEB_LISTEN_ADDRESS=f"127.0.0.1:{port}"),
        stdout=subprocess.DEVNULL,
        stderr=log.open("wb"),
    )
    try:

        def status(token: str) -> int | None:
            if process.poll() is not None:
                raise AssertionError(log.read_text())
            try:
                auth = {"Authorization": f"Bearer {token}"}
                return httpx.get(f"http://127.0.0.1:{port}/session", headers=auth, timeout=5).status_code
            except httpx.TransportError:
                return None

        wait_until(lambda: status("org-b-token") == 200, message="fake service on ARCHIVER_WEB_LISTEN_ADDRESS")
        assert status("org-a-token") == 200
        assert status("test-token") == 401
    finally:
        process.terminate()
        process.wait(15)
    assert "deprecated" not in log.read_text()


def test_fake_service_old_spellings_work_with_a_deprecation_line_each(tmp_path: Path) -> None:
    port = free_port()
    log = tmp_path / "fake.log"
    process = subprocess.Popen(
        [ARCHIVER, "fake-service", "--listen", f"127.0.0.1:{port}", "--token", "old-token"],
        env=_fake_env(),
        stdout=subprocess.DEVNULL,
        stderr=log.open("wb"),
    )
    try:

        def ok() -> bool:
            if process.poll() is not None:
                raise AssertionError(log.read_text())
            try:
                auth = {"Authorization": "Bearer old-token"}
                return httpx.get(f"http://127.0.0.1:{port}/session", headers=auth, timeout=5).status_code == 200
            except httpx.TransportError:
                return False

        wait_until(ok, message="fake service on --listen")
    finally:
        process.terminate()
        process.wait(15)
    said = [line for line in log.read_text().splitlines() if "deprecated" in line]
    assert len(said) == 2, said
    assert any("--listen is deprecated" in line and "use --web.listen-address" in line for line in said)
    assert any("--token is deprecated" in line and "--api-token-file" in line for line in said)


def test_fake_service_serves_https_from_the_same_web_config_file(tmp_path: Path, self_signed_cert: TLSFiles) -> None:
    """`--web.config.file` as for `run`: its tls_server_config makes the fake an HTTPS upstream."""
    port = free_port()
    web = tmp_path / "web.yml"
    web.write_text(f"tls_server_config:\n  cert_file: {self_signed_cert.cert}\n  key_file: {self_signed_cert.key}\n")
    log = tmp_path / "fake.log"
    out = tmp_path / "fake.out"
    process = subprocess.Popen(
        [ARCHIVER, "fake-service", "--web.listen-address", f"127.0.0.1:{port}", "--web.config.file", str(web)],
        env=_fake_env(ARCHIVER_API_TOKEN="tls-token"),
        stdout=out.open("wb"),
        stderr=log.open("wb"),
    )
    verify = ssl.create_default_context(cafile=str(self_signed_cert.cert))
    try:

        def status() -> int | None:
            if process.poll() is not None:
                raise AssertionError(log.read_text())
            try:
                auth = {"Authorization": "Bearer tls-token"}
                return httpx.get(
                    f"https://127.0.0.1:{port}/session", headers=auth, verify=verify, timeout=5
                ).status_code
            except httpx.TransportError:
                return None

        wait_until(lambda: status() == 200, message="the fake service over TLS")
        with pytest.raises(httpx.TransportError):  # plain HTTP to a TLS port: no answer
            httpx.get(f"http://127.0.0.1:{port}/session", timeout=5)
        assert status() == 200  # a failed handshake did not take the server down
    finally:
        process.terminate()
        process.wait(15)
    assert f"https://127.0.0.1:{port}" in out.read_text()
    assert "Traceback" not in log.read_text()


def test_fake_service_refuses_basic_auth_users_in_one_line(tmp_path: Path) -> None:
    web = tmp_path / "web.yml"
    web.write_text("basic_auth_users:\n  alice: $2y$10$abcdefghijklmnopqrstuuJ2Q6GhY4vZrWjO2X3pV6lE5Yk5W6a1K\n")
    result = subprocess.run(
        [ARCHIVER, "fake-service", "--web.config.file", str(web)], env=_fake_env(), capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert result.returncode == 2 and "basic_auth_users is not for the fake service" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr


def test_demo_takes_the_web_config_file_and_the_log_options(tmp_path: Path, self_signed_cert: TLSFiles) -> None:
    """`demo --web.config.file` serves its /metrics and its browser over TLS; `--log.level` is checked
    like `run`'s (its default stays warn: the status line is the demo's output)."""
    bad = subprocess.run(
        [ARCHIVER, "demo", "--log.level", "verbose"], cwd=tmp_path, env=_fake_env(), capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert bad.returncode == 2 and "--log.level: expected one of debug, info, warn, error" in bad.stderr
    web = tmp_path / "web.yml"
    web.write_text(f"tls_server_config:\n  cert_file: {self_signed_cert.cert}\n  key_file: {self_signed_cert.key}\n")
    process = subprocess.Popen(
        [ARCHIVER, "demo", "--web.listen-address", "127.0.0.1:0", "--log.format", "json"],
        cwd=tmp_path,
        env=_fake_env(ARCHIVER_WEB_CONFIG_FILE=str(web), ARCHIVER_DURATION="60"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    verify = ssl.create_default_context(cafile=str(self_signed_cert.cert))
    try:
        assert process.stdout is not None
        urls = {}
        for line in process.stdout:
            name, _, url = line.partition(":")
            if name in ("metrics", "browser"):
                urls[name] = url.strip()
            if len(urls) == 2:
                break
        assert urls["metrics"].startswith("https://") and urls["browser"].startswith("https://"), urls
        assert "archiver_build_info" in httpx.get(urls["metrics"], verify=verify, timeout=10).text
        assert httpx.get(urls["browser"], verify=verify, timeout=10).status_code == 200
    finally:
        process.terminate()
        process.wait(30)
