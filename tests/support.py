"""Plain helpers shared by more than one test module (fixtures live in tests/fixtures_*.py).

Test modules import shared helpers from here, never from one another (tests/project/test_test_layout.py
checks). One section per kind of helper: waiting, digests, ports, upstream list entries, the state DB,
archives in a store (and the evidence browser over one), settings, the Helm chart.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import socket
import sqlite3
import sys
import time
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import boto3
import click
import httpx
import jsonschema
import kubernetes_validate
import yaml
from click.testing import CliRunner, Result
from hypothesis import strategies as st

from archiver.archive.spool import Spool
from archiver.archive.state import DB_NAME, ItemRow, NewItem, StateDB, session_key_of
from archiver.browse.app import BrowseApp
from archiver.browse.server import BrowseServer
from archiver.cli.base import main, resolve, settings_options
from archiver.config.options import OPTIONS
from archiver.config.settings import Settings
from archiver.errors import ConfigError
from archiver.layout import keys
from archiver.layout import manifest as codec
from archiver.layout.manifest import Manifest, ManifestItem, build_manifest
from archiver.live.policy import Finish
from archiver.live.policy import Tuning as LiveTuning
from archiver.live.segment import Segment
from archiver.live.store import CaptureStore
from archiver.retry import FOLLOW_LOGS
from archiver.store import ObjectStore
from archiver.upstream.models import Session
from archiver.web.webconfig import WebConfig

if TYPE_CHECKING:
    import helm_python as helm

T = TypeVar("T")

REPO = Path(__file__).resolve().parent.parent
#: The `archiver` console script of the running interpreter's environment.
ARCHIVER = str(Path(sys.executable).with_name("archiver"))


# --- waiting ------------------------------------------------------------------------------------


def wait_until(
    predicate: Callable[[], T],
    timeout: float = 20.0,
    interval: float = 0.05,
    message: str | Callable[[], str] = "condition",
    pause: Callable[[float], object] = time.sleep,
) -> T:
    """Look at ``predicate`` every ``interval`` seconds until it returns something truthy, and return
    that; past ``timeout`` seconds fail with AssertionError(``message``, or what it returns then).

    ``pause`` is what waits between looks: a plain sleep, or something of the system under test that
    wakes early when it makes progress (the poll interval of a deadline loop, never a fixed wait).
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            text = message() if callable(message) else message
            raise AssertionError(f"{text} (not met within {timeout:g} s)")
        pause(interval)


# --- live capture -------------------------------------------------------------------------------

#: Live capture's timing for tests: reopens within a fraction of a second, drains within seconds,
#: checkpoints five times a second (the production defaults wait seconds to minutes).
LIVE_FAST = LiveTuning(
    policy=dataclasses.replace(FOLLOW_LOGS, initial_wait=0.05, max_wait=0.3),
    ended_wait=0.05,
    stall_timeout=30.0,
    drain_timeout=5.0,
    drain_max_wait=0.2,
    connect_timeout=5.0,
    checkpoint_interval=0.2,
    progress_interval=0.2,
)


#: A child that appends numbered lines to a capture (in ``argv[1]``'s state dir, with ``argv[2]``
#: as its scratch if given), checkpoints every 37, and says "ready" after 2,000: kill it with -9.
CAPTURE_WRITER = """
import sys
from pathlib import Path
from archiver.live.store import CaptureStore

store = CaptureStore(Path(sys.argv[1]), scratch_dir=Path(sys.argv[2]) if len(sys.argv) > 2 else None)
segment = store.begin("1:s", "s", 1, 0)
for i in range(1_000_000):
    store.append(segment, [b"line %d " % i + b"x" * (i % 50)])
    if i % 37 == 0:
        store.checkpoint(store.pending())
    if i == 2000:
        print("ready", flush=True)
"""


def capture_lines(n: int, start: int = 0) -> list[bytes]:
    """``n`` numbered NDJSON log lines (without newlines), as a follow stream brings them."""
    return [f'{{"streamType":1,"line":"line {i}"}}'.encode() for i in range(start, start + n)]


def checkpoint(store: CaptureStore) -> None:
    """Record everything the store's segments changed, as the checkpoint job does."""
    store.checkpoint(store.pending())


def sealed_capture(store: CaptureStore, key: str, lines: int, state: Finish = Finish.COMPLETE) -> Segment:
    """A segment of ``key`` holding ``lines`` lines, finished as ``state`` and checkpointed (so sealed)."""
    segment = store.begin(key, "s", 1, 0)
    store.append(segment, capture_lines(lines))
    store.finish(segment, state)
    checkpoint(store)
    return segment


def running_capture(store: CaptureStore, key: str, lines: int, *, created_ms: int = 1) -> Segment:
    """A segment of ``key`` holding ``lines`` lines, checkpointed and still followed."""
    segment = store.begin(key, key.partition(":")[2] or key, created_ms, 0)
    store.append(segment, capture_lines(lines))
    checkpoint(store)
    return segment


# --- digests ------------------------------------------------------------------------------------


def sha256_of(chunks: Iterable[bytes] | bytes) -> str:
    """Hex SHA-256 of ``chunks`` (a body streamed in pieces) or of one ``bytes``."""
    digest = hashlib.sha256()
    for chunk in [chunks] if isinstance(chunks, bytes) else chunks:
        digest.update(chunk)
    return digest.hexdigest()


# --- ports --------------------------------------------------------------------------------------


def free_port() -> int:
    """A loopback port nothing listens on (bound once by the OS, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def open_connections_to(port: int) -> int:
    """How many established TCP connections this process holds open to loopback ``port`` (its own
    sockets only, from /proc: a client that closed its pool holds none)."""
    fds = Path("/proc/self/fd")
    inodes = set()
    for fd in fds.iterdir():
        try:
            target = fd.readlink().name
        except OSError:
            continue  # closed while listing
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    count = 0
    for line in Path("/proc/self/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        remote_port, state, inode = int(fields[2].split(":")[1], 16), fields[3], fields[9]
        count += remote_port == port and state == "01" and inode in inodes
    return count


# --- upstream session-list entries --------------------------------------------------------------


def list_entry(sid: str, labels: Any, overrides: Mapping[str, Any]) -> dict[str, Any]:
    """One entry of the session list as the real service sends it, with ``labels`` and then
    ``overrides`` (which may replace any field, labels too, or add new ones)."""
    entry: dict[str, Any] = {
        "id": sid,
        "image": "demo-game",
        "tag": "1.1.0",
        "location": "eu-west-1",
        "host": "203.0.113.42",
        "created": 1648472895000,
        "port": {"7777/udp": 25160},
        "status": "running",
        "playerCount": 2,
        "labels": labels,
    }
    entry.update(overrides)
    return entry


def raw_session(sid: str, **overrides: Any) -> dict[str, Any]:
    """A list entry shaped like the real service sends it (labels as JSON strings)."""
    labels = {
        "env": json.dumps({"GAMEYE_SESSION_ID": sid, "SECRET": "hunter2"}),
        "tags": json.dumps({"mode": "duel"}),
    }
    return list_entry(sid, labels, overrides)


#: The secret planted in `entry`'s container env: it must never come out of a parse.
SECRET = "hunter2-do-not-leak"
ENV = {"GAMEYE_SESSION_ID": "s1", "GAMEYE_HOST": "203.0.113.42", "MATCH_SECRET": SECRET}
TAGS = {"mode": "duel", "tournament": "spring"}


def entry(sid: str = "s1", **overrides: Any) -> dict[str, Any]:
    """A list entry carrying `ENV` (with `SECRET`), `TAGS` and a `gameye` label."""
    labels = {"env": json.dumps(ENV), "tags": json.dumps(TAGS), "gameye": '{"version": "1.2.1"}'}
    return list_entry(sid, labels, overrides)


def body(*entries: dict[str, Any] | Any) -> bytes:
    """A session-list response body holding ``entries``."""
    return json.dumps({"sessions": list(entries)}).encode()


#: Shapes the real service sends for the same entry: each parses to the model of `entry()`'s shape.
QUIRKS: dict[str, dict[str, Any]] = {
    "port as JSON string": {"port": json.dumps({"7777/udp": 25160})},
    "port wrapped": {"port": {"port": {"7777/udp": 25160}}},
    "port wrapped JSON string": {"port": json.dumps({"port": {"7777/udp": "25160"}})},
    "port float and string values": {"port": {"7777/udp": 25160.0, "27015/tcp": "25161"}},
    "labels as JSON string": {"labels": json.dumps({"env": json.dumps(ENV), "tags": json.dumps(TAGS)})},
    "labels wrapped": {"labels": {"labels": {"env": json.dumps(ENV), "tags": json.dumps(TAGS)}}},
    "labels wrapped JSON string": {"labels": {"labels": json.dumps({"env": ENV, "tags": TAGS})}},
    "labels as objects": {"labels": {"env": ENV, "tags": TAGS}},
    "labels empty": {"labels": {}},
    "labels undecodable tags": {"labels": {"tags": "{not json", "com.example.build": "42"}},
    "null player count": {"playerCount": None},
    "unknown fields": {"enableMetrics": True, "somethingNew": {"a": [1, 2]}},
    "float created": {"created": 1648472895123.5},
    "unknown status": {"status": "hibernating"},
    "empty status": {"status": ""},
    "numeric status": {"status": 5},
    "numeric tag": {"tag": 7},
}

#: Any JSON value, surrogates and huge numbers included (what a hostile upstream can send).
JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)
STATUS = st.sampled_from(["running", "exited", "dead", "draining", "", "weird", None])


@st.composite
def entries(draw: st.DrawFn) -> Any:
    """A list entry: mostly of the right shape, any field possibly of the wrong type or range."""
    if draw(st.integers(0, 9)) == 0:
        return draw(JSON)
    entry: dict[str, Any] = {
        "id": draw(st.text(min_size=0, max_size=10) | JSON),
        "image": draw(st.sampled_from(["demo-game", "g\ud800", ""]) | JSON),
        "location": draw(st.sampled_from(["eu-west-1", "l"]) | JSON),
        "created": draw(
            st.floats(min_value=-1e16, max_value=1e16, allow_nan=False)
            | st.integers(min_value=0, max_value=10**18)
            | st.sampled_from([1.7e12, "1.7e12", None])
        ),
        "status": draw(STATUS | JSON),
        "playerCount": draw(st.integers(-(10**20), 10**20) | st.sampled_from([None, "3", "1e25", 1e30, 2.5])),
        "labels": draw(
            st.sampled_from([{}, {"tags": '{"mode": "duel"}', "env": '{"SECRET": "hunter2"}'}, '{"tags": "{"}']) | JSON
        ),
        "port": draw(st.sampled_from([{"7777/udp": 20001}, '{"80/tcp": "x"}']) | JSON),
    }
    for key in draw(st.lists(st.sampled_from(list(entry)), max_size=3)):
        entry.pop(key, None)
    return entry


# --- the state DB -------------------------------------------------------------------------------


def listed_session(i: int, *, players: int = 2, label: str = "duel") -> Session:
    """Session ``sess-{i:05d}``, running, as a list poll reports it."""
    return Session(
        id=f"sess-{i:05d}",
        image="demo-game",
        tag="1.1.0",
        location="eu-west-1",
        host="203.0.113.7",
        created_ms=1_700_000_000_000 + i,
        status="running",
        player_count=players,
        ports={"7777/udp": 20000 + i % 1000},
        labels={"mode": label},
        env_keys=("GAMEYE_SESSION_ID",),
    )


def listed_key(sid: str) -> str:
    """The state DB's key of `listed_session` ``sid``."""
    return session_key_of(listed_session(int(sid[-5:])))


def ended(state: StateDB, sid: str, deadline: float, paths: tuple[str, ...] = ()) -> None:
    """Session ``sid`` listed, then gone from the list and ended, with its logs and ``paths`` to fetch."""
    state.record_poll([listed_session(int(sid[-5:]))], [], 0.0, touch_active=False)
    state.record_poll([], [(listed_key(sid), 0.0)], 1.0, touch_active=False)
    items = [
        NewItem("logs", "", "GET /query/log"),
        *(NewItem("artifact", p, "GET /artifacts") for p in paths),
    ]
    row = state.end_session(
        listed_key(sid), described=None, deadline_for=lambda _r: deadline, items_for=lambda _r: items, now=2.0
    )
    assert row is not None and row.state == "ended"


def uploading(state: StateDB, spool: Spool, sid: str, paths: tuple[str, ...] = ()) -> list[ItemRow]:
    """The items of an ended session `sid`, fetched into the spool and claimed by an upload worker."""
    ended(state, sid, 900.0, paths)
    for _ in range(1 + len(paths)):
        item = state.claim_fetch(0.0)
        assert item is not None
        path = spool.final_path(item.id)
        path.write_bytes(b"spooled %d" % item.id)
        state.mark_spooled(
            item.id, spool_path=str(path), size=path.stat().st_size, sha256="0" * 64,
            content_type="application/octet-stream", source="GET /x", key=f"k/{item.id}", fetched_at=3.0,
        )  # fmt: skip
    claimed = [state.claim_upload(0.0) for _ in range(1 + len(paths))]
    assert all(claimed)
    return [item for item in claimed if item is not None]


def committed_statuses(state_dir: Path) -> dict[int, str]:
    """Item statuses as a new connection sees them: committed rows only."""
    conn = sqlite3.connect(f"file:{state_dir / DB_NAME}?mode=ro", uri=True)
    try:
        return dict(conn.execute("SELECT id, status FROM items").fetchall())
    finally:
        conn.close()


# --- archives in a store (retrieval, search, the evidence browser) ------------------------------

NOW = datetime(2026, 11, 22, 12, 30, tzinfo=UTC).timestamp()
HOUR = 3600.0

HOSTILE_IDS = [
    "../../etc/passwd",
    "a/b",
    ".",
    "..",
    "試合-😀-ид",
    "x" * 300,
    "\x1b[31mred\x1b[0m\r\n\x07bell",
    "\u202eevil-bidi",
    "\ud800lone-surrogate",
    "back\\slash",
]

ARTIFACT_PATHS = ("/var/log/game/server.log", "/srv/replays/match.replay", "/srv/crash/core.txt")


def gzipped(body: bytes) -> bytes:
    """``body`` as the spool stores it: one zlib gzip stream."""
    compressor = zlib.compressobj(6, zlib.DEFLATED, 31)
    return compressor.compress(body) + compressor.flush()


def put_session(
    store: ObjectStore,
    sid: str,
    *,
    ended_at: float,
    logs: bytes | None = b"boot\nmatch over\n",
    log_ext: str = "txt",
    artifacts: Mapping[str, bytes] | None = None,
    extra_items: Sequence[ManifestItem] = (),
    image: str = "demo-game",
    tag: str = "1.1.0",
    location: str = "eu-west-1",
    labels: Mapping[str, str] | None = None,
    players: Sequence[str] = ("p1", "p2"),
    instance: str | None = None,
    created: float | None = None,
    last_status: str = "exited",
) -> Manifest:
    """Store one session the way archiver/upload.py does: objects, manifest (create-once), index entry.

    ``instance`` writes the instance layout (``sessions/{sid}/{instance}/``); ``created``
    defaults to 30 minutes before ``ended_at``; ``last_status`` ``dead`` is a crash.
    """
    items: list[ManifestItem] = []
    if logs is not None:
        key = keys.logs_key(store.prefix, sid, log_ext, instance)
        items.append(_stored(store, key, gzipped(logs), kind="logs", source=f"GET /query/log?matchKey={sid}"))
    for path, data in (artifacts or {}).items():
        key = keys.artifact_key(store.prefix, sid, path, instance)
        source = f"GET /artifacts?session={sid}&path={path}"
        items.append(_stored(store, key, data, kind="artifact", source=source, path=path))
    items.extend(extra_items)
    manifest = build_manifest(
        session_id=sid,
        image=image,
        tag=tag,
        location=location,
        host="203.0.113.42",
        created=ended_at - 1800 if created is None else created,
        labels=dict(labels or {}),
        players=players,
        player_count=len(players),
        last_status=last_status,
        last_seen_active=ended_at - 10,
        first_seen_ended=ended_at,
        fetch_deadline=ended_at + 4 * HOUR - 600,
        archived_at=ended_at + 30,
        items=items,
        instance=instance,
    )
    mkey = keys.manifest_key(store.prefix, sid, instance)
    store.put_bytes(mkey, codec.manifest_to_bytes(manifest), content_type="application/json")
    store.put_bytes(
        keys.index_key(store.prefix, manifest.ended_at, sid, instance),
        codec.index_entry_to_bytes(codec.index_entry_for(manifest, mkey)),
        content_type="application/json",
    )
    return manifest


#: A line a catastrophic pattern (``^(\\S+\\s*)*QQQ$``) makes Python's backtracking ``re`` run for ever on.
LONG_LINE = b"word " * 2000 + b"\n"


def put_long_logs(store: ObjectStore, sid: str, *, ended_at: float, megabytes: int) -> Manifest:
    """An archive whose logs are ``megabytes`` MB of `LONG_LINE`s: one gzip member of a megabyte
    stored that many times (a valid multi-member stream, cheap to write, as costly to search as any)."""
    block = LONG_LINE * (1_000_000 // len(LONG_LINE))
    key = keys.logs_key(store.prefix, sid, "txt")
    item = _stored(store, key, gzipped(block) * megabytes, kind="logs", source=f"GET /query/log?matchKey={sid}")
    return put_session(store, sid, ended_at=ended_at, logs=None, extra_items=[item])


def put_capture(
    store: ObjectStore,
    sid: str,
    logs: bytes,
    *,
    segment: int | None = 0,
    log_ext: str = "jsonl",
    capture: str = "diverged",
    instance: str | None = None,
) -> ManifestItem:
    """Store a live capture of a session as the archiver keeps one: ``logs.live-{segment}`` beside the
    logs (``segment`` None: as the logs themselves, nothing read after the end); the manifest item to
    pass to `put_session` (``extra_items``; ``logs=None`` for the latter case)."""
    key = (
        keys.logs_key(store.prefix, sid, log_ext, instance)
        if segment is None
        else keys.live_logs_key(store.prefix, sid, log_ext, segment, instance)
    )
    source = f"GET /logs?id={sid}&follow=true"
    return _stored(store, key, gzipped(logs), kind="logs", source=source, capture=capture)


def _stored(store: ObjectStore, key: str, data: bytes, **fields: Any) -> ManifestItem:
    """``data`` stored at ``key``; its archived manifest item (``kind``, ``source`` and the rest in ``fields``)."""
    store.put_bytes(key, data, content_type="application/gzip")
    return ManifestItem(
        outcome="archived",
        key=key,
        size=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
        content_type="application/gzip",
        **fields,
    )


def store_endpoint(store: ObjectStore) -> str:
    """The endpoint URL of the S3 server an S3 store talks to."""
    client = store.client  # type: ignore[attr-defined]
    return str(client.meta.endpoint_url)


def overwrite(store: ObjectStore, key: str, data: bytes) -> None:
    """Tamper with a stored object behind the archiver's back (plain boto3 / plain file write)."""
    if store.url.startswith("file://"):
        path = Path(store.url.removeprefix("file://")) / key
        path.unlink()
        path.write_bytes(data)
    else:
        bucket = store.url.removeprefix("s3://").split("/", 1)[0]
        boto3.client("s3", endpoint_url=store_endpoint(store)).put_object(Bucket=bucket, Key=key, Body=data)


def delete(store: ObjectStore, key: str) -> None:
    """Delete a stored object behind the archiver's back."""
    if store.url.startswith("file://"):
        (Path(store.url.removeprefix("file://")) / key).unlink()
    else:
        bucket = store.url.removeprefix("s3://").split("/", 1)[0]
        boto3.client("s3", endpoint_url=store_endpoint(store)).delete_object(Bucket=bucket, Key=key)


def run_cli(store: ObjectStore, args: Sequence[str]) -> Result:
    """`archiver ARGS --store STORE` in-process; it must end without a traceback."""
    store_args = ["--store", store.url]
    if store.url.startswith("s3://"):
        store_args += ["--s3-endpoint-url", store_endpoint(store)]
    result = CliRunner().invoke(main, [*args, *store_args], catch_exceptions=True)
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result


class Browsers:
    """Evidence browsers started over stores, each with an httpx client for it; ``close()`` stops them all."""

    def __init__(self) -> None:
        self._servers: list[BrowseServer] = []
        self._clients: list[httpx.Client] = []

    def start(
        self,
        store: ObjectStore,
        *,
        web_config: WebConfig | None = None,
        client_args: Mapping[str, Any] | None = None,
        **app_args: Any,
    ) -> httpx.Client:
        """A started ``BrowseServer`` over ``store`` (``app_args`` go to ``BrowseApp``) and a client for it."""
        server = BrowseServer(("127.0.0.1", 0), BrowseApp(store, **app_args), web_config=web_config)
        server.start()
        self._servers.append(server)
        client = httpx.Client(base_url=server.url, timeout=30, **(client_args or {}))
        self._clients.append(client)
        return client

    def close(self) -> None:
        for client in self._clients:
            client.close()
        for server in self._servers:
            server.stop()


class ClosedPipe(io.StringIO):
    """A writer whose reader went away after ``keep`` lines (what `| head -1` does to stdout)."""

    def __init__(self, keep: int) -> None:
        super().__init__()
        self.keep = keep

    def write(self, text: str) -> int:
        if self.getvalue().count("\n") >= self.keep:
            raise BrokenPipeError(32, "Broken pipe")
        return super().write(text)


# --- settings -----------------------------------------------------------------------------------


def settings_from(args: Sequence[str], env: Mapping[str, str] | None = None) -> Settings:
    """Settings as a command of the CLI resolves them from `args` and `env` (click does the merging);
    a configuration error is raised as ConfigError, whichever stage found it."""
    resolved: list[Settings] = []

    @click.command()
    @settings_options()
    def probe(**kwargs: object) -> None:
        resolved.append(resolve(dict(kwargs)))

    envs = [opt.env for opt in OPTIONS] + [alias.env for opt in OPTIONS for alias in opt.aliases if alias.env]
    clean = dict.fromkeys(envs) | {"ARCHIVER_CONFIG": None, "ARCHIVER_API_TOKEN": None}
    result = CliRunner().invoke(probe, list(args), env={**clean, **(env or {})})
    if isinstance(result.exception, ConfigError):
        raise result.exception
    if result.exit_code != 0:
        raise ConfigError(result.output)
    return resolved[0]


# --- the Helm chart -----------------------------------------------------------------------------

CHART = REPO / "helm" / "archiver"
# The oldest Kubernetes the chart supports (Chart.yaml kubeVersion), every minor through 1.33, and the
# newest schema kubernetes-validate ships.
K8S_VERSIONS = [*(f"1.{minor}" for minor in range(25, 34)), kubernetes_validate.utils.latest_version()]
CRD_SCHEMAS = {
    ("monitoring.coreos.com/v1", kind): json.loads(
        (REPO / "tests" / "data" / "crds" / f"monitoring.coreos.com_v1_{kind.lower()}.json").read_text()
    )
    for kind in ("ServiceMonitor", "PrometheusRule")
}
#: The API token the chart tests hand the chart: it must never appear in a rendered manifest.
CHART_TOKEN = "tok-3f9c2e7a-NEVER-IN-A-MANIFEST"

Doc = dict[str, Any]


def chart_values(name: str) -> dict[str, Any]:
    """The values file ``helm/archiver/ci/NAME``."""
    loaded: dict[str, Any] = yaml.safe_load((CHART / "ci" / name).read_text())
    return loaded


MINIMAL = chart_values("default-values.yaml")
ALL_FEATURES = chart_values("all-features-values.yaml")
CI_VALUES = sorted(p.name for p in (CHART / "ci").glob("*-values.yaml"))
#: The browser behind an authenticated Ingress under a path prefix (ci/browser-ingress-values.yaml).
BROWSER_INGRESS: dict[str, Any] = chart_values("browser-ingress-values.yaml")["browser"]
#: The rules' selector in tests that do not enable the chart's ServiceMonitor.
SELECTOR = 'job="archiver"'


def render(chart: helm.Chart, values: dict[str, Any]) -> list[Doc]:
    """Render like `helm template arch . -n observability` and parse every manifest."""
    manifests = chart.render(values, name="arch", namespace="observability")
    docs: list[Doc] = []
    for path, text in sorted(manifests.items()):
        if path.endswith("NOTES.txt"):
            continue
        docs.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return docs


def validate_manifests(docs: list[Doc], namespace: str = "observability") -> None:
    """Strict Kubernetes schema validation of every core manifest in every version of K8S_VERSIONS;
    the prometheus-operator objects against their CRD schemas."""
    assert docs
    for doc in docs:
        crd_schema = CRD_SCHEMAS.get((doc["apiVersion"], doc["kind"]))
        if crd_schema is not None:
            assert doc["metadata"]["namespace"] == namespace
            jsonschema.validate(doc, crd_schema)
            continue
        for version in K8S_VERSIONS:
            kubernetes_validate.validate(doc, version, strict=True)


def one(docs: list[Doc], kind: str, name: str | None = None) -> Doc:
    """The one rendered object of ``kind`` (and ``name``); fails unless there is exactly one."""
    found = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, got {len(found)}"
    return found[0]
