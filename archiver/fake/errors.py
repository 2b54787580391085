"""Errors of the fake hosting service: bad options (a ConfigError) and misuse of its Python API."""

from __future__ import annotations

from collections.abc import Sequence

from archiver.errors import ArchiverError, ConfigError, Violation


class FakeServiceError(ArchiverError):
    """Base of the errors the fake service's Python API raises on purpose."""


class FakeConfigError(FakeServiceError, ConfigError, ValueError):
    """A fake-service option (quirk name, fault spec, token, catalogue) is invalid."""


class UnknownSessionError(FakeServiceError, LookupError):
    """The Python API was asked about a session its organisation does not have (or no longer has)."""


class UnknownTokenError(FakeServiceError, LookupError):
    """The Python API was given a token that is not one of the service's organisations."""


class HttpProblem(Exception):
    """Raised inside a request handler: answer with this status and a standard error body."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        details: str = "",
        *,
        violations: Sequence[Violation] = (),
    ) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.details = details
        self.violations = tuple(violations)
