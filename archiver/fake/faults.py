"""Fault switches per endpoint: which requests fail, and how (status, latency, broken transport, garbage)."""

from __future__ import annotations

import contextlib
import math
import random
import threading
from collections import Counter
from collections.abc import Mapping
from dataclasses import asdict, dataclass

from archiver.config.values import as_bool
from archiver.fake.endpoints import SPEC_ENDPOINTS
from archiver.fake.errors import FakeConfigError

#: What a fired fault does. "status": answer ``status`` (or only add latency when it is None);
#: "truncate": declare the full length, send part of the body, close; "reset": close the connection
#: with an RST and no response; "drip": send the real response a few bytes at a time;
#: "garbage": 200 with a non-JSON body; "wrong_types": 200 with JSON of the wrong types; "html":
#: answer ``status`` with a proxy's HTML page instead of the API's error body (e.g. a 404);
#: "cut": send the real body up to ``after`` bytes (possibly mid-line, mid-chunk), then close the
#: connection without ending the body, as a follow stream breaks when a proxy or the network drops it.
FAULT_KINDS = ("status", "truncate", "reset", "drip", "garbage", "wrong_types", "html", "cut")

#: Any endpoint without a fault of its own.
ANY = "*"


@dataclass(frozen=True, slots=True)
class FaultSpec:
    """One endpoint's fault. Each request fires it with probability ``rate`` (1 when unset), at
    most ``count`` times in all (unlimited when None): ``count=3`` fails the next three requests,
    ``rate=0.2`` a fifth of all, ``rate=0.5, count=2`` half of them until two have failed.
    ``per_session`` caps the firings per session (the request's ``id``, ``matchKey`` or
    ``session``): ``kind="cut", per_session=1`` cuts each session's stream once; ``follow_only``
    fires on ``GET /logs?follow=true`` requests alone."""

    kind: str = "status"
    status: int | None = None
    rate: float = 0.0
    count: int | None = None
    retry_after: float | None = None
    latency: float = 0.0
    #: Seconds between two pieces of a "drip" body.
    interval: float = 0.05
    #: Body bytes a "cut" sends before it closes the connection (None: half of the first chunk).
    after: int | None = None
    #: Firings per session at most (None: no per-session limit).
    per_session: int | None = None
    #: Fire only on follow streams (`GET /logs?follow=true`).
    follow_only: bool = False

    def __post_init__(self) -> None:
        if self.kind not in FAULT_KINDS:
            raise FakeConfigError(f"fault kind must be one of {', '.join(FAULT_KINDS)}, got {self.kind!r}")
        if self.status is not None and not 400 <= self.status <= 599:
            raise FakeConfigError(f"fault status must be 400-599, got {self.status}")
        if self.status is not None and self.kind not in ("status", "html"):
            raise FakeConfigError(f"fault kind {self.kind!r} takes no status")
        if not 0.0 <= self.rate <= 1.0:
            raise FakeConfigError(f"fault rate must be within 0..1, got {self.rate}")
        if self.count is not None and self.count < 0:
            raise FakeConfigError(f"fault count must be >= 0, got {self.count}")
        if self.latency < 0 or (self.retry_after is not None and self.retry_after < 0):
            raise FakeConfigError("fault latency and retry_after must be >= 0")
        if self.interval <= 0:
            raise FakeConfigError(f"fault interval must be > 0, got {self.interval}")
        if self.after is not None and (self.kind != "cut" or self.after < 0):
            raise FakeConfigError("fault option after takes a byte count >= 0 and belongs to kind 'cut'")
        if self.per_session is not None and self.per_session < 0:
            raise FakeConfigError(f"fault per_session must be >= 0, got {self.per_session}")


def check_endpoint(endpoint: str) -> str:
    """``endpoint`` if it names a spec endpoint key or ``*``; FakeConfigError otherwise."""
    if endpoint != ANY and endpoint not in SPEC_ENDPOINTS:
        raise FakeConfigError(f"unknown endpoint {endpoint!r}; use '*' or one of: {', '.join(SPEC_ENDPOINTS)}")
    return endpoint


def fault_from_mapping(values: Mapping[str, object]) -> FaultSpec:
    """A FaultSpec from loosely typed values (JSON or parsed text); FakeConfigError on bad input."""
    unknown = set(values) - {
        "kind", "status", "rate", "count", "retry_after", "latency", "interval", "after", "per_session", "follow_only",
    }  # fmt: skip
    if unknown:
        raise FakeConfigError(f"unknown fault option(s): {', '.join(sorted(unknown))}")

    kind = values.get("kind", "status")
    if not isinstance(kind, str):
        raise FakeConfigError(f"fault kind must be a string, got {kind!r}")
    whole = {name: _number(values, name) for name in ("status", "count", "after", "per_session")}
    for name, num in whole.items():
        if num is not None and num != int(num):
            raise FakeConfigError(f"fault {name} must be an integer, got {num}")
    status, count, after, per_session = (None if n is None else int(n) for n in whole.values())
    return FaultSpec(
        kind=kind,
        status=status,
        rate=_number(values, "rate") or 0.0,
        count=count,
        retry_after=_number(values, "retry_after"),
        latency=_number(values, "latency") or 0.0,
        interval=_number(values, "interval") or 0.05,
        after=after,
        per_session=per_session,
        follow_only=_flag(values, "follow_only"),
    )


def _flag(values: Mapping[str, object], name: str) -> bool:
    raw = values.get(name, False)
    try:
        return as_bool(raw)
    except ValueError:
        raise FakeConfigError(f"fault {name} takes true or false, got {raw!r}") from None


def _number(values: Mapping[str, object], name: str) -> float | None:
    raw = values.get(name)
    if raw is None:
        return None
    num: float | None = None
    if isinstance(raw, int | float) and not isinstance(raw, bool):
        num = float(raw)
    elif isinstance(raw, str):
        with contextlib.suppress(ValueError):
            num = float(raw)
    if num is not None and math.isfinite(num):
        return num
    raise FakeConfigError(f"fault {name} must be a number, got {raw!r}")


def parse_fault_spec(text: str) -> tuple[str, FaultSpec]:
    """One ``--fault`` value: ``ENDPOINT:opt=value,...``; a bare word is the kind.

    Examples: ``"GET /session:status=502,count=3"``, ``"*:status=503,rate=0.1"``,
    ``"GET /artifacts:truncate,count=1"``, ``"GET /metrics:latency=2"``,
    ``"GET /logs:cut,after=300,per_session=1,follow_only=true"``.
    """
    endpoint, sep, options = text.partition(":")
    if not sep:
        raise FakeConfigError(f"fault spec {text!r} needs the form 'ENDPOINT:opt=value,...'")
    values: dict[str, object] = {}
    for part in filter(None, (p.strip() for p in options.split(","))):
        name, eq, raw = part.partition("=")
        name = name.strip().replace("-", "_")
        if not eq:
            values["kind"] = name
        else:
            values[name] = raw.strip()
    return check_endpoint(endpoint.strip()), fault_from_mapping(values)


def fired_label(spec: FaultSpec) -> str:
    """How a fired fault is counted: its status ("503"), "latency" for a delay alone, else its kind."""
    if spec.kind in ("status", "html"):
        return "latency" if spec.status is None else str(spec.status)
    return spec.kind


class FaultTable:
    """Installed faults and the seeded draw deciding whether one fires. Thread-safe."""

    def __init__(self, seed: int = 0) -> None:
        self._lock = threading.Lock()
        self._rng = random.Random(seed)
        self._faults: dict[str, FaultSpec] = {}
        #: Firings left per endpoint; None = unlimited.
        self._remaining: dict[str, int | None] = {}
        #: Faults fired since the start, by (endpoint key or ``*``, `fired_label`).
        self._fired: Counter[tuple[str, str]] = Counter()
        #: Firings per (installed key, session) for faults with ``per_session``.
        self._per_session: Counter[tuple[str, str]] = Counter()

    def set(self, endpoint: str, spec: FaultSpec) -> None:
        """Install (or replace) the fault of ``endpoint`` (a spec endpoint key or ``*``)."""
        check_endpoint(endpoint)
        with self._lock:
            self._faults[endpoint] = spec
            self._remaining[endpoint] = spec.count
            self._forget_sessions(endpoint)

    def clear(self, endpoint: str | None = None) -> None:
        """Remove one endpoint's fault, or all of them."""
        with self._lock:
            if endpoint is None:
                self._faults.clear()
                self._remaining.clear()
                self._per_session.clear()
            else:
                self._faults.pop(endpoint, None)
                self._remaining.pop(endpoint, None)
                self._forget_sessions(endpoint)

    def _forget_sessions(self, endpoint: str) -> None:
        """Drop the per-session firings of ``endpoint``'s fault (the lock is held)."""
        for pair in [p for p in self._per_session if p[0] == endpoint]:
            del self._per_session[pair]

    def draw(self, endpoint: str, *, session: str | None = None, follow: bool = False) -> FaultSpec | None:
        """The fault to apply to this request of ``endpoint``, or None (the endpoint's own fault
        wins over ``*``). ``session`` is the session the request names (for ``per_session``),
        ``follow`` whether it asks for a follow stream (for ``follow_only``)."""
        with self._lock:
            key = endpoint if endpoint in self._faults else ANY
            spec = self._faults.get(key)
            if spec is None:
                return None
            remaining = self._remaining[key]
            if remaining is not None and remaining <= 0:
                return None
            if spec.follow_only and not follow:
                return None
            pair = (key, session or "")
            if spec.per_session is not None and self._per_session[pair] >= spec.per_session:
                return None
            if spec.rate > 0 and self._rng.random() >= spec.rate:
                return None
            if remaining is not None:
                self._remaining[key] = remaining - 1
            if spec.per_session is not None:
                self._per_session[pair] += 1
            self._fired[(endpoint, fired_label(spec))] += 1
            return spec

    def fired(self, endpoint: str | None = None) -> dict[str, int]:
        """How many requests each kind of fault hit since the start (see `fired_label`), on one
        endpoint key or on all."""
        totals: Counter[str] = Counter()
        with self._lock:
            for (where, label), count in self._fired.items():
                if endpoint is None or where == endpoint:
                    totals[label] += count
        return dict(totals)

    def snapshot(self) -> dict[str, dict[str, object]]:
        """Installed faults with their remaining counts (for ``GET /_fake/state``)."""
        with self._lock:
            return {k: {**asdict(v), "remaining": self._remaining[k]} for k, v in self._faults.items()}
