"""Structured logging for the daemon: logfmt or JSON lines, and a last-resort redaction of known secrets.

Level names are the exporter conventions' (promslog): ``debug``, ``info``, ``warn``, ``error``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
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


#: Level names as the exporter conventions spell them (Python's WARNING is ``warn``).
_LEVEL_NAMES = {"WARNING": "warn", "CRITICAL": "error"}


def level_name(record: logging.LogRecord) -> str:
    return _LEVEL_NAMES.get(record.levelname, record.levelname.lower())


def _timestamp(record: logging.LogRecord) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z"


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": _timestamp(record),
            "level": level_name(record),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        entry.update(_fields(record))
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str, ensure_ascii=False)


def _logfmt_value(value: object) -> str:
    text = value if isinstance(value, str) else str(value)
    if text and all(ch > " " and ch not in '="\\' and ch.isprintable() for ch in text):
        return text
    # Quoted as a JSON string: the escapes logfmt readers take, and the form Redactor looks for.
    return json.dumps(text, ensure_ascii=False)


class LogfmtFormatter(logging.Formatter):
    """``ts=… level=… logger=… msg="…" key=value …`` on one line (a traceback as one quoted ``exc``)."""

    def format(self, record: logging.LogRecord) -> str:
        pairs = [("ts", _timestamp(record)), ("level", level_name(record)), ("logger", record.name)]
        pairs += [("msg", record.getMessage()), *_fields(record).items()]
        if record.exc_info:
            pairs.append(("exc", self.formatException(record.exc_info)))
        return " ".join(f"{key}={_logfmt_value(value)}" for key, value in pairs)


def configure(
    fmt: str = "logfmt",
    level: str = "info",
    secrets: Iterable[str] | Callable[[], Sequence[str]] = (),
    stream: Any = None,
    early: Iterable[logging.LogRecord] = (),
) -> None:
    """Install one handler on the root logger (idempotent: replaces a previous one of ours).

    ``fmt`` is ``logfmt`` or ``json`` (``text`` is logfmt); ``level`` ``debug``, ``info``, ``warn``
    (``warning``) or ``error``. ``early``: records kept by :func:`held` before the format was known,
    written now (those of the level or above).
    """
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(Redactor(JsonFormatter() if fmt == "json" else LogfmtFormatter(), secrets))
    handler.set_name("archiver")
    root = logging.getLogger()
    for old in [h for h in root.handlers if h.get_name() == "archiver"]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(logging.WARNING if level in ("warn", "warning") else level.upper())
    # Third-party chatter (botocore, httpx per-request lines) stays out unless debugging.
    for noisy in ("botocore", "boto3", "urllib3", "httpx", "httpcore", "s3transfer"):
        logging.getLogger(noisy).setLevel(logging.WARNING if level != "debug" else logging.DEBUG)
    for record in early:
        logger = logging.getLogger(record.name)
        if logger.isEnabledFor(record.levelno):
            logger.handle(record)


class _Keep(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextlib.contextmanager
def held(name: str) -> Iterator[list[logging.LogRecord]]:
    """The records logger ``name`` emits inside the block, kept rather than written: reading the
    configuration (which names the log format) warns before logging can be configured."""
    logger = logging.getLogger(name)
    keep = _Keep()
    records = keep.records
    propagate = logger.propagate
    logger.addHandler(keep)
    logger.propagate = False
    try:
        yield records
    finally:
        logger.removeHandler(keep)
        logger.propagate = propagate
