"""Structured logging for the daemon: text or JSON lines, and a last-resort redaction of known secrets."""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

#: Attributes every LogRecord has; anything else passed via `extra=` is emitted as a field.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None)).keys()) | {"message", "asctime"}


class Redactor(logging.Formatter):
    """Wraps a formatter and replaces known secrets in every line it produces: message, extra
    fields and tracebacks alike. Defence in depth: no code path is meant to log a secret, but an
    upstream echoing the token in an error must still not reach a log."""

    def __init__(self, inner: logging.Formatter, secrets: Iterable[str] | Callable[[], Sequence[str]] = ()) -> None:
        super().__init__()
        self._inner = inner
        # A callable is asked on every line (a rotated token file adds a value); a fixed list once.
        self._source = secrets if callable(secrets) else (lambda fixed=tuple(secrets): fixed)
        self._seen: Sequence[str] | None = None
        self._forms: tuple[str, ...] = ()

    def _current_forms(self) -> tuple[str, ...]:
        secrets = self._source()
        if secrets != self._seen:
            forms: set[str] = set()
            for secret in secrets:
                if len(secret) >= 4:
                    forms.add(secret)
                    forms.add(json.dumps(secret, ensure_ascii=False)[1:-1])  # as it appears inside JSON
            self._forms = tuple(sorted(forms, key=len, reverse=True))
            self._seen = secrets
        return self._forms

    def format(self, record: logging.LogRecord) -> str:
        line = self._inner.format(record)
        for form in self._current_forms():
            line = line.replace(form, "***")
        return line


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in vars(record).items() if k not in _STANDARD and not k.startswith("_")}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        entry.update(_fields(record))
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        extras = " ".join(f"{k}={v}" for k, v in _fields(record).items())
        line = f"{stamp} {record.levelname.lower():7} {record.name}: {record.getMessage()}"
        if extras:
            line += " " + extras
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def configure(
    fmt: str = "text",
    level: str = "info",
    secrets: Iterable[str] | Callable[[], Sequence[str]] = (),
    stream: Any = None,
) -> None:
    """Install one handler on the root logger (idempotent: replaces a previous one of ours)."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(Redactor(JsonFormatter() if fmt == "json" else TextFormatter(), secrets))
    handler.set_name("archiver")
    root = logging.getLogger()
    for old in [h for h in root.handlers if h.get_name() == "archiver"]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    # Third-party chatter (botocore, httpx per-request lines) stays out unless debugging.
    for noisy in ("botocore", "boto3", "urllib3", "httpx", "httpcore", "s3transfer"):
        logging.getLogger(noisy).setLevel(logging.WARNING if level != "debug" else logging.DEBUG)
