"""Checks the messages share: of JSON objects, arrays, integers, numbers, strings and hyperparameters. Each
raises :class:`ProtocolError` naming the field and what was expected."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any, Final

from ._errors import ProtocolError, _show
from ._limits import LIMITS
from ._values import decode_float

__all__ = ["ParamValue", "validate_params"]

_RUN_ID_RE: Final = re.compile(r"[A-Za-z0-9._-]+")

ParamValue = str | int | float | bool | None

_isfinite = math.isfinite


def _fields(obj: object) -> dict[str, Any]:
    return {name: getattr(obj, name) for name in obj.__dataclass_fields__}  # type: ignore[attr-defined]


def _object(data: object, field: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ProtocolError(field, f"must be a JSON object, got {type(data).__name__}")
    return data


def _plain_number(value: object) -> bool:
    """A finite float >= 0, or an integer from 0 to the largest exact one: a number ``_check_number``
    takes with ``minimum=0.0`` (and a few it would take, such as huge integers, left to it)."""
    if type(value) is float:
        return _isfinite(value) and value >= 0.0
    return type(value) is int and 0 <= value <= LIMITS.max_integer


def _array(data: object, field: str, limit: int) -> list[Any]:
    if not isinstance(data, list):
        raise ProtocolError(field, f"must be a JSON array, got {type(data).__name__}")
    if len(data) > limit:
        raise ProtocolError(field, f"at most {limit} items, got {len(data)}")
    return data


def _required(obj: Mapping[str, Any], key: str) -> Any:
    if key not in obj:
        raise ProtocolError(key, "is required")
    return obj[key]


def _optional_float(obj: Mapping[str, Any], key: str) -> float | None:
    value = obj.get(key)
    return None if value is None else decode_float(value, key)


def _check_int(value: object, field: str, minimum: int | None = None, maximum: int | None = None) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ProtocolError(field, f"must be an integer, got {_show(value)}")
    if maximum is None:
        maximum = LIMITS.max_integer
    if minimum is not None and value < minimum:
        raise ProtocolError(field, f"must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ProtocolError(field, f"must be <= {maximum}, got {value}")


def _check_optional_int(value: object, field: str, minimum: int | None = None, maximum: int | None = None) -> None:
    if value is not None:
        _check_int(value, field, minimum, maximum)


def _check_optional_number(value: object, field: str, minimum: float, strict: bool = False) -> None:
    if value is not None:
        _check_number(value, field, minimum, strict)


def _check_number(value: object, field: str, minimum: float, strict: bool = False) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise ProtocolError(field, f"must be a number, got {_show(value)}")
    if not math.isfinite(decode_float(value, field)):
        raise ProtocolError(field, f"must be finite, got {value!r}")
    if value < minimum or (strict and value == minimum):
        raise ProtocolError(field, f"must be {'>' if strict else '>='} {minimum:g}, got {value!r}")


def _check_str(value: object, field: str, max_length: int, allow_empty: bool = False) -> None:
    if not isinstance(value, str):
        raise ProtocolError(field, f"must be a string, got {_show(value)}")
    if not value and not allow_empty:
        raise ProtocolError(field, "must not be empty")
    if len(value) > max_length:
        raise ProtocolError(field, f"must be at most {max_length} characters, got {len(value)}")


def _check_printable(value: object, field: str, max_length: int) -> None:
    _check_str(value, field, max_length)
    assert isinstance(value, str)
    if not value.isprintable():
        raise ProtocolError(field, f"must be printable, got {_show(value)}")


def _check_run_id(value: object, field: str) -> None:
    _check_str(value, field, LIMITS.max_run_id_length)
    assert isinstance(value, str)
    if not _RUN_ID_RE.fullmatch(value):
        raise ProtocolError(field, f"must use only letters, digits, '.', '_' and '-', got {_show(value)}")


def validate_params(params: object) -> dict[str, ParamValue]:
    """Return hyperparameters if they are a flat object of scalars within the limits, else raise."""
    if not isinstance(params, dict):
        raise ProtocolError("params", f"must be a JSON object, got {type(params).__name__}")
    _check_params(params)
    return params


def _check_params(params: Mapping[str, Any]) -> None:
    if len(params) > LIMITS.max_params:
        raise ProtocolError("params", f"at most {LIMITS.max_params} parameters, got {len(params)}")
    for key, value in params.items():
        if not isinstance(key, str) or not 0 < len(key) <= LIMITS.max_param_key_length or not key.isprintable():
            raise ProtocolError(
                "params", f"keys must be 1-{LIMITS.max_param_key_length} printable characters, got {_show(key)}"
            )
        if value is None or isinstance(value, (bool, int)):
            continue
        if isinstance(value, float):
            if not math.isfinite(value):
                raise ProtocolError(f"params.{key}", f"must be finite, got {value!r}")
        elif isinstance(value, str):
            _check_str(value, f"params.{key}", LIMITS.max_param_value_length, allow_empty=True)
        else:
            raise ProtocolError(f"params.{key}", f"must be a string, number, boolean or null, got {_show(value)}")


def _decode_param(value: object, field: str) -> ParamValue:
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    raise ProtocolError(field, f"must be a string, number, boolean or null, got {type(value).__name__}")
