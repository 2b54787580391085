"""Deterministic stdout/stderr lines of a session and the wire shapes the log endpoints answer with."""

from __future__ import annotations

import functools
import json
import random
from collections.abc import Iterable, Sequence

from archiver.fake.content import seed_for

STDOUT = 1
STDERR = 2

LogLine = tuple[int, str]

#: Virtual seconds between two body lines while a session runs (what /logs?follow=true paces by).
LINE_INTERVAL = 2.0

DEFAULT_BODY_LINES = 120

#: Lines written before the first match line (visible as soon as a session exists).
BOOT_LINES = 4


def _stamp(t: float) -> str:
    minutes, seconds = divmod(t, 60.0)
    hours, minutes = divmod(int(minutes), 60)
    return f"[{hours:02d}:{minutes:02d}:{seconds:06.3f}]"


# Room for a fleet: every followed session's script is looked at each time it writes a line (a
# script costs ~0.4 ms to make and ~20 KB to keep; 5,000 followed sessions without a hit took a core).
@functools.lru_cache(maxsize=8192)
def _script(session_id: str, body_lines: int) -> tuple[tuple[LogLine, ...], float]:
    """Boot lines plus ``body_lines`` match lines, and the uptime after the last one."""
    rng = random.Random(seed_for(session_id, "logs"))
    players = [f"player-{rng.getrandbits(16):04x}" for _ in range(rng.randint(2, 8))]
    port = 7777
    t = 0.0
    out: list[LogLine] = []

    def emit(stream: int, level: str, text: str) -> None:
        out.append((stream, f"{_stamp(t)} {level:<5} {text}"))

    emit(STDOUT, "INFO", "demo server starting, build 5e1d0c2")
    t += 0.412
    emit(STDOUT, "INFO", f"loading map {rng.choice(['harbour', 'foundry', 'canyon', 'atrium'])}")
    t += 1.873
    emit(STDOUT, "INFO", f"listening on 0.0.0.0:{port}/udp")
    t += 0.02
    emit(STDOUT, "INFO", "server ready, waiting for players")
    joined: list[str] = []
    score = [0, 0]
    round_no = 1
    for _ in range(body_lines):
        t += rng.uniform(0.5, 4.0)
        roll = rng.random()
        if (roll < 0.15 or not joined) and len(joined) < len(players):
            name = players[len(joined)]
            joined.append(name)
            emit(STDOUT, "INFO", f"{name} joined (slot {len(joined)})")
        elif roll < 0.30:
            emit(STDOUT, "INFO", f"round {round_no} started")
        elif roll < 0.55:
            a, b = rng.sample(joined, 2) if len(joined) > 1 else (joined[0], "bot-1")
            emit(STDOUT, "INFO", f"kill: {a} -> {b} ({rng.choice(['rifle', 'smg', 'knife'])})")
        elif roll < 0.70:
            score[rng.randrange(2)] += 1
            emit(STDOUT, "INFO", f"round {round_no} ended, score {score[0]}-{score[1]}")
            round_no += 1
        elif roll < 0.85:
            emit(STDERR, "WARN", f"tick took {rng.randint(17, 60)}ms (budget 16ms)")
        elif roll < 0.95:
            emit(STDOUT, "DEBUG", f"snapshot delta {rng.randint(200, 4000)} bytes")
        else:
            emit(
                STDERR,
                "ERROR",
                f"packet from unknown peer 10.0.{rng.randint(0, 9)}.{rng.randint(1, 254)} dropped",
            )
    return tuple(out), t


def session_log(
    session_id: str, *, body_lines: int = DEFAULT_BODY_LINES, visible: int | None, ending: str | None
) -> list[LogLine]:
    """The session's log: boot lines, the first ``visible`` match lines (all when None), and the
    shutdown block for ``ending`` ``"exited"`` or the crash block (stderr stack trace) for ``"dead"``.

    A prefix of an active session's log is always a prefix of its final log.
    """
    script, t = _script(session_id, body_lines)
    shown = len(script) if visible is None else BOOT_LINES + max(0, min(visible, body_lines))
    lines = list(script[:shown])
    if ending is None:
        return lines
    rng = random.Random(seed_for(session_id, "logs-end"))
    t += rng.uniform(1.0, 3.0)
    if ending == "dead":
        lines.append((STDERR, f"{_stamp(t)} FATAL signal SIGSEGV (address 0x0000000000000018)"))
        lines.extend(
            (STDERR, frame)
            for frame in (
                "stack trace (most recent call first):",
                "  #0 0x00007f3a2c1d4e10 in GameLoop::tick() at game_loop.cpp:214",
                "  #1 0x00007f3a2c1d2b77 in World::step(float) at world.cpp:88",
                "  #2 0x00007f3a2c1c9a01 in Server::run() at server.cpp:412",
                "  #3 0x00007f3a2c1c0033 in main at main.cpp:37",
                "core dumped to /srv/crash/core.txt",
            )
        )
    else:
        lines.append((STDOUT, f"{_stamp(t)} INFO  received SIGTERM, shutting down"))
        lines.append((STDOUT, f"{_stamp(t + 0.2)} INFO  replay saved to /srv/replays/match.replay"))
        lines.append((STDOUT, f"{_stamp(t + 0.3)} INFO  shutdown complete"))
    return lines


def render_text(lines: Iterable[LogLine]) -> bytes:
    """Plain text: one line per entry, stdout and stderr interleaved in order."""
    texts = [line for _, line in lines]
    # One encode of the joined text: a 1 MB log in about a millisecond instead of six.
    return ("\n".join(texts) + "\n").encode("utf-8") if texts else b""


def render_ndjson(lines: Iterable[LogLine]) -> bytes:
    """One ``{"streamType": 1|2, "line": ...}`` object per line (1 stdout, 2 stderr)."""
    return b"".join(json.dumps({"streamType": stream, "line": line}).encode() + b"\n" for stream, line in lines)


def render_legacy(lines: Sequence[LogLine]) -> bytes:
    """The legacy ``{"line": {"1": {"lineKey": "1", "payload": "..."}, ...}}`` document."""
    doc = {"line": {str(i): {"lineKey": str(i), "payload": line} for i, (_, line) in enumerate(lines, 1)}}
    return json.dumps(doc).encode()
