"""Entry point of ``archiver fake-service``: options, parsing them from CLI strings, serve_forever."""

from __future__ import annotations

import math
import signal
import ssl
import sys
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import FrameType, MappingProxyType
from typing import Any, TextIO

from archiver.config import values
from archiver.config.settings import TOKEN_ENV
from archiver.fake import FakeService
from archiver.fake.clock import FakeClock
from archiver.fake.errors import FakeConfigError
from archiver.fake.faults import FaultSpec, parse_fault_spec
from archiver.fake.logs import DEFAULT_BODY_LINES
from archiver.fake.quirks import Quirks, parse_quirk, with_flags


@dataclass(frozen=True, slots=True)
class FakeServiceOptions:
    """Everything ``archiver fake-service`` can be told. Durations are virtual seconds."""

    host: str = "127.0.0.1"
    port: int = 8080
    tokens: tuple[str, ...] = ("test-token",)
    time_scale: float = 1.0
    retention: float = 4 * 3600.0
    traffic: bool = False
    traffic_rate_per_min: float = 6.0
    traffic_min_duration: float = 120.0
    traffic_max_duration: float = 900.0
    traffic_crash_ratio: float = 0.1
    traffic_max_active: int | None = None
    quirks: Mapping[str, bool | str] = field(default_factory=lambda: MappingProxyType({}))
    faults: tuple[tuple[str, FaultSpec], ...] = ()
    capacity: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    start_rate_per_min: int | None = None
    log_lines: int = DEFAULT_BODY_LINES
    #: Serve HTTPS with this context (from `--web.config.file`'s tls_server_config); None: HTTP.
    tls: ssl.SSLContext | None = None


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:8080`` for IPv6; port 0 picks a free one)."""
    try:
        return values.parse_listen(text)
    except ValueError as exc:
        raise FakeConfigError(f"--web.listen-address: {exc}") from None


def parse_duration(text: str) -> float:
    """Seconds of ``4h``, ``30m``, ``1h30m``, ``90s`` or a plain number of seconds."""
    try:
        return values.parse_duration(text)
    except ValueError as exc:
        raise FakeConfigError(str(exc)) from None


def parse_capacity(text: str) -> tuple[str, int]:
    """``LOCATION=N``: at most N active sessions in LOCATION."""
    location, sep, raw = text.partition("=")
    if not sep or not location.strip() or not raw.strip().isdigit():
        raise FakeConfigError(f"--capacity takes LOCATION=N, e.g. eu-west-1=10, got {text!r}")
    return location.strip(), int(raw)


def options_from_cli(
    *,
    listen: str | tuple[str, int] = "127.0.0.1:8080",
    tokens: Iterable[str] = (),
    time_scale: float = 1.0,
    retention: str | float = "4h",
    traffic: bool = False,
    traffic_rate: float = 6.0,
    quirks: Iterable[str] = (),
    faults: Iterable[str] = (),
    capacity: Iterable[str] = (),
    start_rate: int | None = None,
) -> FakeServiceOptions:
    """Options from the command line's raw strings (or the address and retention already parsed),
    every one validated (FakeConfigError says which)."""
    host, port = parse_listen(listen) if isinstance(listen, str) else listen
    token_list = tuple(tokens) or ("test-token",)
    if not 0 <= time_scale < math.inf:  # NaN fails too
        raise FakeConfigError(f"--time-scale must be >= 0 and finite, got {time_scale}")
    if not 0 < traffic_rate < math.inf:
        raise FakeConfigError(f"--traffic-rate must be > 0, got {traffic_rate}")
    quirk_map = dict(parse_quirk(q) for q in quirks)
    with_flags(Quirks(), quirk_map)  # validates the combination now, not at start-up
    return FakeServiceOptions(
        host=host,
        port=port,
        tokens=token_list,
        time_scale=time_scale,
        retention=parse_duration(retention) if isinstance(retention, str) else float(retention),
        traffic=traffic,
        traffic_rate_per_min=traffic_rate,
        quirks=MappingProxyType(quirk_map),
        faults=tuple(parse_fault_spec(f) for f in faults),
        capacity=MappingProxyType(dict(parse_capacity(c) for c in capacity)),
        start_rate_per_min=start_rate,
    )


def tokens_from_file(path: Path) -> tuple[str, ...]:
    """The accepted tokens of a token file: one per line (blank lines ignored)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8"
        raise FakeConfigError(f"--api-token-file {path}: {reason}") from None
    tokens = tuple(line.strip() for line in text.splitlines() if line.strip())
    if not tokens:
        raise FakeConfigError(f"--api-token-file {path}: no token in it")
    return tokens


def options_from_values(
    values: Mapping[str, Any],
    *,
    tokens: Iterable[str] = (),
    env: Mapping[str, str] | None = None,
    tls: ssl.SSLContext | None = None,
) -> FakeServiceOptions:
    """Options from the converted values of `archiver.config.command_options.FAKE_SERVICE_OPTIONS` (by key).
    The tokens: the token file's, else ``tokens`` (the deprecated ``--token``), else the
    ARCHIVER_API_TOKEN variable of ``env``, else test-token."""
    token_file = values["api_token_file"]
    env_token = (env or {}).get(TOKEN_ENV, "").strip()
    if token_file is not None:
        accepted = tokens_from_file(Path(token_file))
    else:
        accepted = tuple(tokens) or ((env_token,) if env_token else ())
    options = options_from_cli(
        listen=values["web_listen_address"],
        tokens=accepted,
        time_scale=values["time_scale"],
        retention=values["retention"],
        traffic=values["traffic"],
        traffic_rate=values["traffic_rate"],
        quirks=values["quirk"],
        faults=values["fault"],
        capacity=values["capacity"],
        start_rate=values["start_rate"],
    )
    return replace(options, tls=tls)


def build_service(options: FakeServiceOptions) -> FakeService:
    """A (not yet started) FakeService configured by ``options``."""
    svc = FakeService(
        options.tokens,
        host=options.host,
        port=options.port,
        clock=FakeClock(time_scale=options.time_scale),
        retention=options.retention,
        capacity=options.capacity or None,
        start_rate_per_min=options.start_rate_per_min,
        log_lines=options.log_lines,
        quirks=options.quirks,
        tls=options.tls,
    )
    for endpoint, spec in options.faults:
        svc.state.faults.set(endpoint, spec)
    return svc


def serve_forever(
    options: FakeServiceOptions, *, out: TextIO | None = None, stop: threading.Event | None = None
) -> None:
    """Run the fake service until SIGINT/SIGTERM (or ``stop`` is set), then stop it cleanly.

    Prints the base URL and the token(s) (fake tokens the user chose, so printing them is fine).
    """
    out = out or sys.stdout
    stop = stop or threading.Event()
    svc = build_service(options).start()
    try:
        if options.traffic:
            for token in options.tokens:
                svc.start_traffic(
                    token,
                    rate_per_min=options.traffic_rate_per_min,
                    min_duration=options.traffic_min_duration,
                    max_duration=options.traffic_max_duration,
                    crash_ratio=options.traffic_crash_ratio,
                    max_active=options.traffic_max_active,
                )
        print(f"fake session hosting service: {svc.base_url}", file=out)
        for token in options.tokens:
            print(f"token: {token}", file=out)
        print(f"control API: {svc.base_url}/_fake/state (time scale {options.time_scale:g}x)", file=out)
        out.flush()
        restore = _install_signal_handlers(stop)
        try:
            stop.wait()
        finally:
            restore()
    finally:
        svc.stop()
    print("fake session hosting service stopped", file=out)


def _install_signal_handlers(stop: threading.Event) -> Callable[[], None]:
    """SIGINT/SIGTERM set ``stop`` (only possible from the main thread; elsewhere a no-op)."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def handler(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}

    def restore() -> None:
        for sig, old in previous.items():
            signal.signal(sig, old)

    return restore
