"""Request bodies declared once: from one declaration come the route's validator and the OpenAPI schema.

A :class:`Body` is a tuple of :class:`Field` s, each with its JSON type, whether it is required, its bounds,
choices or pattern, and a description::

    COMMAND_REQUEST = Body("CommandRequest", (
        Field("kind", "string", required=True, choices=COMMAND_KINDS, description="what the job should do"),
        Field("reason", "string", max_length=256, default="", description="why (in the audit log)"),
    ))
    COMMAND_REQUEST.read({"kind": "stop"})   # {"kind": "stop", "reason": ""}
    COMMAND_REQUEST.schema()                 # {"type": "object", "properties": {...}, "required": ["kind"]}

``read`` checks a decoded JSON body and returns every declared field's value (the default where it is
absent or null; numbers as floats, times as Unix seconds), or raises :class:`BodyError` naming the field
at fault with a sentence that says what it must be. The server's bodies are declared in
:mod:`..api.bodies` (a policy's in :mod:`..policies.model`). The report and the Kubeflow status are not
declared here: they are the wire format, :mod:`stepwatch.protocol`'s, stdlib only.

Here among the shapes of the wire, below the policies and the API that both declare bodies with it (a
request's shape as :mod:`.serialisers` are an answer's); it uses only the protocol.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from ...protocol import ProtocolError

__all__ = ["Body", "BodyError", "Field", "FieldType"]

FieldType = Literal["string", "integer", "number", "boolean", "array", "object", "time"]
"""JSON types, and ``time``: Unix seconds or an RFC 3339 string with a zone, read as Unix seconds."""

_PRINTABLE = "^[^\\x00-\\x1f\\x7f-\\x9f]*$"
"""The schema's reading of ``str.isprintable`` (control characters refused; the server also refuses the
few other unprintable ones, such as separators, that JSON Schema patterns cannot name portably)."""


_LATEST = 1e11
"""The latest time a ``time`` field takes in Unix seconds (about the year 5100): later is a mistake, and
beyond a float it could not be read."""


class BodyError(ValueError):
    """A body that does not follow its declaration: ``field`` is the path of the culprit (``""``: the body
    itself; ``policy.on.stalled``, ``namespaces[0]``), ``message`` what it must be."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field or 'the body'} {message}")
        self.field = field
        self.message = message


@dataclass(frozen=True, kw_only=True)
class Field:
    """One field of a body: its type and every rule on its value. Optional fields accept ``null`` as absent."""

    key: str
    type: FieldType
    description: str = ""
    required: bool = False
    default: Any = None
    """The value of an absent (or null) optional field."""
    minimum: float | None = None
    above: float | None = None
    """An exclusive minimum."""
    maximum: float | None = None
    min_length: int = 0
    max_length: int | None = None
    printable: bool = False
    pattern: str | None = None
    """A regular expression the whole string must match (the same in Python and in JSON Schema)."""
    choices: tuple[str, ...] = ()
    items: Field | None = None
    """An array's items (their ``key`` is not used)."""
    min_items: int = 0
    max_items: int | None = None
    body: Body | None = None
    """An object's declared fields; without it, an object of anything."""
    max_properties: int | None = None
    check: Callable[[Any], Any] | None = None
    """A rule JSON Schema cannot say, run once the declared ones passed: the protocol's own validator of
    the value (``ProtocolError`` names the culprit); its result is the field's value. Say it in ``description``."""
    what: str = ""
    """What the value must be, in words, when the words made from the rules would not be clear."""
    example: Any = None

    def __post_init__(self) -> None:
        if self.type in ("integer", "number") and self.maximum is None:
            # the stores' integers and float arithmetic have one: beyond it a value was a 500, not a 422
            raise ValueError(f"{self.key}: a number needs a maximum")

    # --------------------------------------------------------------------------------- validation

    def read(self, value: Any, path: str) -> Any:
        """``value`` (not null) checked against the rules; ``BodyError`` at ``path`` when it breaks one."""
        out = _READERS[self.type](self, value, path)
        if self.check is None:
            return out
        try:
            return self.check(out)
        except ProtocolError as exc:  # the protocol names the field from the top of its own message
            where = path + exc.field[len(self.key) :] if exc.field.startswith(self.key) else path
            raise BodyError(where, exc.message) from None

    def describe(self) -> str:
        """What the value must be, in words (the error messages say it)."""
        if self.what:
            return self.what
        if self.type == "boolean":
            return "true or false"
        if self.type == "integer":
            return "an integer" + (f" >= {_number(self.minimum)}" if self.minimum is not None else "")
        if self.type == "number":
            if self.above is not None:
                return f"a finite number above {_number(self.above)}"
            return "a finite number" + (f" >= {_number(self.minimum)}" if self.minimum is not None else "")
        if self.type == "string":
            if self.choices:
                return f"one of {', '.join(self.choices)}"
            kind = " printable" if self.printable else ""
            if self.max_length is None:
                return "a string"
            if self.min_length:
                return f"a string of {self.min_length}-{self.max_length}{kind} characters"
            return f"a string of at most {self.max_length}{kind} characters"
        if self.type == "time":
            return "a time: Unix seconds, or RFC 3339 with a zone (Z or +01:00)"
        if self.type == "array":
            return f"a list of {self.items.describe()}" if self.items is not None else "a list"
        return "a JSON object"

    def _wrong(self, path: str, value: Any) -> BodyError:
        return BodyError(path, f"must be {self.describe()}, got {_shown(value)}")

    # ------------------------------------------------------------------------------------ schema

    def schema(self) -> dict[str, Any]:
        """The field's JSON Schema (OpenAPI 3.1)."""
        out = _SCHEMAS[self.type](self)
        if not self.required and self.key:
            out = _nullable(out)
        if self.description:
            out["description"] = self.description
        if self.default is not None:
            out["default"] = self.default
        if self.example is not None:
            out["examples"] = [self.example]
        return out


@dataclass(frozen=True)
class Body:
    """A JSON object of declared fields: a request body, or an object inside one."""

    name: str
    """Its name among the OpenAPI components (``""``: an object shown where it is used)."""
    fields: tuple[Field, ...]
    description: str = ""
    closed: bool = False
    """Unknown keys are refused (else they are ignored, so that older servers take newer clients' bodies)."""

    def read(self, data: Any, path: str = "") -> dict[str, Any]:
        """Every declared field's value from ``data`` (absent or null: the default); ``BodyError`` naming the
        first field at fault: unknown keys first (a closed body), then the fields in declared order."""
        if not isinstance(data, dict):
            raise BodyError(path, f"must be a JSON object, got {_shown(data)}")
        if self.closed:
            known = {f.key for f in self.fields}
            unknown = [key for key in data if key not in known]
            if unknown:
                where = _join(path, str(unknown[0]))
                raise BodyError(where, f"is not a field here; the fields are {', '.join(f.key for f in self.fields)}")
        out: dict[str, Any] = {}
        for field in self.fields:
            where = _join(path, field.key)
            value = data.get(field.key)
            if value is None:
                if field.required:
                    raise BodyError(where, f"is required: {field.describe()}")
                out[field.key] = field.default
            else:
                out[field.key] = field.read(value, where)
        return out

    def schema(self) -> dict[str, Any]:
        """The body's JSON Schema (OpenAPI 3.1)."""
        out: dict[str, Any] = {"type": "object"}
        if self.description:
            out["description"] = self.description
        out["properties"] = {f.key: f.schema() for f in self.fields}
        required = [f.key for f in self.fields if f.required]
        if required:
            out["required"] = required
        if self.closed:
            out["additionalProperties"] = False
        return out

    def ref(self) -> dict[str, Any]:
        """Where OpenAPI's components hold it; the whole schema for a body without a name."""
        return {"$ref": f"#/components/schemas/{self.name}"} if self.name else self.schema()


# ------------------------------------------------------------------------------------- readers


def _read_boolean(field: Field, value: Any, path: str) -> bool:
    if not isinstance(value, bool):
        raise field._wrong(path, value)
    return value


def _read_integer(field: Field, value: Any, path: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise field._wrong(path, value)
    return int(_bounded(field, value, path))


def _read_number(field: Field, value: Any, path: str) -> float:
    # the chained comparison is False for NaN and the infinities, and exact for integers of any size
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not -math.inf < value < math.inf:
        raise field._wrong(path, value)
    return float(_bounded(field, value, path))


def _bounded(field: Field, value: float, path: str) -> float:
    """``value`` within the field's bounds (compared exactly, before any conversion: an integer too large
    for a float is refused here, not an ``OverflowError`` later)."""
    if (field.minimum is not None and value < field.minimum) or (field.above is not None and value <= field.above):
        raise field._wrong(path, value)
    if field.maximum is not None and value > field.maximum:
        raise BodyError(path, f"must be at most {_number(field.maximum)}, got {_shown(value)}")
    return value


def _read_string(field: Field, value: Any, path: str) -> str:
    if (
        not isinstance(value, str)
        or (field.choices and value not in field.choices)
        or len(value) < field.min_length
        or (field.max_length is not None and len(value) > field.max_length)
        or (field.printable and not value.isprintable())
        or (field.pattern is not None and not re.fullmatch(field.pattern, value))
    ):
        raise field._wrong(path, value)
    return value


def _read_time(field: Field, value: Any, path: str) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if not 0 < value <= _LATEST:
            raise field._wrong(path, value)
        return float(value)
    if isinstance(value, str):
        try:
            when = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            raise field._wrong(path, value) from None
        if when.tzinfo is not None:
            return when.timestamp()
    raise field._wrong(path, value)


def _read_array(field: Field, value: Any, path: str) -> list[Any]:
    if not isinstance(value, list):
        raise field._wrong(path, value)
    if len(value) < field.min_items:
        raise BodyError(path, f"must have at least {field.min_items} item(s): {field.describe()}")
    if field.max_items is not None and len(value) > field.max_items:
        raise BodyError(path, f"must have at most {field.max_items} items, got {len(value)}")
    if field.items is None:
        return value
    return [field.items.read(item, f"{path}[{i}]") for i, item in enumerate(value)]


def _read_object(field: Field, value: Any, path: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise field._wrong(path, value)
    if field.max_properties is not None and len(value) > field.max_properties:
        raise BodyError(path, f"must have at most {field.max_properties} keys, got {len(value)}")
    return field.body.read(value, path) if field.body is not None else value


_READERS: dict[str, Callable[[Field, Any, str], Any]] = {
    "boolean": _read_boolean,
    "integer": _read_integer,
    "number": _read_number,
    "string": _read_string,
    "time": _read_time,
    "array": _read_array,
    "object": _read_object,
}


# ------------------------------------------------------------------------------------- schemas


def _schema_number(field: Field) -> dict[str, Any]:
    out: dict[str, Any] = {"type": field.type}
    for key, bound in (("minimum", field.minimum), ("exclusiveMinimum", field.above), ("maximum", field.maximum)):
        if bound is not None:
            out[key] = bound
    return out


def _schema_string(field: Field) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "string"}
    if field.choices:
        out["enum"] = list(field.choices)
    if field.min_length:
        out["minLength"] = field.min_length
    if field.max_length is not None:
        out["maxLength"] = field.max_length
    if field.pattern is not None:
        out["pattern"] = f"^(?:{field.pattern})$"
    elif field.printable:
        out["pattern"] = _PRINTABLE
    return out


def _schema_array(field: Field) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "array"}
    if field.items is not None:
        out["items"] = field.items.schema()
    if field.min_items:
        out["minItems"] = field.min_items
    if field.max_items is not None:
        out["maxItems"] = field.max_items
    return out


def _schema_object(field: Field) -> dict[str, Any]:
    if field.body is not None:
        return field.body.ref()
    out: dict[str, Any] = {"type": "object"}
    if field.max_properties is not None:
        out["maxProperties"] = field.max_properties
    return out


_SCHEMAS: dict[str, Callable[[Field], dict[str, Any]]] = {
    "boolean": lambda field: {"type": "boolean"},
    "integer": _schema_number,
    "number": _schema_number,
    "string": _schema_string,
    "time": lambda field: {
        "oneOf": [
            {"type": "number", "exclusiveMinimum": 0, "maximum": _LATEST},
            {"type": "string", "format": "date-time"},
        ]
    },
    "array": _schema_array,
    "object": _schema_object,
}


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema``, or null (an optional field's way of saying "not given")."""
    kind = schema.get("type")
    if isinstance(kind, str):
        out = {**schema, "type": [kind, "null"]}
        if "enum" in out:
            out["enum"] = [*out["enum"], None]
        return out
    return {"anyOf": [schema, {"type": "null"}]}


# ------------------------------------------------------------------------------------- words


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _number(value: float) -> str:
    if isinstance(value, int):
        return str(value)
    return str(int(value)) if value.is_integer() and abs(value) < 1e15 else f"{value:g}"


def _shown(value: Any) -> str:
    """A value in a message: a container by its type, anything else as written (cut short)."""
    if isinstance(value, (dict, list)):
        return type(value).__name__
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
