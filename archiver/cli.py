"""The command line (the only module that knows click): parses options at the edge and calls the workers."""

from __future__ import annotations

import functools
import json
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click
from click.core import ParameterSource

from archiver import __version__
from archiver.errors import ArchiverError, ConfigError
from archiver.settings import (
    DAEMON_SCOPES,
    OPTIONS,
    OPTIONS_BY_KEY,
    STATUS_SCOPES,
    STORE_SCOPES,
    Option,
    Settings,
    build_settings,
    read_config_file,
)
from archiver.textsafe import printable

if TYPE_CHECKING:
    from archiver.store import ObjectStore  # imports botocore: kept out of `archiver --help`

F = TypeVar("F", bound=Callable[..., Any])


_CONFIG_META = "archiver.config"


def _read_config(ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    """Eager `--config` callback: the TOML file becomes click's `default_map`, so every option
    resolves flag > env var > file > default by click's own rules."""
    if value is None:
        return None
    try:
        data = read_config_file(Path(value))
    except ConfigError as exc:
        # Raised while click parses, before friendly_errors runs: the same one line and exit 2.
        click.echo(f"error: configuration: {exc}", err=True)
        ctx.exit(2)
    defaults: dict[str, Any] = {}
    for key, raw in data.items():
        opt = OPTIONS_BY_KEY.get(key)
        if opt is None:
            continue  # [images]: read by archiver.settings from the stashed file data
        # A multiple option's default must be a list for click; a TOML string is one item.
        defaults[key] = [raw] if opt.multiple and isinstance(raw, str) else raw
    ctx.default_map = {**(ctx.default_map or {}), **defaults}
    ctx.meta[_CONFIG_META] = (data, value)
    return value


def settings_options(scopes: frozenset[str] = DAEMON_SCOPES) -> Callable[[F], F]:
    """Adds the configuration options of `scopes` (see archiver.settings.Option.scope) and --config;
    click resolves each value from the flag, its env var or the file, and `resolve` converts them."""

    def decorate(func: F) -> F:
        for opt in reversed(OPTIONS):
            if opt.scope not in scopes:
                continue
            func = click.option(
                opt.flag,
                opt.key,
                multiple=opt.multiple,
                # Shown by --help; a value from this default is left to archiver.settings' own default.
                default=opt.default,
                # Raw values (strings, or TOML ints and lists): archiver.settings converts them all alike.
                type=click.UNPROCESSED,
                envvar=opt.env,
                show_envvar=True,
                show_default=True,
                metavar=opt.metavar,
                help=opt.help,
            )(func)
        return click.option(
            "--config",
            "config_file",
            type=click.Path(dir_okay=False),
            default=None,
            envvar="ARCHIVER_CONFIG",
            show_envvar=True,
            is_eager=True,
            expose_value=True,
            callback=_read_config,
            metavar="FILE.toml",
            help="TOML configuration file (keys are option names with underscores).",
        )(func)

    return decorate


def _source(opt: Option, source: ParameterSource | None, file_name: str) -> str | None:
    """Where a value came from, as error messages name it; None for click's (empty) default."""
    if source is ParameterSource.COMMANDLINE:
        return opt.flag
    if source is ParameterSource.ENVIRONMENT:
        return opt.env
    if source is ParameterSource.DEFAULT_MAP:
        return f"{file_name}: {opt.key}"
    return None


def resolve(kwargs: dict[str, Any]) -> Settings:
    """Pops the configuration options out of a command's kwargs and builds Settings from them
    (options the command does not take keep their defaults)."""
    import os

    ctx = click.get_current_context()
    kwargs.pop("config_file", None)
    file_data, file_name = ctx.meta.get(_CONFIG_META, ({}, ""))
    raw: dict[str, tuple[Any, str]] = {}
    for opt in OPTIONS:
        if opt.key not in kwargs:
            continue
        value = kwargs.pop(opt.key)
        source = _source(opt, ctx.get_parameter_source(opt.key), file_name)
        if source is not None and value is not None and value != ():
            raw[opt.key] = (value, source)
    return build_settings(raw, file_data=file_data, file_name=file_name, env=os.environ)


def friendly_errors(func: F) -> F:
    """A user mistake or an unreachable service is one clear line and exit 1, never a traceback."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except ConfigError as exc:
            click.echo(f"error: configuration: {exc}", err=True)
            sys.exit(2)
        except ArchiverError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(1)
        except BrokenPipeError:
            # `archiver logs ID | head`: the reader left; say nothing more.
            sys.stderr.close()
            sys.exit(0)

    return wrapper  # type: ignore[return-value]


def format_option(json_help: str = "") -> Callable[[F], F]:
    """``--format table|json``, the one output convention of status, ls, show, verify and check
    (`text`, show's former name for `table`, is still accepted)."""

    def decorate(func: F) -> F:
        return click.option(
            "--format",
            "fmt",
            type=click.Choice(["table", "json", "text"]),
            default="table",
            show_default=True,
            metavar="[table|json]",
            help=json_help or None,
            callback=lambda _ctx, _param, value: "table" if value == "text" else value,
        )(func)

    return decorate


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(__version__, "-V", "--version", prog_name="archiver")
def main() -> None:
    """Prometheus exporter and forensic archiver for a game-server session hosting service."""


@main.command()
@settings_options(DAEMON_SCOPES)
@friendly_errors
def run(**kwargs: Any) -> None:
    """The daemon: poll the upstream, export /metrics, archive ended sessions."""
    from archiver import daemon

    daemon.run_forever(resolve(kwargs))


@main.command("fake-service")
@click.option("--listen", default="127.0.0.1:8080", show_default=True, metavar="HOST:PORT", help="Address to serve on.")
@click.option(
    "--token",
    "tokens",
    multiple=True,
    metavar="TOKEN",
    help="Accepted token (repeat: one organisation each). [default: test-token]",
)
@click.option("--traffic/--no-traffic", default=False, help="Start, fill and end sessions continuously.")
@click.option("--traffic-rate", type=float, default=6.0, show_default=True, help="Sessions started per virtual minute.")
@click.option("--time-scale", type=float, default=1.0, show_default=True, help="Virtual seconds per real second.")
@click.option("--retention", default="4h", show_default=True, metavar="DURATION", help="Kept after termination.")
@click.option(
    "--quirk",
    "quirks",
    multiple=True,
    metavar="NAME[=VALUE]",
    help="Behave like a quirk of the real service.",
)
@click.option(
    "--fault",
    "faults",
    multiple=True,
    metavar="SPEC",
    help='Inject faults, e.g. "GET /session:status=502,count=3".',
)
@click.option("--capacity", multiple=True, metavar="LOCATION=N", help="Active sessions a location can hold.")
@click.option("--start-rate", type=int, default=None, metavar="N", help="Starts per organisation per virtual minute.")
@friendly_errors
def fake_service(**kwargs: Any) -> None:
    """The fake session hosting service alone (for trying things out and for your own CI)."""
    from archiver.fake.main import options_from_cli, serve_forever

    serve_forever(options_from_cli(**kwargs))


@main.command()
@settings_options(STATUS_SCOPES)
@format_option()
@friendly_errors
def status(fmt: str, **kwargs: Any) -> None:
    """Pending items in the local state DB, the time left to each fetch deadline, and failed sessions."""
    import time

    from archiver.archive.state import read_status

    settings = resolve(kwargs)
    items = read_status(settings.state_dir, time.time())
    if fmt == "json":
        click.echo(json.dumps([_as_dict(item) for item in items]))
        return
    if not items:
        click.echo("nothing pending")
        return
    click.echo(f"{'SESSION':40} {'KIND':8} {'STAGE':6} {'STATUS':13} {'TIME LEFT':>10} {'TRIES':>5}  PATH / LAST ERROR")
    for item in items:
        left = "-" if item.time_left is None else _duration(item.time_left)
        detail = item.path or ""
        if item.last_error:
            detail = f"{detail} ({item.last_error})" if detail else item.last_error
        click.echo(
            f"{printable(item.session_id)[:40]:40} {item.kind:8} {item.stage:6} {item.status:13} "
            f"{left:>10} {item.attempts:>5}  {printable(detail)}"
        )


@main.command()
@settings_options(DAEMON_SCOPES)
@click.argument("session_ids", nargs=-1, required=True, metavar="ID...")
@click.option("--timeout", "wait", default="30m", show_default=True, metavar="DURATION", help="How long to wait.")
@friendly_errors
def archive(session_ids: tuple[str, ...], wait: str, **kwargs: Any) -> None:
    """Archive these sessions now (backfill, while the upstream still holds them)."""
    from archiver.daemon import archive_now
    from archiver.settings import parse_duration

    try:
        timeout = parse_duration(wait)
    except ValueError as exc:
        raise ConfigError(f"--timeout: {exc}") from None
    queued, finished = archive_now(resolve(kwargs), list(session_ids), timeout=timeout)
    skipped = [sid for sid in session_ids if sid not in queued]
    click.echo(f"queued {len(queued)} session(s); skipped {len(skipped)} (see log lines for why)")
    if not finished:
        click.echo("error: not finished within --timeout; the daemon or a later run resumes the rest", err=True)
        sys.exit(1)


@main.command()
@click.option("--archive-dir", type=click.Path(file_okay=False), default="demo-archive", show_default=True)
@click.option("--state-dir", type=click.Path(file_okay=False), default=".archiver-demo-state", show_default=True)
@click.option("--listen", default="127.0.0.1:9877", show_default=True, metavar="HOST:PORT")
@click.option("--duration", type=float, default=None, metavar="SECONDS", help="Stop by itself after this long.")
@friendly_errors
def demo(archive_dir: str, state_dir: str, listen: str, duration: float | None) -> None:
    """Fake service with traffic + local archive + daemon: watch sessions being exported and archived."""
    import signal
    import threading
    from pathlib import Path

    from archiver.demo import DemoOptions, run_demo
    from archiver.settings import parse_listen

    try:
        address = parse_listen(listen)
    except ValueError as exc:
        raise ConfigError(f"--listen: {exc}") from None
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    # Hints name the program the way it was started, unless it is on PATH anyway.
    invoked = sys.argv[0]
    on_path = shutil.which("archiver")
    program = "archiver" if on_path and Path(on_path).resolve() == Path(invoked).resolve() else invoked
    options = DemoOptions(
        archive_dir=Path(archive_dir), state_dir=Path(state_dir), listen=address, duration=duration, program=program
    )
    run_demo(options, sys.stdout, stop=stop, is_tty=sys.stdout.isatty())


# --- retrieval and configuration check (archiver/retrieve.py, archiver/doctor.py) --------------------------

_TIME_HELP = "a duration before now (2h, 30m, 7d) or an ISO 8601 time (2026-11-22T10:00; UTC unless Z/+hh:mm)"


def instance_option(default: str) -> Callable[[F], F]:
    """``--instance NAME``: which archive of a reused session id (the retrieval commands share it)."""

    def decorate(func: F) -> F:
        return click.option(
            "--instance",
            metavar="NAME",
            default=None,
            help="Which archive of a reused session id: its instance (creation time, e.g. 20261122T060305.123Z) "
            f"or `legacy`. [default: {default}]",
        )(func)

    return decorate


def _store_for(settings: Settings) -> ObjectStore:
    from archiver.store import open_store

    return open_store(
        settings.require_store(), s3_endpoint_url=settings.s3_endpoint_url, checksum_mode=settings.s3_checksum
    )


@main.command("ls")
@click.option("--since", metavar="TIME", help=f"Ended at or after TIME: {_TIME_HELP}. [default: 24h]")
@click.option("--until", metavar="TIME", help="Ended at or before TIME (same forms). [default: no bound]")
@click.option("--image", metavar="NAME[:TAG]", help="Only this image (NAME or NAME:TAG).")
@click.option("--location", metavar="LOCATION", help="Only this location.")
@click.option(
    "--label",
    "labels",
    multiple=True,
    metavar="KEY=VALUE",
    help="Only sessions with this label (repeatable; all must match).",
)
@click.option("--limit", type=click.IntRange(min=1), default=None, metavar="N", help="At most N sessions (the newest).")
@format_option()
@settings_options(STORE_SCOPES)
@friendly_errors
def ls_command(
    since: str | None, until: str | None, image: str | None, location: str | None,
    labels: tuple[str, ...], limit: int | None, fmt: str, **kwargs: Any,
) -> None:  # fmt: skip
    """List archived sessions by end time, newest first (reads only the index hours of the range)."""
    from archiver.retrieval import retrieve

    settings = resolve(kwargs)
    now = time.time()
    try:
        start, end = retrieve.parse_time_range(since, until, now)
        wanted = dict(retrieve.parse_label(value) for value in labels)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    store = _store_for(settings)
    try:
        entries = retrieve.list_sessions(
            store, since=start, until=end, image=image, location=location, labels=wanted, limit=limit, now=now
        )
        retrieve.render_sessions(entries, sys.stdout, fmt=fmt)
    finally:
        store.close()


@main.command()
@click.argument("session_id")
@format_option("json: the stored manifest document as is.")
@instance_option("the newest")
@settings_options(STORE_SCOPES)
@friendly_errors
def show(session_id: str, fmt: str, instance: str | None, **kwargs: Any) -> None:
    """The manifest of an archived session, readable."""
    from archiver.retrieval import retrieve

    store = _store_for(resolve(kwargs))
    try:
        retrieve.show_session(store, session_id, sys.stdout, fmt="json" if fmt == "json" else "text", instance=instance)
    finally:
        store.close()


@main.command()
@click.argument("session_id")
@click.option(
    "--stream", type=click.Choice(["stdout", "stderr"]), default=None,
    help="Only this stream (where the upstream told them apart; else every line, with a note).",
)  # fmt: skip
@click.option(
    "--grep", "pattern", metavar="REGEX", help="Only lines matching this regular expression (searched anywhere)."
)
@click.option("-i", "--ignore-case", is_flag=True, help="--grep ignores case.")
@instance_option("the newest")
@settings_options(STORE_SCOPES)
@friendly_errors
def logs(
    session_id: str, stream: str | None, pattern: str | None, ignore_case: bool, instance: str | None, **kwargs: Any
) -> None:
    """The archived logs as plain text lines, whatever format the upstream sent."""
    from archiver.retrieval import retrieve

    try:
        grep = retrieve.compile_grep(pattern, ignore_case=ignore_case) if pattern is not None else None
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--grep") from None
    store = _store_for(resolve(kwargs))
    try:
        retrieve.print_logs(store, session_id, sys.stdout, stream=stream, grep=grep, instance=instance)
    finally:
        store.close()


@main.command()
@click.argument("session_id")
@click.option(
    "--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=Path("."), show_default=True,
    help="Downloads go to OUT/<session id, escaped>/ (OUT/<session id, escaped>.<instance>/ for an instance).",
)  # fmt: skip
@click.option(
    "--extract", is_flag=True, help="Also unpack artifacts (unsafe members skipped and listed) and write logs.txt."
)
@click.option("--progress/--no-progress", default=None, help="Progress bar on stderr. [default: when a terminal]")
@instance_option("the newest")
@settings_options(STORE_SCOPES)
@friendly_errors
def get(
    session_id: str, out_dir: Path, extract: bool, progress: bool | None, instance: str | None, **kwargs: Any
) -> None:
    """Download everything of an archived session, verifying each file's sha256."""
    from archiver.retrieval import retrieve

    store = _store_for(resolve(kwargs))
    try:
        loaded = retrieve.load_archive(store, session_id, instance)
        if sys.stderr.isatty() if progress is None else progress:
            total = retrieve.download_size(loaded.manifest)
            with click.progressbar(length=total, label="downloading", file=sys.stderr) as bar:
                result = retrieve.download_session(
                    store, session_id, out_dir, extract=extract, progress=bar.update, loaded=loaded
                )
        else:
            result = retrieve.download_session(store, session_id, out_dir, extract=extract, loaded=loaded)
        retrieve.render_download(result, sys.stdout)
    finally:
        store.close()


@main.command()
@click.argument("session_ids", nargs=-1)
@click.option("--since", metavar="TIME", help=f"Verify every session that ended since TIME: {_TIME_HELP}.")
@click.option("--until", metavar="TIME", help="With --since: up to TIME.")
@instance_option("every archive of each ID")
@format_option()
@settings_options(STORE_SCOPES)
@friendly_errors
def verify(
    session_ids: tuple[str, ...], since: str | None, until: str | None, instance: str | None, fmt: str, **kwargs: Any
) -> None:
    """Re-hash stored objects against their manifests (every archive of each ID); exit 1 when anything is wrong."""
    from archiver.retrieval import retrieve

    if session_ids and (since or until):
        raise click.UsageError("give session ids or --since/--until, not both")
    if instance is not None and not session_ids:
        raise click.UsageError("--instance picks an archive of the session ids given; give at least one ID")
    settings = resolve(kwargs)
    now = time.time()
    try:
        start, end = retrieve.parse_time_range(since, until, now)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    store = _store_for(settings)
    as_json = fmt == "json"
    try:
        report = retrieve.verify(
            store, session_ids=session_ids, instance=instance, since=start, until=end, now=now,
            # A table reports problems as they are found (a long run shows progress); JSON at the end.
            on_problem=None if as_json else lambda problem: click.echo(problem.line()),
        )  # fmt: skip
        if as_json:
            document = {
                "ok": report.ok, "sessions": report.sessions, "objects": report.objects, "bytes": report.bytes,
                "problems": [_as_dict(problem) for problem in report.problems],
            }  # fmt: skip
            click.echo(json.dumps(document))
        else:
            retrieve.render_verify(report, sys.stdout, problems=False)
    finally:
        store.close()
    sys.exit(0 if report.ok else 1)


#: Where `archiver browse` listens unless --listen is given on its command line (the daemon's
#: ARCHIVER_LISTEN / config `listen` name the /metrics address, not this one).
BROWSE_LISTEN = "127.0.0.1:9878"


@main.command()
@click.option(
    "--listen",
    "browse_listen",  # not `listen`: a shared config file's `listen` is the daemon's /metrics address
    default=BROWSE_LISTEN,
    show_default=True,
    envvar="ARCHIVER_BROWSE_LISTEN",
    show_envvar=True,
    metavar="HOST:PORT",
    help="Address the browser serves its pages on.",
)
@click.option(
    "--web-config-file",
    "web_config_file",
    type=click.Path(dir_okay=False),
    default=None,
    envvar="ARCHIVER_WEB_CONFIG_FILE",
    show_envvar=True,
    metavar="PATH",
    help="Exporter-toolkit web config (TLS, basic auth), the same file as for /metrics.",
)
@settings_options(STORE_SCOPES)
@friendly_errors
def browse(browse_listen: str, web_config_file: str | None, **kwargs: Any) -> None:
    """The evidence browser: read-only web pages over the archive (list, session, logs, downloads).

    Needs only the store's read permissions.
    """
    import signal
    import threading

    from archiver.browse.app import BrowseApp
    from archiver.browse.server import BrowseServer
    from archiver.exporter.webconfig import load_web_config
    from archiver.settings import parse_listen

    settings = resolve(kwargs)
    try:
        address = parse_listen(browse_listen)
    except ValueError as exc:
        raise ConfigError(f"--listen: {exc}") from None
    web_config = load_web_config(web_config_file) if web_config_file else None
    store = _store_for(settings)
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    try:
        with BrowseServer(address, BrowseApp(store), web_config=web_config) as server:
            click.echo(f"evidence browser: {server.url}/sessions (store {store.url})", err=True)
            stop.wait()
    finally:
        store.close()


@main.command()
@format_option()
@settings_options(DAEMON_SCOPES)
@friendly_errors
def check(fmt: str, **kwargs: Any) -> None:
    """Check the configuration: token accepted, store writable with create-once writes, state dir writable."""
    from archiver import doctor

    settings = resolve(kwargs)
    if fmt != "json":
        sys.exit(doctor.check(settings, sys.stdout))
    results = doctor.run_checks(settings)
    ready = all(result.status != doctor.FAIL for result in results)
    click.echo(json.dumps({"ready": ready, "checks": [_as_dict(result) for result in results]}))
    sys.exit(0 if ready else 1)


def _as_dict(item: Any) -> dict[str, Any]:
    import dataclasses

    return dataclasses.asdict(item)


def _duration(seconds: float) -> str:
    if seconds < 0:
        return "overdue"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


if __name__ == "__main__":  # pragma: no cover
    main()
