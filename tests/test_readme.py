"""The README stays true: two Quick start commands, and a configuration table in sync with --help."""

from __future__ import annotations

import re
from pathlib import Path

from click.testing import CliRunner

from archiver.cli import main
from archiver.settings import option_table

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def section(title: str) -> str:
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## )", README, re.S | re.M)
    assert match, f"README has no '## {title}' section"
    return match.group(1)


def test_quick_start_has_exactly_the_demo_and_test_commands() -> None:
    block = re.search(r"```sh\n(.*?)```", section("Quick start"), re.S)
    assert block
    commands = [line.split("#")[0].strip() for line in block.group(1).splitlines() if line.split("#")[0].strip()]
    assert commands == ["make demo", "make test"]


def test_configuration_table_matches_the_option_table() -> None:
    rows = re.findall(
        r"^\| `(--[a-z0-9-]+)` \| `([A-Z0-9_]+)` \| `([^`]*)` \| (.*?) \|$", section("Configuration"), re.M
    )
    assert rows == [(flag, env, default, text) for flag, env, default, text in option_table()]


def test_every_run_option_in_help_is_documented_and_vice_versa() -> None:
    result = CliRunner().invoke(main, ["run", "--help"], terminal_width=200)
    assert result.exit_code == 0
    in_help = set(re.findall(r"^\s+(--[a-z0-9-]+)", result.output, re.M)) - {"--help", "--config"}
    documented = {flag for flag, *_ in option_table()}
    assert in_help == documented
    for flag, env, _default, _text in option_table():
        assert env in result.output, f"{flag}: --help does not name {env}"


def test_every_design_metric_is_documented() -> None:
    metrics = section("Metrics")
    for name in [
        "sessionhost_session_info", "sessionhost_session_created_timestamp_seconds", "sessionhost_session_players",
        "sessionhost_session_status", "sessionhost_session_labels", "sessionhost_sessions", "sessionhost_players",
        "archiver_build_info", "archiver_upstream_up", "archiver_upstream_last_success_timestamp_seconds",
        "archiver_upstream_poll_duration_seconds", "archiver_upstream_requests_total", "archiver_sessions_exported",
        "archiver_sessions_dropped", "archiver_sessions_ended_total", "archiver_items_total", "archiver_pending_items",
        "archiver_next_fetch_deadline_timestamp_seconds", "archiver_fetch_deadline_slack_seconds",
        "archiver_completion_delay_seconds", "archiver_bytes_total", "archiver_spool_bytes",
        "archiver_retention_seconds", "archiver_last_archive_success_timestamp_seconds",
    ]:  # fmt: skip
        assert f"`{name}`" in metrics, name
