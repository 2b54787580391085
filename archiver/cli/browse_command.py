"""`archiver browse`: the evidence browser's command, with the exporter conventions' web flags.

Its own options (`archiver.options.BROWSE_OPTIONS`: ``--web.listen-address``, ``--web.config.file``,
``--web.external-url``, ``--web.route-prefix``, ``--search.max-seconds``, ``--search.max-bytes``),
the store options and the log options; the former ``--listen`` and ``--web-config-file`` still
work for this release and log one deprecation line.
"""

from __future__ import annotations

from typing import Any

import click

from archiver.cli.base import (
    friendly_errors,
    main,
    resolve,
    resolve_values,
    settings_options,
    store_for,
    table_options,
)
from archiver.errors import ConfigError
from archiver.options import BROWSE_OPTIONS, BROWSE_SCOPES


@main.command()
@table_options(frozenset({"browse"}), BROWSE_OPTIONS)
@settings_options(BROWSE_SCOPES)
@friendly_errors
def browse(**kwargs: Any) -> None:
    """The evidence browser: read-only web pages over the archive (list, search, session, logs, downloads).

    Needs only the store's read permissions.
    """
    import signal
    import threading

    from archiver import logs as logsetup
    from archiver.browse.app import BrowseApp
    from archiver.browse.server import BrowseServer
    from archiver.browse.urls import mount
    from archiver.exporter.webconfig import load_web_config
    from archiver.retrieval.budget import SearchBudget
    from archiver.settings import SETTINGS_LOGGER

    with logsetup.held(SETTINGS_LOGGER) as early:  # a deprecated option name's line, written once configured
        settings = resolve(kwargs)
        values = resolve_values(kwargs, BROWSE_OPTIONS)
    logsetup.configure(settings.log_format, settings.log_level, early=early)
    external_url = values["browse_external_url"]
    try:
        where = mount(external_url, values["browse_route_prefix"])
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    config_file = values["browse_web_config_file"]
    web_config = load_web_config(config_file) if config_file else None
    store = store_for(settings)
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    try:
        budget = SearchBudget(values["browse_search_max_seconds"], values["browse_search_max_bytes"])
        app = BrowseApp(store, mount=where, search_budget=budget)
        with BrowseServer(values["browse_listen_address"], app, web_config=web_config) as server:
            public = f" (public URL {external_url.rstrip('/')}/sessions)" if external_url else ""
            click.echo(f"evidence browser: {server.url}{where.route}/sessions{public} (store {store.url})", err=True)
            stop.wait()
    finally:
        store.close()
