"""Parsers of configuration values (durations, sizes, listen addresses) and the converters an
option's raw value (a flag's or env var's string, a TOML value) goes through: each returns the
typed value or raises ValueError saying what was expected (the caller adds where the value came from)."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final

from archiver.config import inputs

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
#: The longest duration accepted (ten years): anything longer is a typo, and would overflow the
#: datetime and timeout arithmetic far from where it was given.
MAX_DURATION: Final = 3650 * 86400.0
#: The most parallel fetch or upload workers (one thread each) accepted.
MAX_WORKERS: Final = 256
#: The largest size or count accepted (2**53: exact as a float, far inside SQLite's 64-bit integers).
MAX_COUNT: Final = 2**53
#: `--upload-workers auto` is stored as 0; the pipeline sizes it to the store (`auto_upload_workers`).
AUTO_WORKERS: Final = 0


def _bounded_duration(seconds: float, value: object, limit: float) -> float:
    if seconds > limit:
        raise ValueError(f"duration too long (at most {int(limit // 86400)}d): {value!r}")
    return seconds


def parse_duration(value: str | float | int, *, limit: float = MAX_DURATION) -> float:
    """Seconds from `90`, `90s`, `10m`, `4h`, `2h30m`, `1d` (a plain number is seconds), at most
    `limit` (a setting's bound; the retrieval commands bound the time it leads to instead)."""
    if isinstance(value, bool):
        raise ValueError(f"not a duration: {value!r}")
    if isinstance(value, int | float):
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"not a duration: {value!r}")
        return _bounded_duration(float(value), value, limit)
    text = value.strip().lower()
    try:
        seconds = float(text)
    except ValueError:
        pos, total = 0, 0.0
        for match in _DURATION.finditer(text):
            if match.start() != pos:
                break
            total += float(match.group(1)) * _UNITS[match.group(2)]
            pos = match.end()
        if pos != len(text) or not text:
            raise ValueError(f"not a duration (use e.g. 30s, 10m, 4h, 2h30m): {value!r}") from None
        return _bounded_duration(total, value, limit)
    if not math.isfinite(seconds) or seconds < 0:  # float() accepts "nan" and "inf"
        raise ValueError(f"not a duration (use e.g. 30s, 10m, 4h, 2h30m): {value!r}")
    return _bounded_duration(seconds, value, limit)


def parse_listen(value: str) -> tuple[str, int]:
    """`HOST:PORT`, `:PORT` (all interfaces) or `[::1]:PORT`."""
    text = value.strip()
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"expected HOST:PORT, got {value!r}")
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port)


def parse_size(value: str | int) -> int:
    """Bytes from `1048576`, `100MB`, `100MiB`, `2GiB`."""
    if isinstance(value, int) and not isinstance(value, bool):
        return _bounded_count(value, value)
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]i?b?|b)?\s*", str(value).lower())
    if not match:
        raise ValueError(f"not a size (use e.g. 100MB, 512MiB): {value!r}")
    number, unit = float(match.group(1)), (match.group(2) or "b")
    base = 1024 if "i" in unit else 1000
    power = "bkmgt".index(unit[0])
    total = number * base**power
    if not math.isfinite(total) or total > MAX_COUNT:
        raise ValueError(f"size too large (at most {MAX_COUNT} bytes): {value!r}")
    return int(total)


def _bounded_count(number: int, value: object) -> int:
    if not 0 <= number <= MAX_COUNT:
        raise ValueError(f"out of range (0 to {MAX_COUNT}): {value!r}")
    return number


# --- converters: an option's raw value → its typed value ----------------------------------------


def as_list(value: Any) -> tuple[str, ...]:
    """A list from a TOML array, a repeated flag, or a comma-separated env var."""
    if value is None:
        return ()
    if isinstance(value, str):
        return tuple(part.strip() for part in value.split(",") if part.strip())
    if isinstance(value, list | tuple):
        items: list[str] = []
        for item in value:
            if not isinstance(item, str):
                raise ValueError(f"expected strings, got {item!r}")
            items.extend(as_list(item))  # a repeated flag may itself be comma-separated
        return tuple(items)
    raise ValueError(f"expected a list of strings, got {value!r}")


def as_items(value: Any) -> tuple[str, ...]:
    """A list from a TOML array or a repeated flag, each item whole (items that may hold commas,
    such as a fault spec); a single string (an env var) is one item."""
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,) if value.strip() else ()
    if isinstance(value, list | tuple) and all(isinstance(item, str) for item in value):
        return tuple(item for item in value if item.strip())
    raise ValueError(f"expected a list of strings, got {value!r}")


def as_float(value: Any) -> float:
    """A finite number (an int or float of the file, or a flag's or env var's text)."""
    if isinstance(value, bool):
        raise ValueError(f"expected a number, got {value!r}")
    try:
        number = float(value.strip()) if isinstance(value, str) and len(value) <= 40 else float(value)
    except (TypeError, ValueError):
        raise ValueError(f"expected a number, got {value!r}") from None
    if not math.isfinite(number):
        raise ValueError(f"expected a finite number, got {value!r}")
    return number


def as_int(value: Any) -> int:
    if isinstance(value, bool):
        raise ValueError(f"expected an integer, got {value!r}")
    if isinstance(value, int):
        number = value
    elif isinstance(value, str) and value.strip().lstrip("-").isdigit() and len(value.strip()) <= 30:
        try:
            number = int(value.strip())
        except ValueError:  # "--5", "²": isdigit() says yes, int() does not
            raise ValueError(f"expected an integer, got {value!r}") from None
    else:
        raise ValueError(f"expected an integer, got {value!r}")
    if abs(number) > MAX_COUNT:
        raise ValueError(f"integer out of range: {value!r}")
    return number


_TRUE = frozenset({"true", "1", "yes", "on"})
_FALSE = frozenset({"false", "0", "no", "off"})


def as_bool(value: Any) -> bool:
    """An on/off option: a TOML boolean, or true/false, 1/0, yes/no, on/off (a flag's or env var's text)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    raise ValueError(f"expected true or false, got {value!r}")


def as_workers(value: Any) -> int:
    """A worker count, or `auto` (AUTO_WORKERS)."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        return AUTO_WORKERS
    count = as_int(value)
    if count < 1:
        raise ValueError(f"expected `auto` or an integer of at least 1, got {value!r}")
    return count


def as_str(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"expected a string, got {value!r}")
    return value


def as_path(value: Any) -> Path:
    """A local path the OS can take (``inputs.local_path``: not empty, no NUL, not too long), and text:
    the state DB records the paths below the state dir as UTF-8 (an undecodable byte would fail there)."""
    return inputs.local_path(as_str(value), text=True)


def as_optional_path(value: Any) -> Path | None:
    """A path; an empty string is none."""
    text = as_str(value)
    return inputs.local_path(text) if text else None


def as_listen(value: Any) -> tuple[str, int]:
    return parse_listen(as_str(value))


def as_choice(*choices: str, synonyms: Mapping[str, str] | None = None) -> Callable[[Any], str]:
    """One of ``choices``; a key of ``synonyms`` (a former spelling, not listed in errors) means its value."""

    def convert(value: Any) -> str:
        if synonyms and isinstance(value, str) and value in synonyms:
            return synonyms[value]
        if value not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}, got {value!r}")
        return str(value)

    return convert


def as_url(value: Any) -> str:
    text = as_str(value).strip()
    if not re.match(r"^https?://[^/\s]+", text):
        raise ValueError(f"expected an http(s):// URL, got {text!r}")
    return text.rstrip("/")


def as_store_url(value: Any) -> str:
    text = as_str(value).strip()
    if not (text.startswith("s3://") or text.startswith("file://")):
        raise ValueError(f"expected s3://bucket/prefix or file:///dir, got {text!r}")
    return text


def as_shard_index(value: Any) -> int | str:
    """A shard index (0, 1, ...) or `auto` (from the StatefulSet pod name)."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    try:
        index = as_int(value)
    except ValueError:
        index = -1
    if index < 0:
        raise ValueError(f"expected a shard index (0, 1, ...) or auto, got {value!r}")
    return index


def positive(convert: Callable[[Any], float]) -> Callable[[Any], float]:
    """`convert`, refusing zero and below."""

    def wrapped(value: Any) -> float:
        result = convert(value)
        if result <= 0:
            raise ValueError(f"must be greater than zero, got {value!r}")
        return result

    return wrapped
