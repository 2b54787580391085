"""The command line, the only room that knows click: options are parsed at the edge into a frozen
`Settings`, and each command calls a worker in another room. `base.main` is the `archiver` entry point."""

# Importing each command module registers its commands on the `archiver` group (`base.main`).
from archiver.cli import (  # noqa: F401
    browse_command,  # browse
    daemon_commands,  # run, demo, status, check, ...
    index_commands,  # compact, sql
    retrieval_commands,  # ls, show, logs, get, ...
    tlog_commands,  # keygen, prove, verify-bundle, log
)
