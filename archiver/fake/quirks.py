"""Quirk switches: wire-shape variations the real service is known or guessed to produce, off by default."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

from archiver.fake.errors import FakeConfigError

QUERY_LOG_SHAPES = ("text", "ndjson", "legacy")


@dataclass(frozen=True, slots=True)
class Quirks:
    """Every switch; see the field comments for the shape each one produces."""

    port_as_string: bool = False  # "port": "{\"7777/udp\": 20001}"
    port_wrapped: bool = False  # "port": {"port": {...}} (combines with port_as_string)
    labels_as_string: bool = False  # "labels": "{\"env\": ..., \"tags\": ...}"
    labels_wrapped: bool = False  # "labels": {"labels": {...}} (combines with labels_as_string)
    omit_optional_list_fields: bool = False  # list entries lack tag, status and playerCount
    player_count_null: bool = False  # list entries carry "playerCount": null
    omit_create_id: bool = False  # POST /session answers without "id" when the caller chose one
    delete_returns_200: bool = False  # DELETE /session/{id} answers an empty 200 instead of 204
    artifacts_content_type_tar: bool = False  # /artifacts says application/x-tar (body still gzip)
    query_log_shape: str = "text"  # GET /query/log body: text | ndjson | legacy
    extra_fields: bool = False  # unknown fields (enableMetrics, external_id) in session objects
    float_created: bool = False  # "created" as a float with a fractional millisecond part
    tag_absent_404: bool = False  # GET /tag answers 404 for an absent tag instead of exists:false
    metrics_extra_families: bool = False  # /metrics with HELP/TYPE and more families
    logs_keepalive: bool = False  # /logs?follow=true sends blank keep-alive lines while idle
    logs_gone_at_termination: bool = False  # /query/log and /logs answer the API's 404 once terminated
    logs_text_only: bool = False  # /logs answers plain text even when NDJSON is asked for

    def __post_init__(self) -> None:
        if self.query_log_shape not in QUERY_LOG_SHAPES:
            raise FakeConfigError(
                f"query_log_shape must be one of {', '.join(QUERY_LOG_SHAPES)}, got {self.query_log_shape!r}"
            )


QUIRK_NAMES: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Quirks))


def with_flags(quirks: Quirks, flags: Mapping[str, object]) -> Quirks:
    """``quirks`` with ``flags`` applied; unknown names or wrong value types raise FakeConfigError."""
    changes: dict[str, object] = {}
    for name, value in flags.items():
        if name not in QUIRK_NAMES:
            raise FakeConfigError(f"unknown quirk {name!r}; known: {', '.join(QUIRK_NAMES)}")
        expected = str if name == "query_log_shape" else bool
        if type(value) is not expected:
            raise FakeConfigError(f"quirk {name!r} takes a {expected.__name__}, got {value!r}")
        changes[name] = value
    return dataclasses.replace(quirks, **changes)  # type: ignore[arg-type]


def parse_quirk(text: str) -> tuple[str, bool | str]:
    """One ``--quirk`` value: ``NAME`` (switch on), ``NAME=true|false`` or ``query_log_shape=SHAPE``."""
    name, sep, raw = text.strip().partition("=")
    name = name.strip().replace("-", "_")
    if name not in QUIRK_NAMES:
        raise FakeConfigError(f"unknown quirk {name!r}; known: {', '.join(QUIRK_NAMES)}")
    if name == "query_log_shape":
        if not sep:
            raise FakeConfigError("quirk query_log_shape needs a value, e.g. query_log_shape=legacy")
        return name, raw.strip()
    if not sep:
        return name, True
    value = raw.strip().lower()
    if value in ("true", "1", "yes", "on"):
        return name, True
    if value in ("false", "0", "no", "off"):
        return name, False
    raise FakeConfigError(f"quirk {name!r} takes true or false, got {raw!r}")
