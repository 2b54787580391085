"""The command line (the only module that knows click): parses options at the edge and calls the workers."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click

from archiver import __version__
from archiver.errors import ArchiverError, ConfigError
from archiver.settings import OPTIONS, Option, Settings, load_settings

F = TypeVar("F", bound=Callable[..., Any])


def _help(opt: Option) -> str:
    default = opt.default
    if isinstance(default, tuple):
        default = ", ".join(default) if default else None
    if opt.key == "listen" and default is not None:
        default = "0.0.0.0:9877"
    shown = f"; default: {default}" if default not in (None, "") else ""
    return f"{opt.help} [env: {opt.env}{shown}]"


def settings_options(func: F) -> F:
    """Adds every configuration option; values are merged with env and file by archiver.settings."""
    for opt in reversed(OPTIONS):
        func = click.option(
            opt.flag,
            opt.key,
            multiple=opt.multiple,
            default=None,
            metavar=opt.metavar,
            help=_help(opt),
        )(func)
    func = click.option(
        "--config",
        "config_file",
        type=click.Path(dir_okay=False),
        default=None,
        metavar="FILE.toml",
        help="TOML configuration file (keys are option names with underscores). [env: ARCHIVER_CONFIG]",
    )(func)
    return func


def resolve(kwargs: dict[str, Any]) -> Settings:
    """Pops the configuration options out of a command's kwargs and merges them into Settings."""
    flags = {opt.key: kwargs.pop(opt.key, None) for opt in OPTIONS}
    return load_settings(flags, config_file=kwargs.pop("config_file", None))


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


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(__version__, prog_name="archiver")
def main() -> None:
    """Prometheus exporter and forensic archiver for a game-server session hosting service."""


@main.command()
@settings_options
@friendly_errors
def run(**kwargs: Any) -> None:
    """The daemon: poll the upstream, export /metrics, archive ended sessions."""
    from archiver import daemon

    daemon.run_forever(resolve(kwargs))


if __name__ == "__main__":  # pragma: no cover
    main()
