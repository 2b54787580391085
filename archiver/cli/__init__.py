"""The command line, the only room that knows click: options are parsed at the edge into a frozen
`Settings`, and each command calls a worker in another room. `main` is the `archiver` entry point."""

from archiver.cli import browse_command as browse_command  # registers browse
from archiver.cli import daemon_commands as daemon_commands  # registers run, demo, status, check, ...
from archiver.cli import index_commands as index_commands  # registers compact, sql
from archiver.cli import retrieval_commands as retrieval_commands  # registers ls, show, logs, get, ...
from archiver.cli import tlog_commands as tlog_commands  # registers keygen, prove, verify-bundle, log
from archiver.cli.base import friendly_errors as friendly_errors
from archiver.cli.base import main as main
from archiver.cli.base import resolve as resolve
from archiver.cli.base import settings_options as settings_options
