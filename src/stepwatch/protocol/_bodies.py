"""Request bodies (standard JSON, within the size and depth limits) and the URL paths they go to."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from ._errors import BodyTooLarge, ProtocolError
from ._limits import LIMITS
from ._values import _NONFINITE_IN
from ._vocabulary import API_VERSION

__all__ = ["decode_body", "encode_body", "jobs_path", "kubeflow_status_path", "report_path"]


def encode_body(obj: Mapping[str, Any]) -> bytes:
    """Compact standard JSON (no NaN tokens: non-finite values must already be encoded)."""
    return json.dumps(obj, separators=(",", ":"), allow_nan=False, ensure_ascii=False).encode()


def decode_body(body: bytes, fast_loads: Callable[[bytes], Any] | None = None) -> Any:
    """Parse a request body, enforcing the size limit; raises :class:`ProtocolError`.

    ``fast_loads`` (the server passes ``orjson.loads``) is tried first: a strict parser that accepts a
    subset of what the standard one does and reads it the same way. Whatever it refuses (``NaN``
    constants, integers beyond 64 bits, bad input) goes to the standard parser, which decides and
    words the error.
    """
    if len(body) > LIMITS.max_body_bytes:
        raise BodyTooLarge("", f"body is {len(body)} bytes; the limit is {LIMITS.max_body_bytes} bytes (64 KiB)")
    data: Any = _UNPARSED
    if fast_loads is not None:
        try:
            data = fast_loads(body)
        except Exception:  # any refusal: the standard parser below decides
            data = _UNPARSED
    if data is _UNPARSED:
        try:
            data = json.loads(body, parse_constant=_NONFINITE_IN.__getitem__)
        except (ValueError, UnicodeDecodeError) as exc:
            raise ProtocolError("", f"body is not valid JSON: {exc}") from None
        except RecursionError:
            raise ProtocolError("", _too_deep()) from None
    # only a body with more brackets than the limit can nest deeper than it: most are not walked at all
    if body.count(b"[") + body.count(b"{") > LIMITS.max_depth and _deeper_than(data, LIMITS.max_depth):
        raise ProtocolError("", _too_deep())
    return data


def _too_deep() -> str:
    return f"body nests too deeply: at most {LIMITS.max_depth} levels of objects and arrays"


_UNPARSED = object()
"""What ``decode_body`` holds before a parser has read the body (``None`` is a valid body)."""


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether ``value`` nests objects and arrays more than ``limit`` deep (level by level, no recursion)."""
    level = [value] if isinstance(value, (dict, list)) else []
    for _ in range(limit):
        level = [c for v in level for c in (v.values() if isinstance(v, dict) else v) if isinstance(c, (dict, list))]
        if not level:
            return False
    return True


def jobs_path(namespace: str) -> str:
    """The URL path where jobs of a namespace are listed and registered."""
    return f"/api/{API_VERSION}/namespaces/{namespace}/jobs"


def report_path(namespace: str, job: str) -> str:
    """The URL path of the native report endpoint for a job."""
    return f"/api/{API_VERSION}/namespaces/{namespace}/jobs/{job}/reports"


def kubeflow_status_path(namespace: str, trainjob: str) -> str:
    """The URL path of the upstream Kubeflow Trainer status endpoint for a TrainJob."""
    return f"/apis/trainer.kubeflow.org/v1alpha1/namespaces/{namespace}/trainjobs/{trainjob}/status"
