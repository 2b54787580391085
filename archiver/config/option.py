"""How an option is declared, once (`Option`: its flag, env var and TOML key, default, converter,
help, metavar, which commands take it, the Settings field it fills; `Alias`: a deprecated spelling),
and what checks and reads a table of them (`check_options`, `by_key`). The tables themselves are
`archiver.config.options` (the daemon's) and `archiver.config.command_options` (other commands').

Renaming an option keeps the old spelling working for a release: declare the new name and give the
old one as an ``Alias``. Flag, env var and TOML key of the alias are still accepted (never shown in
``--help``), and each use logs one line saying it is deprecated and what to use instead. Precedence
is unchanged: flag > env var > file > default, the option's own name before an alias at the same level.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

ENV_PREFIX = "ARCHIVER_"


def _key_of(name: str) -> str:
    """The TOML key (and click parameter name) of a spelling: `web.listen-address` → `web_listen_address`."""
    return name.replace("-", "_").replace(".", "_")


@dataclass(frozen=True, slots=True)
class Alias:
    """A deprecated spelling of an option, accepted for one more release. Each of flag (``--name``),
    env var (``ARCHIVER_NAME``) and TOML key (``name`` with underscores) is derived from the name
    unless given; None for ``flag``, ``env`` or ``key``: that spelling is not accepted (a former env
    var alone, such as ``ARCHIVER_BROWSE_LISTEN``, is an alias with neither flag nor key)."""

    name: str
    flag: str | None = ""
    env: str | None = ""
    key: str | None = ""

    def __post_init__(self) -> None:
        key = _key_of(self.name)
        if self.flag == "":
            object.__setattr__(self, "flag", "--" + self.name)
        if self.env == "":
            object.__setattr__(self, "env", ENV_PREFIX + key.upper())
        if self.key == "":
            object.__setattr__(self, "key", key)

    @property
    def param(self) -> str:
        """The hidden click parameter that takes this spelling's value."""
        return "deprecated_" + _key_of(self.name)


@dataclass(frozen=True, slots=True)
class Option:
    """One setting. Its flag ``--name``, env var ``ARCHIVER_NAME`` and TOML key ``name`` (``.`` and
    ``-`` as ``_``) always follow from the name: the one naming rule of every command (former
    spellings are aliases)."""

    name: str
    help: str
    #: The raw default, as a user would write it (shown by --help and the README); None: not set.
    default: Any
    #: Raw value (a flag's or env var's string, a TOML value) → typed value; ValueError if invalid.
    convert: Callable[[Any], Any]
    multiple: bool = False
    metavar: str = "TEXT"
    #: Which commands take it: "store" (every command that reads the store), "state" (`status` too),
    #: "daemon" (`run`, `archive`, `check` only), "log" (those, `browse`, `demo` and `fake-service`);
    #: a command's name: that command's own options (`archiver.config.command_options`).
    scope: str = "daemon"
    #: The Settings field its converted value fills (default: the key). Several options fill one
    #: field where `archiver.config.settings.COMPOSED` builds that field from them (evidence, shard, token).
    field: str = ""
    #: Derived from the name (see the class docstring), never given.
    flag: str = dataclasses.field(default="", init=False)
    env: str = dataclasses.field(default="", init=False)
    key: str = dataclasses.field(default="", init=False)
    #: Former spellings, still accepted with a deprecation line (see the module docstring).
    aliases: tuple[Alias, ...] = ()
    #: An on/off option: the flag turns it on, ``--no-`` + the name turns it off.
    switch: bool = False

    def __post_init__(self) -> None:
        key = _key_of(self.name)
        object.__setattr__(self, "key", key)
        object.__setattr__(self, "flag", "--" + self.name)
        object.__setattr__(self, "env", ENV_PREFIX + key.upper())
        object.__setattr__(self, "field", self.field or key)

    @property
    def param(self) -> str:
        """The click parameter that takes the option's own spelling."""
        return self.key

    @property
    def off_flag(self) -> str:
        """The flag that turns an on/off option off (``--no-name``)."""
        return "--no-" + self.flag.removeprefix("--")

    @property
    def shown_default(self) -> str:
        """The default as --help and the README show it (an on/off option: the flag in effect)."""
        default = self.default
        if self.switch:
            return (self.flag if self.convert(default) else self.off_flag).removeprefix("--")
        if isinstance(default, tuple):
            return ", ".join(default) if default else "(none)"
        return "(none)" if default is None else str(default)

    @property
    def converted_default(self) -> Any:
        """The default as the option's value (None stays None)."""
        return None if self.default is None else self.convert(self.default)


def check_options(options: Iterable[Option]) -> tuple[Option, ...]:
    """The table, after checking that no flag, env var, TOML key or parameter names two things
    (ValueError otherwise: a mistake in the table, found at import)."""
    options = tuple(options)
    seen: dict[str, str] = {}
    for opt in options:
        if not opt.key.isidentifier():
            raise ValueError(f"option {opt.name}: TOML key {opt.key!r} is not a bare identifier")
        spellings = [opt.flag, opt.env, "key " + opt.key, "param " + opt.param]
        if opt.switch:
            spellings.append(opt.off_flag)
        for alias in opt.aliases:
            if alias.key and not alias.flag:
                raise ValueError(f"option {opt.name}: alias {alias.name} has a TOML key but no flag")
            spellings += [s for s in (alias.flag, alias.env, alias.key and "key " + alias.key) if s]
            if alias.flag:
                spellings.append("param " + alias.param)
        for spelling in spellings:
            if spelling in seen:
                raise ValueError(f"option {opt.name}: {spelling} is also {seen[spelling]}")
            seen[spelling] = opt.name
    return options


def by_key(options: Iterable[Option]) -> dict[str, tuple[Option, Alias | None]]:
    """TOML key → (the option, the alias it spells or None): what a config file's key means."""
    found: dict[str, tuple[Option, Alias | None]] = {}
    for opt in options:
        found[opt.key] = (opt, None)
        for alias in opt.aliases:
            if alias.key:
                found[alias.key] = (opt, alias)
    return found
