"""The commands that run things: the daemon, the demo, the fake service, backfill, status, the config check."""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import click

from archiver.cli.base import (
    as_dict,
    duration_text,
    format_option,
    friendly_errors,
    main,
    read_command,
    read_settings,
    resolve,
    settings_options,
)
from archiver.cli.params import SENDABLE_ID
from archiver.config.options import DAEMON_SCOPES, STATUS_SCOPES
from archiver.config.settings import SETTINGS_LOGGER
from archiver.errors import ConfigError
from archiver.textsafe import printable


@main.command()
@settings_options(DAEMON_SCOPES)
@friendly_errors
def run(**kwargs: Any) -> None:
    """The daemon: poll the upstream, export /metrics, archive ended sessions."""
    from archiver.app import daemon

    settings, early = read_settings(kwargs)
    daemon.run_forever(settings, early=early)


@main.command("fake-service")
@settings_options(command="fake-service")
# The 0.x plain token flag: still accepted for a release, with a deprecation line (a token is never a
# plain flag elsewhere; it has no table entry, since its value is a token, not a file).
@click.option("--token", "tokens", multiple=True, hidden=True)
@friendly_errors
def fake_service(tokens: tuple[str, ...], **kwargs: Any) -> None:
    """The fake session hosting service alone (for trying things out and for your own CI)."""
    from archiver.app import logs as logsetup
    from archiver.fake.main import options_from_values, serve_forever
    from archiver.web.webconfig import load_web_config

    settings, values, early = read_command(kwargs, "fake-service")
    logsetup.configure(settings.log_format, settings.log_level, early=early)
    if tokens:
        logging.getLogger(SETTINGS_LOGGER).warning(
            "--token is deprecated and will be removed in a future release: "
            "use --api-token-file (or ARCHIVER_API_TOKEN) instead"
        )
    tls = None
    if values["web_config_file"] is not None:
        web_config = load_web_config(values["web_config_file"])
        if web_config.basic_auth_users:
            raise ConfigError(
                "--web.config.file: basic_auth_users is not for the fake service (it takes bearer tokens)"
            )
        tls = web_config.ssl_context()
    serve_forever(options_from_values(values, tokens=tokens, env=os.environ, tls=tls))


@main.command()
@settings_options(STATUS_SCOPES)
@format_option()
@friendly_errors
def status(fmt: str, **kwargs: Any) -> None:
    """Pending items in the local state DB, the time left to each fetch deadline, and failed sessions."""

    from archiver.archive.state import read_status

    settings = resolve(kwargs)
    items = read_status(settings.state_dir, time.time())
    if fmt == "json":
        click.echo(json.dumps([as_dict(item) for item in items]))
        return
    if not items:
        click.echo("nothing pending")
        return
    click.echo(f"{'SESSION':40} {'KIND':8} {'STAGE':6} {'STATUS':13} {'TIME LEFT':>10} {'TRIES':>5}  PATH / LAST ERROR")
    for item in items:
        left = "-" if item.time_left is None else duration_text(item.time_left)
        detail = item.path or ""
        if item.last_error:
            detail = f"{detail} ({item.last_error})" if detail else item.last_error
        click.echo(
            f"{printable(item.session_id)[:40]:40} {item.kind:8} {item.stage:6} {item.status:13} "
            f"{left:>10} {item.attempts:>5}  {printable(detail)}"
        )


@main.command()
@settings_options(DAEMON_SCOPES)
@click.argument("session_ids", nargs=-1, required=True, metavar="ID...", type=SENDABLE_ID)
@click.option("--timeout", "wait", default="30m", show_default=True, metavar="DURATION", help="How long to wait.")
@friendly_errors
def archive(session_ids: tuple[str, ...], wait: str, **kwargs: Any) -> None:
    """Archive these sessions now (backfill, while the upstream still holds them)."""
    from archiver.app.daemon import archive_now
    from archiver.config.values import parse_duration

    try:
        timeout = parse_duration(wait)
    except ValueError as exc:
        raise ConfigError(f"--timeout: {exc}") from None
    settings, early = read_settings(kwargs)
    queued, finished = archive_now(settings, list(session_ids), timeout=timeout, early=early)
    skipped = [sid for sid in session_ids if sid not in queued]
    click.echo(f"queued {len(queued)} session(s); skipped {len(skipped)} (see log lines for why)")
    if not finished:
        click.echo("error: not finished within --timeout; the daemon or a later run resumes the rest", err=True)
        sys.exit(1)


@main.command()
@settings_options(command="demo")
@friendly_errors
def demo(**kwargs: Any) -> None:
    """Fake service with traffic + local archive + daemon: watch sessions being exported and archived."""
    import signal
    import threading

    from archiver.app.demo import DemoOptions, run_demo

    _, values, early = read_command(kwargs, "demo")
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    # Hints name the program the way it was started, unless it is on PATH anyway.
    invoked = sys.argv[0]
    on_path = shutil.which("archiver")
    program = "archiver" if on_path and Path(on_path).resolve() == Path(invoked).resolve() else invoked
    options = DemoOptions(
        archive_dir=values["archive_dir"],
        state_dir=values["state_dir"],
        listen=values["web_listen_address"],
        duration=values["duration"],
        program=program,
        web_config_file=values["web_config_file"],
        log_format=values["log_format"],
        log_level=values["log_level"],
    )
    run_demo(options, sys.stdout, stop=stop, is_tty=sys.stdout.isatty(), early=early)


@main.command()
@format_option()
@settings_options(DAEMON_SCOPES)
@friendly_errors
def check(fmt: str, **kwargs: Any) -> None:
    """Check the configuration: token accepted, store writable with create-once writes, state dir writable."""
    from archiver.app import doctor
    from archiver.app import logs as logsetup

    settings, early = read_settings(kwargs)
    if early:  # a deprecated option name: its line in the configured log format
        logsetup.configure(settings.log_format, settings.log_level, early=early)
    if fmt != "json":
        sys.exit(doctor.check(settings, sys.stdout))
    results = doctor.run_checks(settings)
    ready = all(result.status != doctor.FAIL for result in results)
    click.echo(json.dumps({"ready": ready, "checks": [as_dict(result) for result in results]}))
    sys.exit(0 if ready else 1)
