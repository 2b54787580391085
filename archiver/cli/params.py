"""The command line's input edge: click types over `archiver.config.inputs`' checkers (a bad id, instance
or path is a usage error naming the argument), and the group that prints any usage error as one line."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import click

from archiver.config import inputs
from archiver.textsafe import one_line

if TYPE_CHECKING:
    _TextType = click.ParamType[str, str]  # generic from click 8.2; plain before
else:
    _TextType = click.ParamType


class Checked(_TextType):
    """A string checked by one of `archiver.config.inputs`' checkers; its ValueError is the usage error."""

    def __init__(self, check: Callable[[str], object], name: str) -> None:
        self._check = check
        self.name = name

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if not isinstance(value, str):
            return value  # a default, already of its type
        try:
            self._check(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)
        return value


#: An id looked up in the store (show, logs, get, verify, hold, release).
SESSION_ID = Checked(inputs.session_id, "session id")
#: An id sent to the upstream in a URL (`archive`).
SENDABLE_ID = Checked(inputs.sendable_id, "session id")
PLAYER_ID = Checked(lambda value: inputs.session_id(value, "player id"), "player id")
INSTANCE = Checked(inputs.instance, "instance")


class LocalPath(click.Path):
    """``click.Path`` that first refuses what the OS cannot take (NUL, too long; `inputs.local_path`)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str | os.PathLike):
            try:
                inputs.local_path(value, "path")
            except ValueError as exc:
                self.fail(str(exc), param, ctx)
        return super().convert(value, param, ctx)


@contextlib.contextmanager
def _one_line() -> Iterator[None]:
    try:
        yield
    except click.ClickException as exc:
        ctx = getattr(exc, "ctx", None)
        hint = f" (see {ctx.command_path} --help)" if isinstance(exc, click.UsageError) and ctx is not None else ""
        click.echo(f"error: {one_line(exc.format_message())}{hint}", err=True)
        raise click.exceptions.Exit(exc.exit_code) from None


class ArchiverGroup(click.Group):
    """The `archiver` group: a usage mistake (unknown option, bad value, missing argument) is one
    `error:` line and exit 2, like every other mistake, rather than click's usage block."""

    def make_context(
        self, info_name: str | None, args: list[str], parent: click.Context | None = None, **extra: Any
    ) -> click.Context:
        if not args and self.no_args_is_help:
            return super().make_context(info_name, args, parent, **extra)  # `archiver` alone: the help
        with _one_line():
            return super().make_context(info_name, args, parent, **extra)

    def invoke(self, ctx: click.Context) -> Any:
        with _one_line():
            return super().invoke(ctx)
