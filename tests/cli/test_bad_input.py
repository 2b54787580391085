"""Bad input at every edge: any argument of any command is one `error:` line and exit 0/1/2, never a
traceback; any query string of any browser page is a page (400 for a bad value), never a 500.

The CLI is driven in-process (click's CliRunner, standalone mode as the entry point runs) with
generated arguments against a small real archive directory, a state DB and the fake service (for
`archive` and `check`); a few hostile arguments also run as real processes. The browser is asked
over real HTTP (a BrowseServer on loopback) with generated and hand-picked hostile query strings.
"""

from __future__ import annotations

import contextlib
import http.client
import logging
import os
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import pytest
from click.testing import CliRunner, Result
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from archiver.browse.app import BrowseApp
from archiver.browse.server import BrowseServer
from archiver.cli.base import main
from archiver.config import inputs
from archiver.config.command_options import COMMAND_OPTIONS
from archiver.config.options import OPTIONS
from archiver.errors import ApiRequestError
from archiver.fake import FakeService
from archiver.layout import keys
from archiver.store import open_store
from archiver.upstream.api import SessionHostClient
from archiver.upstream.transport import quote_segment
from tests.fixtures_fake import TEST_TOKEN
from tests.support import ARCHIVER, ARTIFACT_PATHS, HOSTILE_IDS, HOUR, NOW, put_session

#: Ids archived in the test store (so some generated invocations find what they ask for).
ARCHIVED = ["match-1", "match-2", *HOSTILE_IDS[:5]]
INSTANCE = keys.instance_name((NOW - 2 * HOUR) * 1000)
#: Upstream sessions of the fake service: ended ones (archived by `archive`) and a running one.
UPSTREAM_ENDED = ["ended-1", "ended-2"]
UPSTREAM_RUNNING = "running-1"


@dataclass(frozen=True)
class World:
    root: Path
    store_url: str
    state_dir: Path
    api_url: str
    config: Path

    def env(self) -> dict[str, str | None]:
        """Every ARCHIVER_* variable unset but the ones naming this world."""
        clean: dict[str, str | None] = {
            opt.env: None for table in (OPTIONS, *COMMAND_OPTIONS.values()) for opt in table
        }
        clean |= {"ARCHIVER_CONFIG": None, "ARCHIVER_CRASH_AT": None, "ARCHIVER_BROWSE_LISTEN": None}
        return clean | {
            "ARCHIVER_API_TOKEN": TEST_TOKEN,
            "ARCHIVER_API_URL": self.api_url,
            "ARCHIVER_STORE": self.store_url,
            "ARCHIVER_STATE_DIR": str(self.state_dir),
            "ARCHIVER_ARTIFACT_PATH": ARTIFACT_PATHS[0],
        }


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    root = tmp_path_factory.mktemp("bad-input")
    (root / "store").mkdir()
    (root / "cwd").mkdir()
    store = open_store((root / "store").as_uri())
    for n, sid in enumerate(ARCHIVED):
        put_session(store, sid, ended_at=NOW - HOUR - n, artifacts={ARTIFACT_PATHS[1]: b"replay"}, players=("p1", sid))
    put_session(store, "match-1", ended_at=NOW - 30, instance=INSTANCE, created=NOW - 2 * HOUR)
    store.close()
    with FakeService((TEST_TOKEN,)) as fake:
        for sid in UPSTREAM_ENDED:
            fake.add_session(TEST_TOKEN, id=sid, files={ARTIFACT_PATHS[0]: 200})
            fake.end_session(TEST_TOKEN, sid)
        fake.add_session(TEST_TOKEN, id=UPSTREAM_RUNNING)
        config = root / "archiver.toml"
        config.write_text(f'store = "{(root / "store").as_uri()}"\nlog_level = "warning"\n', encoding="utf-8")
        world = World(root, (root / "store").as_uri(), root / "state", fake.base_url, config)
        # A state DB for `status` to read (and `archive` to reuse).
        assert invoke(world, ["archive", UPSTREAM_ENDED[0]]).exit_code == 0
        yield world


# --- generated values --------------------------------------------------------------------------

#: Text of every kind: any code point (surrogates included), control characters, NUL.
ANY_TEXT = st.text(st.characters(exclude_categories=()), max_size=24)
#: What Python makes of command-line bytes that are not UTF-8 (surrogateescape).
UNDECODABLE = st.binary(min_size=1, max_size=8).map(lambda b: b.decode("utf-8", "surrogateescape"))
HOSTILE_PIECES = [
    "", " ", ".", "..", "/", "a/b", "../../etc", "%", "%2F", "%00", "%ff", "~", "\x00", "x\x00y", "\udcff",
    "\ud800", "\u202e", "\r\n", "-", "--help", "-h", "*", "?", "#", "&", "=", "\\", "sessions/x",
]  # fmt: skip
#: Around the id limit, and far past it (the 100,000 characters of the issue).
HUGE = st.one_of(
    st.integers(inputs.MAX_ID_BYTES - 2, inputs.MAX_ID_BYTES + 2).map(lambda n: "x" * n),
    st.integers(1360, 1370).map(lambda n: "é" * n + "\u20ac" * n),
    st.sampled_from([100_000, 70_000]).map(lambda n: "y" * n),
)


def mostly(good: st.SearchStrategy[str], *bad: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    """Three draws in four plausible (so a command gets past its first check to the next), one hostile."""
    return st.one_of(good, good, good, st.one_of(*bad))


IDS = mostly(
    st.sampled_from(ARCHIVED + UPSTREAM_ENDED + [UPSTREAM_RUNNING]),
    st.sampled_from(HOSTILE_PIECES + HOSTILE_IDS),
    ANY_TEXT,
    UNDECODABLE,
    HUGE,
)
TIMES = mostly(
    st.sampled_from(["1h", "2d", "90m", "now", "2026-11-22", "2026-11-22T10:00:00+01:00", "1970-01-01T00:00Z"]),
    st.sampled_from(["10000-01-01", "9999-12-31T23:59:59-01:00", "0001-01-01", "-5h", "nan", "inf", "1e309s"]),
    st.sampled_from(["9" * 400 + "h", "99999999999999999999999d", "2026-13-45", "2026-11-22T25:00", "", "h"]),
    st.integers(-(2**70), 2**70).map(str),
    ANY_TEXT,
)
DURATIONS = mostly(
    st.sampled_from(["1s", "0s", "2s", "0.5s", "500ms"]),
    st.sampled_from(["-1s", "nan", "inf", "1e400", "99999999999999999999h", "9" * 400 + "h", "", "1x", "1h-1s"]),
    ANY_TEXT,
)
COUNTS = mostly(
    st.sampled_from(["1", "2", "4", "16", "64", "auto"]),
    st.integers(-(2**70), 2**70).map(str),
    st.sampled_from(["0", "65", "256", "257", "-1", "1e3", "0x10", "²", "١٢", " 5 ", "", "9" * 5000]),
    ANY_TEXT,
)
SIZES = mostly(
    st.sampled_from(["0", "1B", "100MB", "1.5GiB", "5TB"]),
    st.sampled_from(["-5", "9" * 400 + "TB", "nan", "1e400MB", "5PB", "MB", ""]),
    st.integers(-(2**70), 2**70).map(str),
    ANY_TEXT,
)
FORMATS = mostly(st.sampled_from(["table", "json", "text"]), st.sampled_from(["yaml", "", "JSON", " json"]))
INSTANCES = mostly(
    st.sampled_from([INSTANCE, "legacy", "20261122T060305.123Z", "20261122T060305.123Z-r1", "99991231T235959.999Z"]),
    st.sampled_from(["19691231T235959.999Z", "20261301T000000.000Z", "20261122T060305.123Z-r0", "LEGACY", ""]),
    IDS,
)

#: Every command that takes input and returns (run, demo, fake-service and browse serve until
#: stopped; browse's input is its query strings, tested below over HTTP).
COMMANDS = ["archive", "show", "logs", "get", "verify", "hold", "release", "grep", "ls", "index-players", "status"]
COMMANDS += ["check", "prove", "verify-bundle", "keygen", "log", "compact", "sql"]


def _under(world: World) -> st.SearchStrategy[str]:
    """Local paths: names of any kind under the test's own directory (never `..`), or too long."""
    names = st.one_of(ANY_TEXT, UNDECODABLE, st.sampled_from(HOSTILE_PIECES)).map(
        lambda name: name.replace("/", "_").replace("..", "__") or "empty"
    )
    return mostly(
        st.sampled_from(["out", "dir/sub", "name with spaces"]).map(lambda name: str(world.root / "paths" / name)),
        names.map(lambda name: str(world.root / "paths" / name)),
        st.integers(250, 300).map(lambda n: str(world.root / ("n" * n))),
        st.just("/tmp/" + "z" * 5000),
        st.sampled_from(["", str(world.root / "store"), str(world.state_dir)]),
    )


def _options(draw: st.DrawFn, pairs: list[tuple[str, st.SearchStrategy[str]]], most: int = 3) -> list[str]:
    argv: list[str] = []
    for flag, values in draw(st.lists(st.sampled_from(pairs), max_size=most)):
        argv += [flag, draw(values)]
    return argv


def _flags(draw: st.DrawFn, flags: list[str]) -> list[str]:
    return [flag for flag in flags if draw(st.booleans())]


@st.composite
def invocations(draw: st.DrawFn, world: World) -> list[str]:
    """One command line of any command: its arguments and options, good and hostile."""
    paths = _under(world)
    stores = mostly(
        st.just(world.store_url),
        paths.map(lambda path: "file://" + quote(path.encode("utf-8", "surrogatepass"))),
        st.sampled_from(["file://relative", "s3://", "s3://UPPER/x", "s3://user@bucket", "ftp://x", "", "file:"]),
    )
    store_options = [
        ("--store", stores),
        ("--config", mostly(st.just(str(world.config)), paths)),
        ("--s3-checksum", mostly(st.sampled_from(["when_supported", "when_required"]), ANY_TEXT)),
    ]
    listens = mostly(st.just("127.0.0.1:0"), st.sampled_from([":99999", "[::1]:x", "host"]), ANY_TEXT)
    daemon_options = [
        *store_options,
        ("--state-dir", paths), ("--poll-interval", DURATIONS), ("--retention", DURATIONS),
        ("--deadline-margin", DURATIONS), ("--prune-after", DURATIONS), ("--max-artifact-size", SIZES),
        ("--fetch-workers", COUNTS), ("--upload-workers", COUNTS), ("--max-sessions", COUNTS),
        ("--total-shards", COUNTS), ("--shard", COUNTS), ("--s3-object-lock-days", COUNTS),
        ("--follow-logs-max", COUNTS),
        ("--artifact-path", mostly(st.sampled_from(ARTIFACT_PATHS), IDS, HUGE.map(lambda p: "/" + p))),
        ("--web.listen-address", listens), ("--listen", listens),  # the new name and its deprecated alias
        ("--api-url", mostly(st.just(world.api_url), st.sampled_from(["ftp://x", "", "http://", "not a url"]))),
        ("--api-token-file", paths), ("--log-level", mostly(st.just("debug"), ANY_TEXT)),
        ("--s3-object-tag", ANY_TEXT),
    ]  # fmt: skip
    command = draw(st.sampled_from(COMMANDS))
    argv = [command]
    if command == "archive":
        argv += draw(st.lists(IDS, min_size=1, max_size=3))
        argv += _options(draw, [("--timeout", DURATIONS), *daemon_options])
    elif command in ("show", "logs", "get", "hold", "release"):
        argv.append(draw(IDS))
        extra = [("--instance", INSTANCES), *store_options]
        if command == "show":
            extra.append(("--format", FORMATS))
        if command == "logs":
            streams = mostly(st.sampled_from(["stdout", "stderr"]), st.sampled_from(["both", "", "STDOUT"]))
            extra += [("--stream", streams), ("--grep", mostly(st.sampled_from(["boot", "over$"]), ANY_TEXT))]
            argv += _flags(draw, ["-i", "--capture"])
        if command == "get":
            extra.append(("--out", paths))
            argv += [*_flags(draw, ["--extract"]), "--no-progress"]
        argv += _options(draw, extra)
    elif command == "verify":
        argv += draw(st.lists(IDS, max_size=2))
        argv += _flags(draw, ["--deep"])
        argv += _options(
            draw,
            [("--since", TIMES), ("--until", TIMES), ("--processes", COUNTS), ("--instance", INSTANCES),
             ("--format", FORMATS), *store_options],
        )  # fmt: skip
    elif command in ("grep", "ls"):
        if command == "grep":
            patterns = mostly(st.sampled_from(["boot", "match over", "^b"]), ANY_TEXT, HUGE)
            argv.append(draw(st.one_of(patterns, st.sampled_from(["(", "[", "a{99999999}", "\\", "(?P<"]))))
            argv += [*_flags(draw, ["-F", "-i"]), "--no-progress"]
        filters = [
            ("--since", TIMES), ("--until", TIMES), ("--image", IDS), ("--location", IDS),
            ("--label", mostly(st.just("mode=duel"), ANY_TEXT)),
            ("--player", IDS), ("--format", FORMATS), *store_options,
        ]  # fmt: skip
        filters.append(("--workers", COUNTS) if command == "grep" else ("--limit", COUNTS))
        argv += _options(draw, filters, most=4)
    elif command == "prove":
        argv.append(draw(IDS))
        argv += ["-o", draw(paths)]
        keys = mostly(st.just("archiver.test/log+00000000+AQ=="), ANY_TEXT, paths)
        argv += _options(draw, [("--instance", INSTANCES), ("--key", keys), ("--tlog-key-file", paths), *store_options])
    elif command == "verify-bundle":
        argv += [draw(paths), "--key", draw(mostly(st.just("archiver.test/log+00000000+AQ=="), ANY_TEXT, paths))]
        argv += draw(st.lists(paths, max_size=2))
    elif command == "log":
        argv.append("backfill")
        writers = mostly(st.sampled_from(["backfill", "shard-0-replica-0"]), ANY_TEXT)
        argv += _options(draw, [("--writer", writers), ("--tlog-key-file", paths), *store_options])
    elif command == "keygen":
        argv += ["--name", draw(mostly(st.just("archiver.test/log"), ANY_TEXT)), "-o", draw(paths)]
    elif command == "compact":
        argv += ["--no-progress", *_options(draw, [("--since", TIMES), ("--until", TIMES), *store_options])]
    elif command == "sql":
        queries = mostly(st.sampled_from(["SELECT count(*) FROM sessions", "SELECT * FROM items"]), ANY_TEXT, HUGE)
        argv.append(draw(queries))
        sql_formats = mostly(st.sampled_from(["table", "csv", "json"]), ANY_TEXT)
        argv += _options(
            draw,
            [("--since", TIMES), ("--until", TIMES), ("--format", sql_formats), ("--ddl", ANY_TEXT), *store_options],
        )
    elif command == "index-players":
        argv += _options(draw, [("--checkpoint", paths), *store_options])
    elif command == "status":
        argv += _options(draw, [("--state-dir", paths), ("--format", FORMATS), ("--config", paths)])
    else:
        argv += _options(draw, [("--format", FORMATS), *daemon_options], most=4)
    return argv


# --- what every outcome must look like -----------------------------------------------------------

#: Commands whose exit 1 is a verdict (problems found, nothing matched, not ready), told on stdout.
VERDICTS = {"verify", "grep", "check", "index-players", "log"}
#: A log line (logfmt): time, level, logger (httpcore's too at --log-level debug).
LOG_LINE = re.compile(r"^ts=\S+ level=\w+ logger=[\w.]+ msg=")


def assert_one_line_outcome(argv: list[str], result: Result) -> None:
    """Exit 0, 1 or 2 by SystemExit (never an exception); no traceback; a failure is one `error:` line."""
    shown = [arg if len(arg) < 80 else f"{arg[:40]!r}…({len(arg)})" for arg in argv]
    assert result.exception is None or isinstance(result.exception, SystemExit), (shown, result.exc_info)
    assert result.exit_code in (0, 1, 2), (shown, result.exit_code, result.stderr[-2000:])
    assert "Traceback" not in result.stderr and "Traceback" not in result.stdout, (shown, result.stderr[-3000:])
    # Log lines: `archive`'s pipeline, and any command's deprecation notice of a renamed flag.
    lines = [line for line in result.stderr.splitlines() if not LOG_LINE.match(line)]
    errors = [line for line in lines if line.startswith("error: ")]
    others = [line for line in lines if not line.startswith(("error: ", "warning: ", "note: ", "resuming after "))]
    assert others == [], (shown, result.exit_code, result.stderr[-2000:])
    assert len(errors) <= 1, (shown, result.stderr[-2000:])
    if argv[0] == "grep" and result.exit_code == 2 and not errors:
        # grep's 2 without an error: archives it could not read, each named in a warning as it went.
        assert any(line.startswith("warning: ") for line in lines), (shown, result.stderr[-2000:])
        return
    if result.exit_code == 2 or (result.exit_code == 1 and argv[0] not in VERDICTS):
        assert len(errors) == 1, (shown, result.exit_code, result.stdout[-500:], result.stderr[-2000:])


def invoke(world: World, argv: list[str]) -> Result:
    """`archiver ARGV` in-process, as the entry point runs it, in the test's own working directory;
    the root logger is left as it was (`archive` points it at the runner's stderr, gone afterwards)."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        # In the test's own directory: `get` downloads to `.` unless told otherwise.
        with contextlib.chdir(world.root / "cwd"):
            return CliRunner().invoke(main, argv, env=world.env(), catch_exceptions=True)
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


class Tally:
    """How many generated invocations ran (a short repr: hypothesis prints it with a failing example)."""

    def __init__(self) -> None:
        self.count = 0

    def __repr__(self) -> str:
        return f"Tally({self.count})"


@pytest.fixture(scope="module")
def generated() -> Iterator[Tally]:
    tally = Tally()
    yield tally
    # The bar: 500 generated invocations (hypothesis stops short only when it runs out of
    # distinct inputs, which these strategies never do). Nothing counted: the test was deselected.
    assert tally.count == 0 or tally.count >= 500, tally


@settings(max_examples=500, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(data=st.data())
def test_any_generated_command_line_ends_in_one_line_and_exit_0_1_or_2_never_a_traceback(
    world: World, generated: Tally, data: st.DataObject
) -> None:
    argv = data.draw(invocations(world), label="argv")
    result = invoke(world, argv)
    assert_one_line_outcome(argv, result)
    event(f"{argv[0]} exit {result.exit_code}")  # --hypothesis-show-statistics: how far the inputs got
    generated.count += 1


# --- the edges one by one (what used to be a traceback) ------------------------------------------

KNOWN = [
    # (argv, exit code, what the one line says)
    (["archive", "x" * 100_000], 2, "session id too long: 100000 bytes, at most 4096"),
    (["archive", "\udcff"], 2, "is not valid UTF-8"),
    (["archive", ""], 2, "session id must not be empty"),
    (["show", "x" * 5000], 2, "session id too long"),
    (["logs", "é" * 2049], 2, "session id too long: 4098 bytes"),
    (["get", "match-1", "--out", "/tmp/" + "z" * 5000], 2, "path too long: 5005 bytes, at most 4095"),
    (["verify", "--processes", "99999999999999999999"], 2, "up to 256"),
    (["hold", "y" * 70_000], 2, "session id too long"),
    (["release", "match-1", "--instance", "z" * 5000], 2, "not an instance name"),
    (["grep", "boot", "--workers", "0"], 2, "0 is not in the range 1<=x<=64"),
    (["grep", "boot", "--player", "p" * 5000], 2, "player id too long"),
    (["ls", "--since", "10000-01-01"], 2, "not a time: '10000-01-01'"),
    (["ls", "--until", "9999-12-31T23:59:59-01:00"], 2, "time out of range"),
    (["ls", "--limit", "9" * 30], 2, "is not in the range"),
    (["index-players", "--checkpoint", "/tmp/" + "c" * 300], 2, "has a name of 300 bytes, at most 255"),
    (["status", "--state-dir", "/tmp/" + "s" * 5000], 2, "--state-dir: path too long: 5005 bytes"),
    (["archive", "match-1", "--state-dir", "/tmp/state-\udc80"], 2, "is not valid UTF-8 (an undecodable byte)"),
    (["ls", "--store", "file:///tmp/" + "d" * 5000], 2, "store directory too long"),
    (["check", "--artifact-path", "/" + "a" * 5000], 2, "artifact path too long: 5001 bytes, at most 4095"),
]


@pytest.mark.parametrize(("argv", "code", "says"), KNOWN, ids=[f"{k[0][0]}-{n}" for n, k in enumerate(KNOWN)])
def test_a_value_out_of_bounds_is_named_in_one_line_with_exit_2(
    world: World, argv: list[str], code: int, says: str
) -> None:
    result = invoke(world, argv)
    assert_one_line_outcome(argv, result)
    assert result.exit_code == code
    [line] = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert says in line
    assert len(line) < 600  # the value is shown cut short, not 100,000 characters


def test_ids_up_to_the_limit_still_reach_the_store_and_the_upstream(world: World) -> None:
    """The limit refuses nothing the archiver could have archived: 4096 bytes pass, 4097 do not."""
    at_limit, over = "é" * 2048, "é" * 2048 + "x"
    shown = invoke(world, ["show", at_limit])
    assert shown.exit_code == 1 and "is not archived" in shown.stderr  # looked up, not refused
    assert invoke(world, ["show", over]).exit_code == 2
    archived = invoke(world, ["archive", at_limit, "--timeout", "5s"])
    assert archived.exit_code == 0, archived.stderr  # asked upstream: unknown there, skipped
    assert "unknown or past its retention window" in archived.stderr


def test_the_upstream_client_refuses_an_unsendable_id_with_a_typed_error(world: World) -> None:
    from archiver.config.credentials import Token

    with SessionHostClient.connect(world.api_url, Token(TEST_TOKEN)) as client:
        for bad in ("x" * 100_000, "\udcff", ""):
            with pytest.raises(ApiRequestError):
                client.describe_session(bad)
            with pytest.raises(ApiRequestError):
                client.open_query_log(bad)
        with pytest.raises(ApiRequestError, match="artifact path too long"):
            client.open_artifact(UPSTREAM_ENDED[0], "/" + "p" * 5000)
        assert client.describe_session(UPSTREAM_RUNNING).id == UPSTREAM_RUNNING
    assert quote_segment("..") == "%2E%2E" and quote_segment("a/b") == "a%2Fb"


# --- as real processes: nothing reaches stderr but the one line ----------------------------------

AS_PROCESS: list[tuple[list[str | bytes], int, str]] = [
    (["archive", "x" * 100_000], 2, "session id too long"),
    (["archive", b"\xff\xfe-not-utf8"], 2, "is not valid UTF-8"),
    (["show", b"\xff"], 1, "is not archived"),
    (["ls", "--since", "10000-01-01"], 2, "not a time"),
    (["verify", "--processes", "-1"], 2, "--processes"),
    (["get", "match-1", "--out", "/tmp/" + "z" * 5000], 2, "path too long"),
    (["status", "--state-dir", "/tmp/" + "s" * 300], 2, "has a name of 300 bytes"),
    (["archive", "match-1", "--state-dir", b"/tmp/state-\x80"], 2, "--state-dir"),
    (["browse", "--listen", "nowhere"], 2, "--listen"),
]


@pytest.mark.parametrize(("argv", "code", "says"), AS_PROCESS, ids=[str(a[0][0]) for a in AS_PROCESS])
def test_a_hostile_argument_is_one_stderr_line_from_the_real_entry_point(
    world: World, argv: list[str | bytes], code: int, says: str
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ARCHIVER_")}
    env |= {k: v for k, v in world.env().items() if v is not None}
    result = subprocess.run([ARCHIVER, *argv], capture_output=True, env=env, timeout=120, cwd=world.root / "cwd")
    stderr = result.stderr.decode("utf-8", "replace")
    assert result.returncode == code, stderr
    lines = [line for line in stderr.splitlines() if not LOG_LINE.match(line)]
    assert len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0], stderr
    assert "Traceback" not in stderr and TEST_TOKEN not in stderr


# --- the browser: every parameter of every page, over real HTTP ----------------------------------

#: Every page and the query parameters it reads ({id}: a session id path segment).
LIST_FILTERS = ["since", "until", "image", "location", "label", "player", "session"]
CURSORS = ["before", "before_id", "before_instance", "after", "after_id", "after_instance"]
ROUTES: list[tuple[str, list[str]]] = [
    ("/sessions", [*LIST_FILTERS, *CURSORS]),
    ("/search", ["q", "fixed", "icase", "limit", "start", *LIST_FILTERS]),
    ("/sessions/{id}", ["instance"]),
    ("/sessions/{id}/logs", ["instance", "stream", "q", "start"]),
    ("/sessions/{id}/items/0", ["instance"]),
    ("/sessions/{id}/proof", ["instance"]),
    ("/session", ["id", "instance"]),
    ("/session/logs", ["id", "instance", "stream", "q", "start"]),
    ("/session/items/1", ["id", "instance"]),
    ("/session/proof", ["id", "instance"]),
]
#: Query values as they go on the wire: percent-encoded text of every kind, and malformed escapes.
RAW_VALUES = [
    "", "%", "%zz", "%ff", "%ed%a0%80", "%00", "%0d%0a", "%c0%ae%c0%ae", "%e2%80%ae", "..", "%2e%2e", "+", "%2b",
    "&", "=", ";", "1e308", "-1e308", "nan", "inf", "-0", "1" + "0" * 400, "9" * 5000, "%c2%b2", "%d9%a1",
    "10000-01-01", "-5h", "9" * 400 + "h", "x" * 5000, "%c3%a9" * 2049, "legacy", INSTANCE, "match-1",
]  # fmt: skip
#: Path segments standing for the session id.
RAW_IDS = ["match-1", "%ff", "%ed%a0%80", "%00", "x" * 5000, "%2e", "%2e%2e", "%2F", "~", "%c3%a9" * 2049]
#: What a page may answer: never a 500 (414: the HTTP server's own limit on a request line, 64 KiB).
PAGE_STATUSES = {200, 302, 400, 404, 414}


@pytest.fixture(scope="module")
def browse(world: World) -> Iterator[tuple[str, int]]:
    """The browser over the world's store, its closed hours compacted (as a daemon's store is): the
    list and search pages read the columnar index for them and the JSON entries for the open hour,
    whichever of this module's tests ran before (the generated commands may compact too)."""
    assert invoke(world, ["compact"]).exit_code == 0
    store = open_store(world.store_url)
    server = BrowseServer(("127.0.0.1", 0), BrowseApp(store, clock=lambda: NOW))
    server.start()
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    yield host, int(port)
    server.stop()
    store.close()


def _get(address: tuple[str, int], target: str) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection(*address, timeout=60)
    try:
        connection.request("GET", target)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def _assert_page(address: tuple[str, int], target: str, caplog: pytest.LogCaptureFixture) -> int:
    status, body = _get(address, target)
    assert status in PAGE_STATUSES, (target[:200], status, body[:300])
    assert b"Traceback" not in body and b"Internal Server Error" not in body
    if status == 400:
        assert b"Bad request" in body or b'class="error"' in body or b"error" in body, body[:500]
    failed = [r for r in caplog.records if r.name == "archiver.browse" and r.levelno >= logging.ERROR]
    assert failed == [], target[:200]
    return status


#: The pages that list or search sessions: a valid value renders a whole page read from the index
#: (about 0.1 s), so their sweep of every parameter and value is one of `make test-slow`'s.
LIST_PAGES = {"/sessions", "/search"}


def _targets(list_pages: bool) -> list[str]:
    """Every parameter of each page with every raw value: the list and search pages, or the others."""
    targets = []
    for path, names in ROUTES:
        if (path in LIST_PAGES) != list_pages:
            continue
        for raw_id in RAW_IDS if "{id}" in path else ["match-1"]:
            base = path.replace("{id}", raw_id)
            # The query form of a session page needs its id, a search its pattern: each given
            # unless it is the parameter under test.
            needs = "id" if path.startswith("/session/") or path == "/session" else "q" if path == "/search" else ""
            for name in names:
                for value in RAW_VALUES:
                    extra = f"&{needs}={'match-1' if needs == 'id' else 'boot'}" if needs and name != needs else ""
                    targets.append(f"{base}?{name}={value}{extra}")
    return targets


@pytest.mark.parametrize(
    "list_pages",
    [pytest.param(False, id="session-pages"), pytest.param(True, id="list-and-search", marks=pytest.mark.slow)],
)
def test_every_parameter_of_every_page_with_a_hostile_value_is_a_page_never_a_500(
    browse: tuple[str, int], caplog: pytest.LogCaptureFixture, list_pages: bool
) -> None:
    """The session pages' sweep runs in `make test`, the list and search pages' in `make test-slow`
    (the generated query strings below reach those pages in `make test` too)."""
    caplog.set_level(logging.ERROR, logger="archiver.browse")
    statuses = [_assert_page(browse, target, caplog) for target in _targets(list_pages)]
    assert statuses.count(400) > 100 and statuses.count(200) > 100  # both the refusals and the pages


def test_a_request_line_past_the_servers_limit_is_answered_414(browse: tuple[str, int]) -> None:
    status, _body = _get(browse, "/sessions?image=" + "x" * 70_000)
    assert status == 414


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(
    route=st.sampled_from(ROUTES),
    raw_id=st.one_of(st.sampled_from(RAW_IDS), IDS.map(lambda sid: quote(sid.encode("utf-8", "surrogatepass")))),
    pairs=st.lists(
        st.tuples(
            st.one_of(st.sampled_from(sorted({n for _p, names in ROUTES for n in names})), ANY_TEXT),
            st.one_of(
                st.sampled_from(RAW_VALUES),
                st.one_of(ANY_TEXT, IDS, TIMES, COUNTS).map(lambda v: quote(v.encode("utf-8", "surrogatepass"))),
            ),
        ),
        max_size=4,
    ),
)
def test_any_generated_query_string_is_a_page_never_a_500(
    browse: tuple[str, int],
    caplog: pytest.LogCaptureFixture,
    route: tuple[str, list[str]],
    raw_id: str,
    pairs: list[tuple[str, str]],
) -> None:
    path = route[0].replace("{id}", raw_id or "x")
    query = "&".join(f"{quote(name.encode('utf-8', 'surrogatepass'))}={value}" for name, value in pairs)
    caplog.clear()
    _assert_page(browse, f"{path}?{query}" if query else path, caplog)
