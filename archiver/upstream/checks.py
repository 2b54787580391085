"""Primitive coercions and range checks of upstream values: JSON decoding, 64-bit ints, valid UTF-8, strings.

Pure functions shared by the payload parsers of ``archiver.upstream.models``; each raises a
PayloadError that names the offending field.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import msgspec

from archiver.errors import PayloadError
from archiver.textsafe import valid_utf8

# --- primitive coercions ------------------------------------------------------------------------

#: Integers the state DB (SQLite INTEGER) and the exposition can hold: signed 64-bit.
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1

_msgspec_decode = msgspec.json.Decoder().decode


def loads_json(text: bytes | bytearray | str) -> Any:
    """json.loads semantics, msgspec speed: msgspec's C decoder is several times faster per small
    document (the labels strings of every entry); what it refuses but Python's json accepts (NaN, lone surrogates,
    1e400, a BOM) goes to json.loads, so the result never differs and errors are json's."""
    try:
        return _msgspec_decode(text)
    except (msgspec.DecodeError, UnicodeError):  # ValidationError is a DecodeError
        # UnicodeError also covers a str holding a lone surrogate, which msgspec cannot encode.
        return json.loads(text)


def decode_json(body: bytes | bytearray | str) -> Any:
    """JSON-decode a body, turning any failure into PayloadError."""
    try:
        return loads_json(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise PayloadError(f"body is not JSON ({exc.__class__.__name__})") from None


def require_mapping(value: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise PayloadError(f"{what} is {type_name(value)}, expected an object")
    return value


def type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def require_str(obj: Mapping[str, Any], key: str, what: str) -> str:
    value = obj.get(key)
    if isinstance(value, str):
        return value
    if value is None:
        raise PayloadError(f"{what} has no {key!r}")
    raise PayloadError(f"{what} field {key!r} is {type_name(value)}, expected a string")


def check_utf8(text: str, what: str, name: str) -> str:
    if not valid_utf8(text):
        raise PayloadError(f"{what} field {name!r} is not valid UTF-8 (a lone surrogate)")
    return text


def check_strings(values: Mapping[str, str], what: str, name: str) -> None:
    """Every key and value of a label mapping is valid UTF-8; the message names the field only."""
    if "".join(values).isascii() and "".join(values.values()).isascii():
        return  # the common case, tested in C
    for key, value in values.items():
        if not (valid_utf8(key) and valid_utf8(value)):
            raise PayloadError(f"{what} field {name!r} holds a key or value that is not valid UTF-8")


def checked_int(value: Any, what: str, name: str) -> int | None:
    """`as_int`, refusing what does not fit a signed 64-bit integer (1e30, "1e25")."""
    number = as_int(value)
    if number is not None and not INT64_MIN <= number <= INT64_MAX:
        raise out_of_int64(value, what, name)
    return number


def out_of_int64(value: Any, what: str, name: str) -> PayloadError:
    return PayloadError(f"{what} field {name!r} is out of the 64-bit integer range: {str(value)[:40]!r}")


def optional_str(obj: Mapping[str, Any], key: str) -> str:
    value = obj.get(key)
    if isinstance(value, str):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    return ""


def as_int(value: Any) -> int | None:
    """An int from an int, an integral float or a numeric string; None otherwise."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value) if value.is_integer() else None
    if isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            return None
        return int(number) if number.is_integer() else None
    return None


def maybe_json_object(value: Any) -> Any:
    """Decode a JSON-encoded string into its value when it holds an object; else return it as is."""
    if isinstance(value, str) and value[:1] == "{":
        try:
            return loads_json(value)
        except ValueError:
            return value
    return value


def unwrap(value: Any, key: str) -> Any:
    """`{"port": {...}}` → `{...}`: the service sometimes wraps a field in an object of its own name."""
    value = maybe_json_object(value)
    if isinstance(value, dict) and len(value) == 1 and key in value:
        return maybe_json_object(value[key])
    return value
