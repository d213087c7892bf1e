"""JSON responses encoded with orjson: lists of 10,000 jobs and long histories are megabytes.

The standard library's encoder spends most of a large list's time formatting floats; orjson does
the same work several times faster. Values here are already JSON-safe (non-finite floats are the
strings of the protocol), so both encoders give the same document. Without orjson (a server
installed without its extra), the standard encoder is used.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.responses import JSONResponse

__all__ = ["FastJSONResponse", "render_json"]

try:
    import orjson
except ImportError:  # pragma: no cover - orjson is in the server extra
    orjson = None  # type: ignore[assignment]


class FastJSONResponse(JSONResponse):
    """A ``JSONResponse`` rendered by orjson when it is installed (and for what it can encode)."""

    def render(self, content: Any) -> bytes:
        return render_json(content)


def render_json(content: Any) -> bytes:
    """The body of a :class:`FastJSONResponse` of ``content``: orjson's encoding when it can, else the standard one."""
    if orjson is not None:
        try:
            return orjson.dumps(content)
        except TypeError:  # an integer beyond 64 bits, a type orjson does not know: the slow path
            pass
    return json.dumps(content, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()
