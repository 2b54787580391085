"""The families rendered from the upstream's sessions, as one declarative table (`FAMILIES`: name,
type, help, labels, how to render), and the text both exposition formats share: escaping, values,
headers, label names.

The exposition, the README check and the dashboards check all read the table; adding a per-session
gauge is one entry of `SESSION_FAMILIES`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from archiver.exporter.aggregates import Aggregates
from archiver.upstream.models import Session

_LABEL_KEY_INVALID = re.compile(r"[^a-zA-Z0-9_]")
DEFAULT_PREFIX = "sessionhost_"


def escape_label_value(value: str) -> str:
    r"""Escape a label value for both formats: `\` → `\\`, `"` → `\"`, newline → `\n`."""
    if "\\" in value or '"' in value or "\n" in value:
        value = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return value


def format_value(value: float) -> str:
    """A sample value as both formats spell it (`NaN`, `+Inf`, `-Inf`, shortest round-trip repr)."""
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)


def encode(text: str) -> bytes:
    # Session fields come from JSON, which can carry lone surrogates ("\ud800"): they cannot be UTF-8
    # encoded, so they become "?" rather than failing the whole poll.
    return text.encode("utf-8", "replace")


def family_header(name: str, doc: str, kind: str = "gauge") -> bytes:
    return encode(f"# HELP {name} {doc}\n# TYPE {name} {kind}\n")


def label_names_for(allowlist: Iterable[str]) -> dict[str, str]:
    """Map each allowlisted caller label key to a unique, valid Prometheus label name `label_<key>`.

    Invalid characters become `_`; clashes get `_2`, `_3`, ... in sorted order of the original keys,
    so the mapping depends only on the allowlist (e.g. `a-b` → `label_a_b`, `a.b` → `label_a_b_2`).
    """
    names: dict[str, str] = {}
    used: set[str] = set()
    for key in sorted(set(allowlist)):
        base = "label_" + _LABEL_KEY_INVALID.sub("_", key)
        name, n = base, 2
        while name in used:
            name, n = f"{base}_{n}", n + 1
        used.add(name)
        names[key] = name
    return names


@dataclass(frozen=True, slots=True)
class FamilySpec:
    """One metric family this module renders: what docs/metrics.md's tables and the dashboards'
    name check read (`FAMILIES`). `labels` are the documented label names (`label_<key>` stands for
    the allowlisted caller labels); `value_one` marks families whose samples are always 1."""

    name: str
    type: str
    help: str
    labels: tuple[str, ...]
    value_one: bool = False
    #: Whether `name` is relative to the renderer's prefix (`sessionhost_` by default).
    prefixed: bool = True

    def full_name(self, prefix: str = DEFAULT_PREFIX) -> str:
        return prefix + self.name if self.prefixed else self.name

    def header(self, prefix: str) -> bytes:
        """The family's HELP/TYPE lines under `prefix`."""
        return family_header(self.full_name(prefix), self.help, self.type)


#: Renders one session's sample line(s) of a family: (full name, session, `session_id="..."` pair,
#: allowlisted (label name, caller key) pairs) → text; "" renders no sample for that session.
SessionRender = Callable[[str, Session, str, tuple[tuple[str, str], ...]], str]


@dataclass(frozen=True, slots=True)
class SessionFamily(FamilySpec):
    """A per-session family: `render` is called once per new or changed session and cached."""

    render: SessionRender = lambda name, s, sid, pairs: ""
    #: The Session fields `render` reads: the change key is built from them (a changed value re-renders).
    fields: tuple[str, ...] = ()
    #: Rendered (header included) only when a label allowlist is configured.
    needs_allowlist: bool = False


@dataclass(frozen=True, slots=True)
class AggregateFamily(FamilySpec):
    """A family over all sessions (not capped by --max-sessions), rendered from `aggregates.aggregate`'s result."""

    render: Callable[[str, Aggregates], str] = lambda name, aggregates: ""


@dataclass(frozen=True, slots=True)
class SnapshotFamily(FamilySpec):
    """A one-sample gauge about the snapshot itself: `value(exported, dropped)`."""

    value: Callable[[int, int], int] = lambda exported, dropped: 0


def _render_info(name: str, s: Session, sid: str, pairs: tuple[tuple[str, str], ...]) -> str:
    esc = escape_label_value
    return (
        f'{name}{{host="{esc(s.host)}",image="{esc(s.image)}",location="{esc(s.location)}",'
        f'{sid},tag="{esc(s.tag)}"}} 1\n'
    )


def _render_created(name: str, s: Session, sid: str, pairs: tuple[tuple[str, str], ...]) -> str:
    return f"{name}{{{sid}}} {format_value(s.created_ms / 1000)}\n"


def _render_players(name: str, s: Session, sid: str, pairs: tuple[tuple[str, str], ...]) -> str:
    return "" if s.player_count is None else f"{name}{{{sid}}} {s.player_count}\n"


def _render_status(name: str, s: Session, sid: str, pairs: tuple[tuple[str, str], ...]) -> str:
    return f'{name}{{{sid},status="{escape_label_value(s.status)}"}} 1\n'


def _render_labels(name: str, s: Session, sid: str, pairs: tuple[tuple[str, str], ...]) -> str:
    esc = escape_label_value
    user = s.labels
    # Only allowlisted keys are read: every other caller label (and the env, which is not even in
    # the model) stays out of the output.
    parts = [f'{label}="{esc(value)}",' for label, k in pairs if (value := user.get(k)) is not None]
    return f"{name}{{{''.join(parts)}{sid}}} 1\n"


def _render_sessions(name: str, aggregates: Aggregates) -> str:
    esc = escape_label_value
    return "".join(
        f'{name}{{image="{esc(image)}",location="{esc(location)}",status="{esc(status)}",tag="{esc(tag)}"}} {n}\n'
        for (image, location, status, tag), n in sorted(aggregates[0].items())
    )


def _render_agg_players(name: str, aggregates: Aggregates) -> str:
    esc = escape_label_value
    return "".join(
        f'{name}{{image="{esc(image)}",location="{esc(location)}",tag="{esc(tag)}"}} {n}\n'
        for (image, location, tag), n in sorted(aggregates[1].items())
    )


#: Families over all sessions, first in the body.
AGGREGATE_FAMILIES: tuple[AggregateFamily, ...] = (
    AggregateFamily("sessions", "gauge", "Active sessions by location, image, tag and status.",
                    ("location", "image", "tag", "status"), render=_render_sessions),
    AggregateFamily("players", "gauge", "Players in active sessions by location, image and tag.",
                    ("location", "image", "tag"), render=_render_agg_players),
)  # fmt: skip
#: Per-session families, in body order after the aggregates.
#:
#: Adding a per-session gauge touches one entry here and one test. For example, a port count:
#:
#:     SessionFamily("session_ports", "gauge", "Ports published by the session.", ("session_id",),
#:                   render=lambda name, s, sid, pairs: f"{name}{{{sid}}} {len(s.ports)}\n",
#:                   fields=("ports",)),
#:
#: plus its row in docs/metrics.md's tables (tests/project/test_readme.py checks the tables against
#: `FAMILIES`, and tests/deploy/test_dashboards_alerts.py takes its known names from here). The header, the
#: cache, the change key and the join all follow from the entry.
SESSION_FAMILIES: tuple[SessionFamily, ...] = (
    SessionFamily("session_info", "gauge", "Information about an active session, always 1.",
                  ("session_id", "image", "tag", "location", "host"), value_one=True,
                  render=_render_info, fields=("image", "tag", "location", "host")),
    SessionFamily("session_created_timestamp_seconds", "gauge",
                  "When the session was created, in seconds since the epoch.", ("session_id",),
                  render=_render_created, fields=("created_ms",)),
    SessionFamily("session_players", "gauge", "Players currently in the session.",
                  ("session_id",), render=_render_players, fields=("player_count",)),
    SessionFamily("session_status", "gauge", "Current status of the session, always 1.",
                  ("session_id", "status"), value_one=True, render=_render_status, fields=("status",)),
    SessionFamily("session_labels", "gauge", "Allowlisted caller labels of the session, always 1.",
                  ("session_id", "label_<key>"), value_one=True, render=_render_labels, needs_allowlist=True),
)  # fmt: skip
#: Gauges about the snapshot, last in the session block (not in SelfMetrics: a name must not appear twice).
SNAPSHOT_FAMILIES: tuple[SnapshotFamily, ...] = (
    SnapshotFamily("archiver_sessions_exported", "gauge", "Sessions with per-session series in /metrics.", (),
                   prefixed=False, value=lambda exported, dropped: exported),
    SnapshotFamily("archiver_sessions_dropped", "gauge", "Sessions left out of per-session series by --max-sessions.",
                   (), prefixed=False, value=lambda exported, dropped: dropped),
)  # fmt: skip
#: Every family this module renders, in body order (the upstream families follow, re-exposed as is).
FAMILIES: tuple[FamilySpec, ...] = (*AGGREGATE_FAMILIES, *SESSION_FAMILIES, *SNAPSHOT_FAMILIES)
