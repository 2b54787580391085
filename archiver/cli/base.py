"""The command line's shared parts: the `archiver` group, option plumbing (flag > env > config file),
one error edge, `--format` and `--instance`, the store a command reads."""

from __future__ import annotations

import functools
import logging
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click
from click.core import ParameterSource

from archiver import __version__
from archiver.app import logs as logsetup
from archiver.cli.params import INSTANCE, ArchiverGroup, LocalPath
from archiver.config.command_options import COMMAND_OPTIONS, COMMAND_SCOPES
from archiver.config.option import Alias, Option, by_key
from archiver.config.options import DAEMON_SCOPES, OPTIONS
from archiver.config.settings import (
    SETTINGS_LOGGER,
    Given,
    Origin,
    Settings,
    build_settings,
    convert_values,
    read_config_file,
)
from archiver.errors import ArchiverError, ConfigError, InputError
from archiver.textsafe import one_line

if TYPE_CHECKING:
    from archiver.store import ObjectStore  # imports botocore: kept out of `archiver --help`

F = TypeVar("F", bound=Callable[..., Any])


_CONFIG_META = "archiver.config"


def _read_config(
    options: Sequence[Option],
    scopes: frozenset[str],
    command: str | None,
    ctx: click.Context,
    _param: click.Parameter,
    value: str | None,
) -> str | None:
    """Eager `--config` callback: the TOML file becomes click's `default_map` (each key of an option
    the command takes, for the parameter of its spelling), so every option resolves flag > env var >
    file > default by click's own rules. Keys of the command's other options are known, not used;
    a command's own options (`archiver.config.command_options`) come from its table (``[browse]``)."""
    if value is None:
        return None
    try:
        data = read_config_file(Path(value), options)
    except ConfigError as exc:
        # Raised while click parses, before friendly_errors runs: the same one line and exit 2.
        click.echo(f"error: configuration: {one_line(str(exc))}", err=True)
        ctx.exit(2)
    defaults = _file_defaults(data, by_key(options), scopes)
    if command is not None:
        own = COMMAND_OPTIONS[command]
        defaults.update(_file_defaults(data.get(command, {}), by_key(own), frozenset({command})))
    ctx.default_map = {**(ctx.default_map or {}), **defaults}
    ctx.meta[_CONFIG_META] = (data, value)
    return value


def _file_defaults(
    data: Mapping[str, Any], spelled: Mapping[str, tuple[Option, Alias | None]], scopes: frozenset[str]
) -> dict[str, Any]:
    """click parameter → the file's raw value, for the keys of options of `scopes`."""
    defaults: dict[str, Any] = {}
    for key, raw in data.items():
        if key not in spelled or spelled[key][0].scope not in scopes:
            continue  # [images], [browse]: read elsewhere; another command's option: known, not used
        opt, alias = spelled[key]
        # A multiple option's default must be a list for click; a TOML string is one item.
        defaults[alias.param if alias else opt.param] = [raw] if opt.multiple and isinstance(raw, str) else raw
    return defaults


def table_options(scopes: frozenset[str], options: Sequence[Option]) -> Callable[[F], F]:
    """Adds the options of `scopes` from an option table (see archiver.config.options.Option.scope) and
    their deprecated aliases (hidden); `resolve` / `resolve_values` convert what click found."""

    def decorate(func: F) -> F:
        for opt in reversed(options):
            if opt.scope not in scopes:
                continue
            for alias in opt.aliases:
                if alias.flag is None:
                    continue  # a former env var alone: read by `_given`
                func = click.option(
                    alias.flag,
                    alias.param,
                    multiple=opt.multiple,
                    type=click.UNPROCESSED,
                    envvar=alias.env,
                    hidden=True,
                )(func)
            if opt.switch:
                func = click.option(
                    f"{opt.flag}/{opt.off_flag}",
                    opt.param,
                    # Shown by --help; a value from this default is left to archiver.config.settings' own default.
                    default=opt.converted_default,
                    envvar=opt.env,
                    show_envvar=True,
                    show_default=True,
                    help=opt.help,
                )(func)
                continue
            func = click.option(
                opt.flag,
                opt.param,
                multiple=opt.multiple,
                # Shown by --help; a value from this default is left to archiver.config.settings' own default.
                default=opt.default,
                # Raw values (strings, or TOML ints and lists): archiver.config.settings converts them all alike.
                type=click.UNPROCESSED,
                envvar=opt.env,
                show_envvar=True,
                show_default=True,
                metavar=opt.metavar,
                help=opt.help,
            )(func)
        return func

    return decorate


def settings_options(
    scopes: frozenset[str] = DAEMON_SCOPES, options: Sequence[Option] = OPTIONS, *, command: str | None = None
) -> Callable[[F], F]:
    """Adds the configuration options of `scopes` (`table_options`), the own options of `command`
    (`archiver.config.command_options`; its scopes too when `scopes` is not given) and --config; click
    resolves each value from the flag, its env var or the file, and `resolve` converts them."""
    if command is not None and scopes is DAEMON_SCOPES:
        scopes = COMMAND_SCOPES[command]

    def decorate(func: F) -> F:
        if command is not None:
            func = table_options(frozenset({command}), COMMAND_OPTIONS[command])(func)
        func = table_options(scopes, options)(func)
        return click.option(
            "--config",
            "config_file",
            type=LocalPath(dir_okay=False),
            default=None,
            envvar="ARCHIVER_CONFIG",
            show_envvar=True,
            is_eager=True,
            expose_value=True,
            callback=functools.partial(_read_config, options, scopes, command),
            metavar="FILE.toml",
            help="TOML configuration file (keys are option names with underscores; "
            "a command's own options in its [command] table).",
        )(func)

    return decorate


#: Where click found a value, as archiver.config.settings ranks it (click's own default: not given).
_ORIGINS: dict[ParameterSource | None, Origin] = {
    ParameterSource.COMMANDLINE: Origin.FLAG,
    ParameterSource.ENVIRONMENT: Origin.ENV,
    ParameterSource.DEFAULT_MAP: Origin.FILE,
}


def _given(kwargs: dict[str, Any], options: Sequence[Option]) -> dict[str, list[Given]]:
    """Pops the values of `options` (and their aliases) out of a command's kwargs, each with where
    click found it; option key → values given."""
    ctx = click.get_current_context()
    raw: dict[str, list[Given]] = {}
    for opt in options:
        if opt.param not in kwargs:
            continue  # not an option of this command
        for param, alias in [(opt.param, None), *((a.param, a) for a in opt.aliases)]:
            if alias is not None and alias.flag is None:  # a former env var alone: no click parameter
                if alias.env and os.environ.get(alias.env):
                    raw.setdefault(opt.key, []).append(Given(os.environ[alias.env], Origin.ENV, alias))
                continue
            value = kwargs.pop(param)
            origin = _ORIGINS.get(ctx.get_parameter_source(param))
            if origin is not None:
                raw.setdefault(opt.key, []).append(Given(value, origin, alias))
    return raw


def _file(kwargs: dict[str, Any]) -> tuple[dict[str, Any], str]:
    kwargs.pop("config_file", None)
    data, name = click.get_current_context().meta.get(_CONFIG_META, ({}, ""))
    return data, name


def read_settings(kwargs: dict[str, Any]) -> tuple[Settings, list[logging.LogRecord]]:
    """`resolve`, keeping the lines it logs (an option given under a deprecated name) for the command
    to write once its logging is configured, in the configured format."""
    with logsetup.held(SETTINGS_LOGGER) as early:
        settings = resolve(kwargs)
    return settings, early


def resolve(kwargs: dict[str, Any]) -> Settings:
    """Pops the configuration options out of a command's kwargs and builds Settings from them
    (options the command does not take keep their defaults)."""
    file_data, file_name = _file(kwargs)
    return build_settings(_given(kwargs, OPTIONS), file_data=file_data, file_name=file_name, env=os.environ)


def read_command(kwargs: dict[str, Any], command: str) -> tuple[Settings, dict[str, Any], list[logging.LogRecord]]:
    """The settings and the own options' values of a command declared with
    `settings_options(command=...)`, and the deprecation lines to write once logging is configured.
    The own options are taken first: they share parameter names with the daemon's (web.*)."""
    with logsetup.held(SETTINGS_LOGGER) as early:
        values = resolve_values(kwargs, COMMAND_OPTIONS[command])
        settings = resolve(kwargs)
    return settings, values, early


def resolve_values(kwargs: dict[str, Any], options: Sequence[Option]) -> dict[str, Any]:
    """Pops the options of another table (`settings_options(..., options)`) out of a command's
    kwargs: their converted values by key, as `resolve` converts the configuration's."""
    _, file_name = _file(kwargs)
    return convert_values(_given(kwargs, options), file_name=file_name, options=options)


def friendly_errors(func: F) -> F:
    """A user mistake or an unreachable service is one clear line, never a traceback: exit 2 for a
    configuration or usage mistake, 1 for the rest."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except ConfigError as exc:
            click.echo(f"error: configuration: {one_line(str(exc))}", err=True)
            sys.exit(2)
        except InputError as exc:  # a value out of archiver.config.inputs' bounds: a usage mistake
            click.echo(f"error: {one_line(str(exc))}", err=True)
            sys.exit(2)
        except ArchiverError as exc:
            click.echo(f"error: {one_line(str(exc))}", err=True)
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


@click.group(cls=ArchiverGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(__version__, "-V", "--version", prog_name="archiver")
def main() -> None:
    """Prometheus exporter and forensic archiver for a game-server session hosting service."""


_TIME_HELP = "a duration before now (2h, 30m, 7d) or an ISO 8601 time (2026-11-22T10:00; UTC unless Z/+hh:mm)"


def instance_option(default: str) -> Callable[[F], F]:
    """``--instance NAME``: which archive of a reused session id (the retrieval commands share it)."""

    def decorate(func: F) -> F:
        return click.option(
            "--instance",
            metavar="NAME",
            type=INSTANCE,
            default=None,
            help="Which archive of a reused session id: its instance (creation time, e.g. 20261122T060305.123Z) "
            f"or `legacy`. [default: {default}]",
        )(func)

    return decorate


def store_opener(settings: Settings) -> Callable[[], ObjectStore]:
    """A picklable callable opening the settings' store (another process opens its own from it)."""
    from archiver.store import open_store

    return functools.partial(
        open_store,
        settings.require_store(),
        s3_endpoint_url=settings.s3_endpoint_url,
        checksum_mode=settings.s3_checksum,
    )


def store_for(settings: Settings) -> ObjectStore:
    return store_opener(settings)()


def as_dict(item: Any) -> dict[str, Any]:
    import dataclasses

    return dataclasses.asdict(item)


def duration_text(seconds: float) -> str:
    if seconds < 0:
        return "overdue"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


if __name__ == "__main__":  # pragma: no cover
    main()
