"""`archiver browse`: the evidence browser's command, with the exporter conventions' web flags.

``--web.listen-address``, ``--web.config.file``, ``--web.external-url`` and ``--web.route-prefix``
as Prometheus spells them; the former ``--listen`` and ``--web-config-file`` still work for this
release (hidden from --help) and log one deprecation line when used.
"""

from __future__ import annotations

import logging
from typing import Any

import click

from archiver.cli.base import friendly_errors, main, resolve, settings_options, store_for
from archiver.errors import ConfigError
from archiver.settings import STORE_SCOPES

#: Where `archiver browse` listens unless --web.listen-address is given on its command line (the
#: daemon's ARCHIVER_LISTEN / config `listen` name the /metrics address, not this one).
BROWSE_LISTEN = "127.0.0.1:9878"

log = logging.getLogger("archiver.cli")


def _deprecated(old: str, new: str) -> None:
    log.warning("%s is deprecated and will be removed in a future release: use %s instead", old, new)


def _pick(new_value: Any, old_value: Any, old: str, new: str) -> Any:
    """The value of a renamed flag: the new spelling's when given, else the old one's (with a deprecation line)."""
    if old_value is None:
        return new_value
    _deprecated(old, new)
    ctx = click.get_current_context()
    new_given = ctx.get_parameter_source(new.lstrip("-").replace(".", "_").replace("-", "_"))
    return new_value if new_given is click.core.ParameterSource.COMMANDLINE else old_value


@main.command()
@click.option(
    "--web.listen-address",
    "web_listen_address",
    default=BROWSE_LISTEN,
    show_default=True,
    envvar="ARCHIVER_BROWSE_LISTEN",
    show_envvar=True,
    metavar="HOST:PORT",
    help="Address the browser serves its pages on.",
)
@click.option("--listen", "deprecated_listen", default=None, hidden=True)
@click.option(
    "--web.config.file",
    "web_config_file",
    type=click.Path(dir_okay=False),
    default=None,
    envvar="ARCHIVER_WEB_CONFIG_FILE",
    show_envvar=True,
    metavar="PATH",
    help="Exporter-toolkit web config (TLS, basic auth), the same file as for /metrics.",
)
@click.option("--web-config-file", "deprecated_web_config_file", type=click.Path(dir_okay=False), hidden=True)
@click.option(
    "--web.external-url",
    "web_external_url",
    default=None,
    envvar="ARCHIVER_BROWSE_EXTERNAL_URL",
    show_envvar=True,
    metavar="URL",
    help="The URL users reach the browser at (behind a proxy or an Ingress); its path prefixes every link "
    "and is the route prefix.",
)
@click.option(
    "--web.route-prefix",
    "web_route_prefix",
    default=None,
    envvar="ARCHIVER_BROWSE_ROUTE_PREFIX",
    show_envvar=True,
    metavar="PATH",
    help="Path the pages are served under. [default: the path of --web.external-url]",
)
@settings_options(STORE_SCOPES)
@friendly_errors
def browse(
    web_listen_address: str,
    deprecated_listen: str | None,
    web_config_file: str | None,
    deprecated_web_config_file: str | None,
    web_external_url: str | None,
    web_route_prefix: str | None,
    **kwargs: Any,
) -> None:
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
    from archiver.settings import parse_listen

    logsetup.configure()
    listen = _pick(web_listen_address, deprecated_listen, "--listen", "--web.listen-address")
    config_file = _pick(web_config_file, deprecated_web_config_file, "--web-config-file", "--web.config.file")
    settings = resolve(kwargs)
    try:
        address = parse_listen(listen)
    except ValueError as exc:
        raise ConfigError(f"--web.listen-address: {exc}") from None
    try:
        where = mount(web_external_url, web_route_prefix)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    web_config = load_web_config(config_file) if config_file else None
    store = store_for(settings)
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    try:
        with BrowseServer(address, BrowseApp(store, mount=where), web_config=web_config) as server:
            public = f" (public URL {web_external_url.rstrip('/')}/sessions)" if web_external_url else ""
            click.echo(f"evidence browser: {server.url}{where.route}/sessions{public} (store {store.url})", err=True)
            stop.wait()
    finally:
        store.close()
