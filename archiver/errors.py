"""The archiver's exception tree: one root, a branch per boundary (config, upstream API, store, state, spool).

Every error raised on purpose is an :class:`ArchiverError`; ``archiver.cli`` catches that root and
prints one line (exit 2 for a ConfigError, 1 for the rest), so a user mistake never shows a
traceback. Anything else escaping is a bug. The whole tree::

    ArchiverError
    ├── ConfigError                 invalid option, config file, web config, listen address
    ├── InputError (ValueError)     an id, instance, path or count out of bounds (archiver/config/inputs.py)
    │   └── PatternError            a search pattern invalid, or one RE2 cannot run (retrieval/pattern.py)
    ├── StateError                  state DB missing (read-only open), newer schema, corrupt
    ├── TooLargeError               a download passed its size limit while streaming to the spool
    ├── SessionNotArchivedError     retrieval: no manifest for that session (or instance)
    ├── ArchiveIntegrityError       retrieval: stored bytes differ from the manifest / bad gzip
    ├── LocalFileError              retrieval: the download target cannot be written
    ├── ManifestError               a manifest or index entry is not of the expected schema
    ├── LogError (ValueError)       transparency log: a malformed key, note, checkpoint, tile or bundle
    │   └── LogVerificationError    a signature, inclusion or consistency proof that does not verify
    ├── PayloadError (ValueError)   an upstream payload has the wrong shape (pure parsers)
    ├── ApiError                    talking to the session hosting service; ``transient`` says retry
    │   ├── ApiTransportError       no usable response (refused, reset, timeout, truncated)
    │   ├── ApiDecodeError          a 2xx body that is not what the endpoint promises
    │   ├── ApiRequestError         a request not sent: an id or path too long for a URL, or not UTF-8
    │   └── ApiStatusError          an HTTP error status (status_error_class maps it)
    │       ├── UnauthorizedError 401, ForbiddenError 403, NotFoundError 404, ConflictError 409,
    │       ├── UnprocessableError 422, RateLimitedError 420/429 (transient)
    │       └── ServerError 5xx (transient)
    └── StoreError                  the object store failed; ``transient`` says pause and retry
        ├── StoreUnavailableError   connection, 5xx, throttling, ENOSPC/EIO (transient)
        │   └── ChecksumMismatchError (store/s3_multipart.py, internal: BadDigest, told apart by put_file)
        ├── StorePermissionError    access denied, missing bucket, read-only
        ├── StoreUnsupportedError   an optional operation the server does not implement (501)
        ├── InvalidKeyError (ValueError)  a key that could escape its prefix
        ├── ObjectNotFoundError     no object at a key
        ├── ObjectConflictError     create-once found a different object at the key
        ├── SourceFileError         the local file differs from its declared size/sha256
        ├── PreconditionFailedError (store/s3_multipart.py, internal: resolved by comparing sha256)
        ├── NoSuchUploadError       (store/s3_multipart.py, internal: the upload was completed or aborted)
        ├── CompletionRefusedError  (store/s3_multipart.py, internal: the server refused a resumed upload's parts)
        └── _StartAfresh            (store/s3_multipart.py, internal: forget a resumed upload, start a fresh one)

Defined beside the code that raises them, still under the root:

    ArchiverError
    ├── SqlError (InputError)       (index/sql.py) a query `archiver sql` cannot parse, bind or run
    └── FakeServiceError            (fake/errors.py) misuse of the fake service's Python API
        ├── FakeConfigError (ConfigError, ValueError)  a bad quirk, fault spec, token or catalogue
        ├── UnknownSessionError (LookupError)
        └── UnknownTokenError (LookupError)

Internal control flow, outside the tree on purpose (never leave their module, never seen by a user):
``fake.errors.HttpProblem`` (a fake request handler's way to answer an error status),
``fake.validation.InvalidBody`` (turned into a 422 by the fake), ``retrieval.grep._Cancelled``
(ends a search thread when the printer stopped), ``upstream.listparser.WholeBodyNeeded`` (the
streamed list parse hands an odd body to the whole-body parse) and ``tlog.standalone.BundleError``
(the standalone bundle verifier imports nothing from the archiver; ``archiver verify-bundle``
turns it into a ``LogVerificationError``). ``tests/cli/test_cli_errors.py`` walks
every module and fails on any other exception class outside the tree.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

#: Longest body excerpt an error carries; enough to recognise an HTML error page, short enough for a log line.
EXCERPT_LIMIT = 200


def excerpt(body: bytes | str, limit: int = EXCERPT_LIMIT) -> str:
    """A short, single-line, printable excerpt of a trusted text (an S3 error message, our own manifest)
    for error messages. Bodies from the session hosting service go through `upstream_excerpt`."""
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


#: Where an upstream excerpt stops: the first byte that may open a string or a value, or hide one in an
#: escape: quotes (JSON's `"`, `'`, a backtick), `:` and `=` (a value follows), and `\\`, `&`, `%`
#: (a backslash escape, an HTML entity, percent-encoding). Every key and value of a JSON body,
#: `labels.env` included, lies after such a byte however its name is escaped (`"\\u006cabels"`),
#: and so does every value of a `key=value`, `key: value` or HTML-escaped echo of one.
_STOPS = frozenset(b"\"'`:=\\&%")


def upstream_excerpt(body: bytes | bytearray | str, limit: int = EXCERPT_LIMIT) -> str:
    """A secret-free excerpt of a body from the session hosting service, by construction.

    It holds only the bytes before the first byte that may open a string or a value (see `_STOPS`;
    printable ASCII, other bytes shown as ``?``), then ``…`` and the body's size when anything
    follows. No byte of any string (so of no key, env name or env value) can be shown, whatever the
    body: valid JSON, JSON with escaped key names, truncated, prefixed with a stray quote, or an
    HTML page echoing it. Nothing is searched for: the cut is made before anything could start.
    Enough remains to tell an HTML error page (``<html><head><title>502 Bad Gateway</title>``)
    from JSON (``{``) or plain garbage.
    """
    raw = body.encode("utf-8", "replace") if isinstance(body, str) else body
    size = len(raw)
    head: list[str] = []
    for byte in bytes(raw[:limit]):
        if byte in _STOPS:
            break
        head.append(chr(byte) if 32 <= byte < 127 else " " if byte in b"\t\n\r" else "?")
    text = " ".join("".join(head).split())
    if len(head) < size:
        text += f"… ({size} bytes)"
    return text


class ArchiverError(Exception):
    """Base of every error the archiver raises on purpose."""


class ConfigError(ArchiverError):
    """The user's configuration is invalid; the message says which option and why."""


class InputError(ArchiverError, ValueError):
    """A value handed in at an edge (an id, an instance name, a path, a count) is out of the bounds
    `archiver.config.inputs` sets; the message says which bound. The CLI exits 2, the browser answers 400."""


class PatternError(InputError):
    """A search pattern is not a valid regular expression, or uses what linear-time search (RE2) cannot
    run (a backreference, lookaround…); the message names the construct. Exit 2, or a 400 page."""


class StateError(ArchiverError):
    """The state DB is unusable (missing, newer schema, corrupt file); the message says what to do."""


class TooLargeError(ArchiverError):
    """The body passed the size limit while streaming (the partial file is already removed)."""


class SessionNotArchivedError(ArchiverError):
    """A retrieval command asked for a session that has no manifest in the store."""


class ArchiveIntegrityError(ArchiverError):
    """A stored object does not match its manifest (size, sha256), or cannot be decoded (bad gzip)."""


class LocalFileError(ArchiverError):
    """A download could not be written locally (no space, no permission, the path is a file)."""


# --- upstream API -----------------------------------------------------------------------------


class ApiError(ArchiverError):
    """Any failure talking to the session hosting service."""

    def __init__(self, message: str, *, method: str = "", path: str = "") -> None:
        super().__init__(message)
        self.method = method
        self.path = path

    #: Whether retrying the same request may succeed.
    transient: bool = False


class ApiTransportError(ApiError):
    """No usable HTTP response: connection refused or reset, timeout, truncated body."""

    transient = True


class ApiDecodeError(ApiError):
    """A successful response whose body is not what the endpoint promises (garbage, wrong types)."""

    def __init__(self, message: str, *, body: bytes | bytearray | str = b"", method: str = "", path: str = "") -> None:
        # The body came from the upstream: only its secret-free excerpt is kept (see upstream_excerpt).
        self.excerpt = upstream_excerpt(body) if body else ""
        detail = f"{message} (body starts: {self.excerpt!r})" if self.excerpt else message
        super().__init__(detail, method=method, path=path)


class ApiRequestError(ApiError):
    """A request the client refuses to send: a session id or artifact path that is empty, longer than
    ``archiver.config.inputs`` allows, or not UTF-8 (no URL can carry it; retrying cannot help)."""


@dataclass(frozen=True, slots=True)
class Violation:
    """One field complaint of a 422 answer."""

    field: str
    description: str


class ApiStatusError(ApiError):
    """The upstream answered with an error status; carries what its error body said, if anything."""

    def __init__(
        self,
        status: int,
        *,
        code: str = "",
        message: str = "",
        details: str = "",
        identifier: str = "",
        violations: Sequence[Violation] = (),
        body_excerpt: str = "",
        retry_after: float | None = None,
        method: str = "",
        path: str = "",
    ) -> None:
        self.status = status
        self.code = code
        self.upstream_message = message
        self.details = details
        self.identifier = identifier
        self.violations = tuple(violations)
        self.body_excerpt = body_excerpt
        self.retry_after = retry_after
        parts = [f"{method} {path} answered {status}".strip()]
        if code:
            parts.append(code)
        if message:
            parts.append(message)
        elif body_excerpt:
            parts.append(f"body starts: {body_excerpt!r}")
        if self.violations:
            parts.append("; ".join(f"{v.field}: {v.description}" for v in self.violations))
        if identifier:
            parts.append(f"identifier={identifier}")
        super().__init__(
            ": ".join(parts[:1]) + (" — " + " | ".join(parts[1:]) if parts[1:] else ""),
            method=method,
            path=path,
        )


class UnauthorizedError(ApiStatusError):
    """401: the token is missing, malformed, expired or for the other environment."""


class ForbiddenError(ApiStatusError):
    """403: the token lacks the scope for this endpoint."""


class NotFoundError(ApiStatusError):
    """404: unknown session (or removed after retention), image, location or tag."""


class ConflictError(ApiStatusError):
    """409: duplicate session id, or the session is already terminated."""


class UnprocessableError(ApiStatusError):
    """422: the request body was rejected; `violations` says which fields."""


class RateLimitedError(ApiStatusError):
    """420 or 429: no capacity or too many requests; honour `retry_after`."""

    transient = True


class ServerError(ApiStatusError):
    """5xx: the upstream (or a proxy in front of it) failed."""

    transient = True


def status_error_class(status: int) -> type[ApiStatusError]:
    """The exception class for an HTTP error status (never through http.HTTPStatus: 420 is not in it)."""
    if status >= 500:
        return ServerError
    return {
        401: UnauthorizedError,
        403: ForbiddenError,
        404: NotFoundError,
        409: ConflictError,
        420: RateLimitedError,
        422: UnprocessableError,
        429: RateLimitedError,
    }.get(status, ApiStatusError)


# --- object store -----------------------------------------------------------------------------


class StoreError(ArchiverError):
    """The object store (S3 or a directory) failed an operation."""

    transient: bool = False


class StoreUnavailableError(StoreError):
    """Transient store failure (connection, 5xx, throttling, ENOSPC/EIO): pause and retry later."""

    transient = True


class StoreUnsupportedError(StoreError):
    """The server does not implement an optional operation (`501 NotImplemented`, e.g. listing
    multipart uploads): the feature is skipped with a warning, it is not a store outage."""


class StorePermissionError(StoreError):
    """The store refuses us (AccessDenied, missing bucket, bad credentials, EACCES, read-only): alert."""


class InvalidKeyError(StoreError, ValueError):
    """A key that could escape its prefix or the store's directory (`..`, leading `/`, NUL, too long)."""


class ObjectNotFoundError(StoreError):
    """A read asked for a key that does not exist."""

    def __init__(self, key: str) -> None:
        super().__init__(f"no object at key {key!r}")
        self.key = key


class ObjectConflictError(StoreError):
    """A create-once write found a different object (other sha256 or size) already at the key."""

    def __init__(self, key: str, *, detail: str = "") -> None:
        message = f"a different object already exists at key {key!r}"
        super().__init__(f"{message}: {detail}" if detail else message)
        self.key = key


class SourceFileError(StoreError):
    """The local file handed to the store is missing or differs from its declared size/sha256."""


class ManifestError(ArchiverError):
    """A manifest or index entry is not valid JSON of the expected schema; carries a short excerpt."""

    def __init__(self, message: str, *, body: bytes | str = b"") -> None:
        self.excerpt = excerpt(body) if body else ""
        super().__init__(f"{message} (starts: {self.excerpt!r})" if self.excerpt else message)


class LogError(ArchiverError, ValueError):
    """A transparency log key, signed note, checkpoint, tile or proof bundle that is malformed."""


class LogVerificationError(LogError):
    """Evidence that does not verify: a bad signature, an inclusion or consistency proof that fails."""


class PayloadError(ArchiverError, ValueError):
    """An upstream payload does not have the shape its endpoint promises (raised by pure parsers)."""
