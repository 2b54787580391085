"""Fake-service fixtures: the running fake, and httpx clients checking every response against the OpenAPI."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import httpx
import pytest

from archiver.fake import FakeService
from archiver.fake.pytest_plugin import TEST_TOKEN, fake_service, fake_service_factory
from tests.openapi_check import validate_response

__all__ = [
    "TEST_TOKEN",
    "fake_service",
    "fake_service_factory",
    "openapi_hooks",
    "raw_client",
    "validated_client",
    "validating_hook",
]


def validating_hook(response: httpx.Response) -> None:
    """httpx response hook: validate against the OpenAPI. A chunked (streamed) body is not read,
    so only its status and headers are checked; any other body is read and checked in full."""
    streamed = "chunked" in response.headers.get("transfer-encoding", "").lower()
    body: bytes | None = None
    if not streamed:
        body = response.read()
    request = response.request
    validate_response(
        request.method,
        request.url.raw_path.decode("ascii"),
        response.status_code,
        dict(response.headers),
        body,
    )


def openapi_hooks() -> dict[str, list[Callable[[httpx.Response], None]]]:
    """``event_hooks=`` value for any httpx.Client that should validate what it receives."""
    return {"response": [validating_hook]}


@pytest.fixture
def validated_client(fake_service: FakeService) -> Iterator[httpx.Client]:
    """An httpx.Client on ``fake_service`` with ``test-token``; every response is validated
    against the (patched) OpenAPI and a mismatch fails the request with ContractViolation."""
    with httpx.Client(
        base_url=fake_service.base_url,
        headers={"Authorization": f"Bearer {TEST_TOKEN}", "Accept": "application/json"},
        event_hooks=openapi_hooks(),
        timeout=30.0,
    ) as client:
        yield client


@pytest.fixture
def raw_client(fake_service: FakeService) -> Iterator[httpx.Client]:
    """Like validated_client but unchecked: for responses that are off-contract on purpose
    (quirk shapes, control API, injected garbage)."""
    with httpx.Client(
        base_url=fake_service.base_url,
        headers={"Authorization": f"Bearer {TEST_TOKEN}", "Accept": "application/json"},
        timeout=30.0,
    ) as client:
        yield client
