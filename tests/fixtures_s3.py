"""S3 test fixtures: one moto server (server mode, 127.0.0.1, port 0) per session, a fresh bucket per test."""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

__all__ = ["moto_endpoint", "s3_bucket", "s3_client"]

_DUMMY_AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    # Never read the developer's real AWS config or credentials files.
    "AWS_CONFIG_FILE": os.devnull,
    "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
}
_UNSET_AWS_ENV = ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_CA_BUNDLE")


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


@pytest.fixture
def s3_client(moto_endpoint: str) -> Callable[..., Any]:
    """Factory of boto3 S3 clients for the moto server, built like the archiver builds its own.

    ``s3_client(checksum_mode="when_supported")``; each call returns a fresh client (so a test can
    attach botocore event hooks to one without affecting others).
    """
    from archiver.store import make_s3_client

    def make(checksum_mode: str = "when_supported") -> Any:
        return make_s3_client(endpoint_url=moto_endpoint, checksum_mode=checksum_mode)  # type: ignore[arg-type]

    return make


@pytest.fixture
def s3_bucket(moto_endpoint: str, s3_client: Callable[..., Any]) -> tuple[str, str]:
    """``(endpoint_url, bucket)``: a fresh, uniquely named, empty bucket on the moto server."""
    bucket = f"test-{uuid.uuid4().hex[:20]}"
    s3_client().create_bucket(Bucket=bucket)
    return moto_endpoint, bucket
