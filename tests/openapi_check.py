"""Checks responses against the provider's OpenAPI (patched in memory for its known defects), openapi-core."""

from __future__ import annotations

import copy
import functools
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import yaml
from openapi_core import OpenAPI
from openapi_core.templating.paths.exceptions import PathNotFound
from openapi_core.testing import MockRequest, MockResponse

_NAME = "gameye-session-openapi.yml"
_ROOT = Path(__file__).resolve().parent.parent
#: Where the provider's OpenAPI is looked for, first match wins: $ARCHIVER_OPENAPI_FILE, a copy in
#: the repository, then the team's shared reference folder.
OPENAPI_CANDIDATES = (
    *((Path(os.environ["ARCHIVER_OPENAPI_FILE"]),) if os.environ.get("ARCHIVER_OPENAPI_FILE") else ()),
    _ROOT / "tests" / "data" / _NAME,
    _ROOT / "docs" / "reference" / _NAME,
    Path("/work/shared/reference") / _NAME,
)

#: The OpenAPI's own server: openapi-core only matches requests under one of its servers.
SERVER_URL = "https://api.sandbox-gameye.gameye.net"

#: Statuses a gateway or proxy in front of the service answers on any endpoint; the OpenAPI does
#: not (and cannot) list them, so their bodies are not checked against it.
GATEWAY_STATUSES = frozenset({429, 500, 502, 503, 504})

STREAMED_PLACEHOLDER = b"<streamed body, not read>"


def _stringify_keys(node: Any) -> Any:
    if isinstance(node, dict):
        return {str(k): _stringify_keys(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_stringify_keys(v) for v in node]
    return node


def patched_spec(raw: Mapping[str, Any]) -> dict[str, Any]:
    """The OpenAPI document with its three defects fixed, plus what the interface spec adds.

    Defects (api-behaviour.md): integer response keys; ``/logs`` 200 without a description;
    ``SessionRun.ttl`` using ``examples``. Additions, because where the interface spec and the
    OpenAPI disagree both are accepted: DELETE /session/{id} may answer 200 (the spec) as well as
    204; ``/artifacts`` may label its gzip body ``application/gzip`` (the fake's default) as well
    as ``application/x-tar``; ``/logs`` may answer JSON entries as ``application/x-ndjson``.
    """
    spec: dict[str, Any] = _stringify_keys(copy.deepcopy(dict(raw)))
    paths = spec["paths"]
    paths["/logs"]["get"]["responses"]["200"].setdefault("description", "The session's output.")
    ttl = spec["components"]["schemas"]["SessionRun"]["properties"]["ttl"]
    ttl.pop("examples", None)
    ttl["example"] = "1h"
    paths["/session/{id}"]["delete"]["responses"]["200"] = {"description": "Terminated (interface spec)."}
    paths["/artifacts"]["get"]["responses"]["200"]["content"]["application/gzip"] = {}
    paths["/logs"]["get"]["responses"]["200"]["content"]["application/x-ndjson"] = {}
    return spec


@functools.cache
def openapi() -> OpenAPI:
    """The patched OpenAPI, loaded once."""
    source = next((p for p in OPENAPI_CANDIDATES if p.is_file()), None)
    if source is None:
        raise FileNotFoundError(f"the provider OpenAPI ({_NAME}) is in none of: {OPENAPI_CANDIDATES}")
    raw = yaml.safe_load(source.read_text(encoding="utf-8"))
    return OpenAPI.from_dict(patched_spec(raw))


class ContractViolation(AssertionError):
    """A response does not match the OpenAPI."""


def validate_response(
    method: str,
    url_path_with_query: str,
    status: int,
    headers: Mapping[str, str],
    body_bytes: bytes | None,
) -> bool:
    """Check one response against the OpenAPI; returns False when it was skipped (path not in the
    OpenAPI, e.g. /metrics, /query/log, /_fake/*, or a gateway status), True when it passed.
    ``body_bytes`` None means a streamed body: only status and headers are checked.
    Raises ContractViolation with openapi-core's explanation otherwise."""
    if status in GATEWAY_STATUSES:
        return False
    url = urlsplit(url_path_with_query)
    lower = {k.lower(): v for k, v in headers.items()}
    content_type = lower.get("content-type", "")
    request = MockRequest(
        SERVER_URL,
        method,
        url.path,
        args=dict(parse_qsl(url.query, keep_blank_values=True)),
    )
    # A streamed body was not read: its endpoints (/artifacts, /logs) document schema-less media
    # types, so a placeholder checks the status and the media type without looking at the bytes.
    data = STREAMED_PLACEHOLDER if body_bytes is None else body_bytes
    response = MockResponse(data, status_code=status, headers=dict(headers), content_type=content_type)
    try:
        openapi().validate_response(request, response)
    except PathNotFound:
        return False
    except Exception as err:  # openapi-core raises a family of errors; all mean "does not match"
        raise ContractViolation(f"{method} {url_path_with_query} -> {status}: {_explain(err)}") from err
    return True


def _explain(err: BaseException) -> str:
    parts = [f"{type(err).__name__}: {err}"]
    cause = err.__cause__ or err.__context__
    while cause is not None and len(parts) < 4:
        parts.append(f"{type(cause).__name__}: {cause}")
        schema_errors = getattr(cause, "schema_errors", None)
        if schema_errors:
            parts.extend(str(e.message) for e in schema_errors)
        cause = cause.__cause__ or cause.__context__
    return " <- ".join(parts)
