"""`archiver browse`: the evidence browser's command, with the exporter conventions' web flags.

Its own options (`archiver.config.command_options.BROWSE_OPTIONS`: ``--web.listen-address``,
``--web.config.file``, ``--web.external-url``, ``--web.route-prefix``, ``--search.max-seconds``,
``--search.max-bytes``; in the file's ``[browse]``
table), the store options and the log options; the former ``--listen``, ``--web-config-file`` and
``ARCHIVER_BROWSE_*`` still work for this release and log one deprecation line.
"""

from __future__ import annotations

from typing import Any

import click

from archiver.cli.base import friendly_errors, main, read_command, settings_options, store_for
from archiver.errors import ConfigError


@main.command()
@settings_options(command="browse")
@friendly_errors
def browse(**kwargs: Any) -> None:
    """The evidence browser: read-only web pages over the archive (list, search, session, logs, downloads).

    Needs only the store's read permissions.
    """
    import signal
    import threading

    from archiver.app import logs as logsetup
    from archiver.browse.app import BrowseApp
    from archiver.browse.server import BrowseServer
    from archiver.browse.urls import mount
    from archiver.retrieval.budget import SearchBudget
    from archiver.web.webconfig import load_web_config

    settings, values, early = read_command(kwargs, "browse")  # a deprecated name's line, written once configured
    logsetup.configure(settings.log_format, settings.log_level, early=early)
    external_url = values["web_external_url"]
    try:
        where = mount(external_url, values["web_route_prefix"])
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    config_file = values["web_config_file"]
    web_config = load_web_config(config_file) if config_file else None
    store = store_for(settings)
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    try:
        budget = SearchBudget(values["search_max_seconds"], values["search_max_bytes"])
        app = BrowseApp(store, mount=where, search_budget=budget)
        with BrowseServer(values["web_listen_address"], app, web_config=web_config) as server:
            public = f" (public URL {external_url.rstrip('/')}/sessions)" if external_url else ""
            click.echo(f"evidence browser: {server.url}{where.route}/sessions{public} (store {store.url})", err=True)
            stop.wait()
    finally:
        store.close()
