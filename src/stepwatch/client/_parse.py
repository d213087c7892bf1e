"""Reading the server's JSON: typed fields or :class:`InvalidResponse` naming the field that is wrong."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ._errors import InvalidResponse

__all__ = ["as_dict", "as_list", "opt_bool", "opt_float", "opt_int", "opt_str", "req_int", "req_str", "sub", "to_float"]

_NONFINITE = {
    "NaN": math.nan,
    "Infinity": math.inf,  # the server's spelling (protocol.encode_float)
    "-Infinity": -math.inf,
    "nan": math.nan,
    "Inf": math.inf,  # Kubeflow's (trainerStatus metric strings)
    "inf": math.inf,
    "-Inf": -math.inf,
    "-inf": -math.inf,
}


def _wrong(where: str, key: str, expected: str, value: object) -> InvalidResponse:
    shown = repr(value)
    if len(shown) > 60:
        shown = shown[:57] + "..."
    return InvalidResponse(f"the server's answer is malformed: {where}.{key} should be {expected}, got {shown}")


def as_dict(value: object, where: str) -> dict[str, Any]:
    """``value`` as a JSON object."""
    if not isinstance(value, dict):
        raise InvalidResponse(
            f"the server's answer is malformed: {where} should be an object, got {type(value).__name__}"
        )
    return value


def as_list(value: object, where: str) -> list[Any]:
    """``value`` as a JSON array."""
    if not isinstance(value, list):
        raise InvalidResponse(
            f"the server's answer is malformed: {where} should be an array, got {type(value).__name__}"
        )
    return value


def sub(obj: Mapping[str, Any], key: str, where: str) -> Mapping[str, Any]:
    """A nested object (an absent or null one reads as empty)."""
    value = obj.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _wrong(where, key, "an object", value)
    return value


def to_float(value: object, where: str, key: str) -> float | None:
    """A number of the API: JSON numbers, and ``"NaN"``/``"Inf"``/``"-Inf"`` for the non-finite ones."""
    if value is None:
        return None
    if isinstance(value, float):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str) and value in _NONFINITE:
        return _NONFINITE[value]
    raise _wrong(where, key, "a number", value)


def opt_float(obj: Mapping[str, Any], key: str, where: str) -> float | None:
    """An optional number."""
    return to_float(obj.get(key), where, key)


def opt_int(obj: Mapping[str, Any], key: str, where: str) -> int | None:
    """An optional integer."""
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    raise _wrong(where, key, "an integer", value)


def req_int(obj: Mapping[str, Any], key: str, where: str) -> int:
    """A required integer."""
    value = opt_int(obj, key, where)
    if value is None:
        raise _wrong(where, key, "an integer", None)
    return value


def opt_str(obj: Mapping[str, Any], key: str, where: str) -> str | None:
    """An optional string."""
    value = obj.get(key)
    if value is None or isinstance(value, str):
        return value
    raise _wrong(where, key, "a string", value)


def req_str(obj: Mapping[str, Any], key: str, where: str) -> str:
    """A required string."""
    value = obj.get(key)
    if not isinstance(value, str):
        raise _wrong(where, key, "a string", value)
    return value


def opt_bool(obj: Mapping[str, Any], key: str, where: str) -> bool | None:
    """An optional boolean."""
    value = obj.get(key)
    if value is None or isinstance(value, bool):
        return value
    raise _wrong(where, key, "true or false", value)
