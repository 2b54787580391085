"""The archive documents' JSON codec, declared once per field: each dataclass field names its JSON
shape in its metadata, and one canonical encoder and one strict decoder walk those declarations.

Adding a field to a manifest, item or index entry is one dataclass field with ``metadata=`` one of
the shapes below. A field written only when set (``omit``) keeps the bytes of every archive written
before it existed: the canonical bytes are what the archive's sha256s and create-once writes compare.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping
from dataclasses import dataclass, fields
from datetime import UTC, datetime
from typing import Any, Final, TypeVar, cast

from archiver.errors import ManifestError

#: The metadata key a field's Wire is stored under.
WIRE: Final = "archiver.wire"

T = TypeVar("T")


class Shape(enum.Enum):
    """What a field is in JSON (and what it reads back as)."""

    TEXT = "text"
    INTEGER = "integer"
    #: Epoch seconds (a JSON number, read as float) plus a sibling ``{name}_iso`` string for humans,
    #: ignored when reading.
    TIME = "time"
    #: An object of strings; absent or null reads as empty, and it is sorted by key.
    STR_MAP = "str_map"
    #: An object of integers; absent or null reads as empty, and it is sorted by key.
    INT_MAP = "int_map"
    #: An array of strings (a tuple); absent or null reads as empty.
    STR_LIST = "str_list"
    #: An array of objects of the Wire's ``element`` dataclass (a tuple); absent or null reads as empty.
    OBJECTS = "objects"


class Omit(enum.Enum):
    """When the encoder leaves a field out (fields added later: older documents keep their bytes)."""

    NEVER = "never"
    NONE = "none"
    EMPTY = "empty"


@dataclass(frozen=True, slots=True)
class Wire:
    """A field's JSON declaration."""

    shape: Shape
    #: Absent or null reads as None (else it is a "missing field" error); maps and lists are always optional.
    optional: bool = False
    omit: Omit = Omit.NEVER
    element: type | None = None


def wire(
    shape: Shape, *, optional: bool = False, omit: Omit = Omit.NEVER, element: type | None = None
) -> Mapping[str, Wire]:
    """The ``metadata=`` of a dataclass field declaring its JSON shape."""
    return {WIRE: Wire(shape, optional, omit, element)}


TEXT: Final = wire(Shape.TEXT)
OPT_TEXT: Final = wire(Shape.TEXT, optional=True)
#: Optional text written only when set.
NEW_TEXT: Final = wire(Shape.TEXT, optional=True, omit=Omit.NONE)
INTEGER: Final = wire(Shape.INTEGER)
OPT_INTEGER: Final = wire(Shape.INTEGER, optional=True)
TIME: Final = wire(Shape.TIME)
OPT_TIME: Final = wire(Shape.TIME, optional=True)
STR_MAP: Final = wire(Shape.STR_MAP)
#: A map of strings written only when not empty.
NEW_STR_MAP: Final = wire(Shape.STR_MAP, omit=Omit.EMPTY)
INT_MAP: Final = wire(Shape.INT_MAP)
STR_LIST: Final = wire(Shape.STR_LIST)


#: Per shape, the JSON type that is already the field's value (a TIME read as int becomes a float).
_EXACT: Final[dict[Shape, type]] = {Shape.TEXT: str, Shape.INTEGER: int, Shape.TIME: float}


#: Decoding reads nested objects, then lists, then the rest in declaration order: the order the
#: hand-written reader had, so a document with several faults is still reported by the same one.
_READ_FIRST: Final = {Shape.OBJECTS: 0, Shape.STR_LIST: 1}

#: (name, Wire, the JSON type already the field's value as it is: the common case, checked first).
_Plan = tuple[tuple[str, Wire, type | None], ...]
#: Per document dataclass: its fields in declaration order (writing) and in reading order.
_PLANS: dict[type, tuple[_Plan, _Plan]] = {}


def _plans(cls: type) -> tuple[_Plan, _Plan]:
    """The (name, Wire, exact type) of every field of a document dataclass, to write and to read (computed once)."""
    plans = _PLANS.get(cls)
    if plans is None:
        found = []
        for f in fields(cast(Any, cls)):
            spec = f.metadata.get(WIRE)
            if not isinstance(spec, Wire):
                raise TypeError(f"{cls.__name__}.{f.name} declares no JSON shape (metadata={{WIRE: Wire(...)}})")
            found.append((f.name, spec, _EXACT.get(spec.shape)))
        reading = sorted(found, key=lambda entry: _READ_FIRST.get(entry[1].shape, 2))
        plans = _PLANS[cls] = (tuple(found), tuple(reading))
    return plans


def iso_utc(epoch_seconds: float | None) -> str | None:
    """``2024-05-01T12:00:00.000Z`` for an epoch-seconds time (``None`` stays ``None``)."""
    if epoch_seconds is None:
        return None
    stamp = datetime.fromtimestamp(epoch_seconds, UTC).isoformat(timespec="milliseconds")
    return stamp.replace("+00:00", "Z")


def to_doc(obj: object) -> dict[str, Any]:
    """The JSON object of a document dataclass (keys in any order: `to_bytes` sorts them)."""
    doc: dict[str, Any] = {}
    for name, spec, _exact in _plans(type(obj))[0]:
        value = getattr(obj, name)
        if (spec.omit is Omit.NONE and value is None) or (spec.omit is Omit.EMPTY and not value):
            continue
        if spec.shape is Shape.TIME:
            doc[name] = value
            doc[f"{name}_iso"] = iso_utc(value)
        elif spec.shape in (Shape.STR_MAP, Shape.INT_MAP):
            doc[name] = dict(value)
        elif spec.shape is Shape.STR_LIST:
            doc[name] = list(value)
        elif spec.shape is Shape.OBJECTS:
            doc[name] = [to_doc(item) for item in value]
        else:
            doc[name] = value
    return doc


def to_bytes(obj: object) -> bytes:
    """Canonical UTF-8 JSON of a document dataclass (sorted keys, 2-space indent, newline at the end)."""
    # ensure_ascii keeps the bytes valid UTF-8 even for ids with lone surrogates; sort_keys and a
    # fixed indent make the encoding canonical (same document → same bytes → same sha256).
    text = json.dumps(to_doc(obj), sort_keys=True, indent=2, ensure_ascii=True, allow_nan=False)
    return (text + "\n").encode("ascii")


class _Reader:
    """Typed field access on a decoded JSON object; every complaint is a ManifestError naming the field."""

    def __init__(self, doc: Mapping[str, Any], where: str, body: bytes) -> None:
        self.doc = doc
        self.where = where
        self.body = body

    def fail(self, message: str) -> ManifestError:
        return ManifestError(f"{self.where}: {message}", body=self.body)

    def get(self, name: str, types: tuple[type, ...], optional: bool) -> Any:
        if name not in self.doc:
            if optional:
                return None
            raise self.fail(f"missing field {name!r}")
        value = self.doc[name]
        if value is None and optional:
            return None
        # bool is an int subclass: never accept true/false as a number.
        if (isinstance(value, bool) and bool not in types) or not isinstance(value, types):
            raise self.fail(f"field {name!r} has the wrong type ({type(value).__name__})")
        return value

    def read(self, name: str, spec: Wire, exact: type | None) -> Any:
        value = self.doc.get(name)
        if type(value) is exact:
            return value
        shape = spec.shape
        if shape is Shape.TEXT:
            return self.get(name, (str,), spec.optional)
        if shape is Shape.INTEGER:
            return self.get(name, (int,), spec.optional)
        if shape is Shape.TIME:
            value = self.get(name, (int, float), spec.optional)
            return None if value is None else float(value)
        if shape is Shape.STR_MAP:
            mapping = self.get(name, (dict,), True) or {}
            if not all(isinstance(v, str) for v in mapping.values()):
                raise self.fail(f"field {name!r} must map strings to strings")
            return dict(sorted(mapping.items()))
        if shape is Shape.INT_MAP:
            mapping = self.get(name, (dict,), True) or {}
            if not all(isinstance(v, int) and not isinstance(v, bool) for v in mapping.values()):
                raise self.fail(f"field {name!r} must map strings to integers")
            return dict(sorted(mapping.items()))
        array: list[Any] = self.get(name, (list,), True) or []
        if shape is Shape.STR_LIST:
            if not all(isinstance(v, str) for v in array):
                raise self.fail(f"field {name!r} must be a list of strings")
            return tuple(array)
        assert spec.element is not None, f"{name}: OBJECTS needs its element dataclass"
        items: list[Any] = []
        for n, raw in enumerate(array):
            if not isinstance(raw, dict):
                raise self.fail(f"{name}[{n}] is not an object")
            items.append(_from_doc(spec.element, _Reader(raw, f"{self.where} {name}[{n}]", self.body)))
        return tuple(items)


def _from_doc(cls: type[T], reader: _Reader) -> T:
    values = {name: reader.read(name, spec, exact) for name, spec, exact in _plans(cls)[1]}
    try:
        return cls(**values)
    except ValueError as exc:  # the dataclass's own validation
        raise reader.fail(str(exc)) from None


def from_bytes(cls: type[T], data: bytes, what: str, *, schema_version: int) -> T:
    """The document of dataclass ``cls`` in ``data``; ``ManifestError`` (naming ``what`` and the field,
    with a short excerpt) for anything else. Unknown fields are ignored."""
    try:
        doc = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # not UTF-8, not JSON, a 5000-digit number, nesting too deep
        raise ManifestError(f"{what} is not UTF-8 JSON ({type(exc).__name__})", body=data) from None
    if not isinstance(doc, dict):
        raise ManifestError(f"{what} is not a JSON object", body=data)
    reader = _Reader(doc, what, data)
    version = reader.get("schema_version", (int,), False)
    if version != schema_version:
        raise reader.fail(f"unsupported schema_version {version} (this archiver reads {schema_version})")
    return _from_doc(cls, reader)
