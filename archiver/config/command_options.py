"""The own option tables of the commands that are not the daemon (`browse`, `demo`, `fake-service`):
the same `Option` entries, and so the same naming rule, as `archiver.config.options.OPTIONS`.

Each command reads these from its flag, the env var of the rule (``ARCHIVER_`` + the flag name),
or the config file's table named after the command (``[browse]``, ``[demo]``, ``[fake-service]``):
a file shared with the daemon keeps the daemon's own ``web_listen_address`` at its top level, so
the browser's lives in ``[browse]``. The options the command shares with the daemon (store, log)
come from the file's top level as for `run`. The 0.x-era spellings (``--listen``,
``ARCHIVER_BROWSE_LISTEN``, ``ARCHIVER_DEMO_LISTEN_ADDRESS``, ...) are aliases.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from archiver.config.option import Alias, Option, check_options
from archiver.config.options import BROWSE_SCOPES, LOG_SCOPES, OPTIONS_BY_KEY, STORE_SCOPES
from archiver.config.values import (
    as_bool,
    as_float,
    as_int,
    as_items,
    as_list,
    as_listen,
    as_optional_path,
    as_path,
    as_str,
    parse_duration,
    parse_size,
    positive,
)

#: `archiver browse`'s own options, besides the store and log ones of OPTIONS.
BROWSE_OPTIONS: tuple[Option, ...] = check_options(
    (
        Option(
            "web.listen-address",
            "Address the browser serves its pages on.",
            "127.0.0.1:9878",
            as_listen,
            metavar="HOST:PORT",
            scope="browse",
            aliases=(Alias("listen", env=None, key=None), Alias("browse-listen", flag=None, key=None)),
        ),
        Option(
            "web.config.file",
            "Exporter-toolkit web config (TLS, basic auth), the same file as for /metrics.",
            None,
            as_optional_path,
            metavar="PATH",
            scope="browse",
            aliases=(Alias("web-config-file", env=None, key=None),),
        ),
        Option(
            "web.external-url",
            "The URL users reach the browser at (behind a proxy or an Ingress); its path prefixes "
            "every link and is the route prefix.",
            None,
            as_str,
            metavar="URL",
            scope="browse",
            aliases=(Alias("browse-external-url", flag=None, key=None),),
        ),
        Option(
            "web.route-prefix",
            "Path the pages are served under (default: the path of --web.external-url).",
            None,
            as_str,
            metavar="PATH",
            scope="browse",
            aliases=(Alias("browse-route-prefix", flag=None, key=None),),
        ),
        Option(
            "search.max-seconds",
            "A log search stops after this long and says so on its page (0: no limit).",
            "30s",
            parse_duration,
            metavar="DURATION",
            scope="browse",
        ),
        Option(
            "search.max-bytes",
            "A log search stops after reading this much log text (decompressed) and says so (0: no limit).",
            "4GB",
            parse_size,
            metavar="SIZE",
            scope="browse",
        ),
    )
)

#: `archiver grep`'s own options: how far one search may go.
GREP_OPTIONS: tuple[Option, ...] = check_options(
    (
        Option(
            "grep.max-seconds",
            "Stop the search after this long, say so and exit 3 (0: no limit).",
            "10m",
            parse_duration,
            metavar="DURATION",
            scope="grep",
        ),
        Option(
            "grep.max-bytes",
            "Stop the search after reading this much log text (decompressed), say so and exit 3 (0: no limit).",
            "0",
            parse_size,
            metavar="SIZE",
            scope="grep",
        ),
    )
)

#: `archiver demo`'s options (the log ones too: its default level differs from the daemon's).
DEMO_OPTIONS: tuple[Option, ...] = check_options(
    (
        Option(
            "archive-dir",
            "Directory the demo archives into (a file:// store).",
            "demo-archive",
            as_path,
            metavar="DIR",
            scope="demo",
        ),
        Option(
            "state-dir",
            "Directory of the demo daemon's state DB and spool (a later demo resumes it).",
            ".archiver-demo-state",
            as_path,
            metavar="DIR",
            scope="demo",
        ),
        Option(
            "web.listen-address",
            "Address of the demo's /metrics server; the browser takes the next port.",
            "127.0.0.1:9877",
            as_listen,
            metavar="HOST:PORT",
            scope="demo",
            aliases=(Alias("listen", env=None, key=None), Alias("demo-listen-address", flag=None, key=None)),
        ),
        Option(
            "web.config.file",
            "Exporter-toolkit web config (TLS, basic auth) for the demo's /metrics server and browser.",
            None,
            as_optional_path,
            metavar="PATH",
            scope="demo",
        ),
        Option(
            "duration",
            "Stop by itself after this many seconds (else at Ctrl-C).",
            None,
            positive(as_float),
            metavar="SECONDS",
            scope="demo",
        ),
        # The daemon's log options, but only warnings by default: the status line is the demo's output.
        dataclasses.replace(OPTIONS_BY_KEY["log_format"], scope="demo", aliases=()),
        dataclasses.replace(
            OPTIONS_BY_KEY["log_level"],
            help="Log level: debug, info, warn or error (the demo's status line is its output).",
            default="warn",
            scope="demo",
            aliases=(),
        ),
    )
)

#: `archiver fake-service`'s own options, besides the log ones of OPTIONS.
FAKE_SERVICE_OPTIONS: tuple[Option, ...] = check_options(
    (
        Option(
            "web.listen-address",
            "Address the fake service serves on.",
            "127.0.0.1:8080",
            as_listen,
            metavar="HOST:PORT",
            scope="fake-service",
            aliases=(Alias("listen", env=None, key=None),),
        ),
        Option(
            "web.config.file",
            "Exporter-toolkit web config: its tls_server_config serves HTTPS (no basic_auth_users: "
            "the fake takes bearer tokens).",
            None,
            as_optional_path,
            metavar="PATH",
            scope="fake-service",
        ),
        Option(
            "api-token-file",
            "File of the tokens the fake accepts, one per line, one organisation each (else the "
            "ARCHIVER_API_TOKEN env var, else test-token; never a plain flag).",
            None,
            as_optional_path,
            metavar="PATH",
            scope="fake-service",
        ),
        Option(
            "traffic",
            "Start, fill and end sessions continuously.",
            "false",
            as_bool,
            scope="fake-service",
            switch=True,
        ),
        Option(
            "traffic-rate",
            "Sessions started per virtual minute.",
            6.0,
            positive(as_float),
            metavar="N",
            scope="fake-service",
        ),
        Option(
            "time-scale",
            "Virtual seconds per real second.",
            1.0,
            as_float,
            metavar="X",
            scope="fake-service",
        ),
        Option(
            "retention",
            "How long the fake keeps an ended session's logs and artifacts.",
            "4h",
            positive(parse_duration),
            metavar="DURATION",
            scope="fake-service",
        ),
        Option(
            "quirk",
            "Behave like a quirk of the real service (repeatable).",
            (),
            as_items,
            multiple=True,
            metavar="NAME[=VALUE]",
            scope="fake-service",
        ),
        Option(
            "fault",
            'Inject faults, e.g. "GET /session:status=502,count=3" (repeatable).',
            (),
            as_items,
            multiple=True,
            metavar="SPEC",
            scope="fake-service",
        ),
        Option(
            "capacity",
            "Active sessions a location can hold (repeatable or comma-separated).",
            (),
            as_list,
            multiple=True,
            metavar="LOCATION=N",
            scope="fake-service",
        ),
        Option(
            "start-rate",
            "Starts per organisation per virtual minute.",
            None,
            as_int,
            metavar="N",
            scope="fake-service",
        ),
    )
)

#: Command name → its own options: the config file's table of that name holds their keys.
COMMAND_OPTIONS: Mapping[str, tuple[Option, ...]] = {
    "browse": BROWSE_OPTIONS,
    "demo": DEMO_OPTIONS,
    "fake-service": FAKE_SERVICE_OPTIONS,
    "grep": GREP_OPTIONS,
}
#: The shared scopes each of them takes besides its own (archiver.config.options.Option.scope).
COMMAND_SCOPES: Mapping[str, frozenset[str]] = {
    "browse": BROWSE_SCOPES,
    "demo": frozenset(),
    "fake-service": LOG_SCOPES,
    "grep": STORE_SCOPES,
}
