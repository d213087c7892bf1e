"""The server reads request bodies with orjson first: the same values and errors as the standard parser."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from stepwatch.protocol import ProtocolError, decode_body
from stepwatch.server.api.request import fast_json_loads

NAN = math.nan
INF = math.inf

BODIES = [
    json.dumps({"metrics": [{"name": "a", "last": 0.1 + 0.2, "count": 3}], "seq": 7}).encode(),
    json.dumps({"metrics": [{"name": "a", "last": NAN}, {"name": "b", "last": -INF}]}).encode(),  # bare NaN tokens
    b'{"big": 123456789012345678901234567890, "small": -9223372036854775809, "edge": 9223372036854775807}',
    b'{"step": 999999999999999999, "neg": -999999999999999999}',  # 18 digits: orjson reads them exactly
    b'{"huge": 1e400, "tiny": 5e-324, "neg": -0.0, "long": 0.1000000000000000055511151231257827}',
    b'{"k": 1, "k": 2}',
    rb'{"name": "train/loss \u00e9\u4e2d \ud83d\ude00", "lone": "\ud800"}',  # JSON escapes, a lone surrogate
    '{"name": "train/loss é中"}'.encode(),
    b"[" * 40 + b"]" * 40,
    b"null",
    b' \n {"a": [1, 2.5, true, false, null, "x"]} \t',
    b"",
    b"{",
    b'{"run_id": "r",}',
    b'{"a": nan}',
    b"\xff\xfe\xfd",
    b'{"run_id": "\xc3"}',
    b'{"a": 1} {"b": 2}',
]


def outcome(body: bytes, **kwargs: Any) -> tuple[str, Any]:
    try:
        value = decode_body(body, **kwargs)
    except ProtocolError as exc:
        return "error", (exc.field, exc.message)
    return type(value).__name__, json.dumps(value, sort_keys=True)  # NaN-safe, type-exact for numbers


@pytest.mark.parametrize("body", BODIES)
def test_the_fast_reading_equals_the_standard_one(body: bytes) -> None:
    assert outcome(body, fast_loads=fast_json_loads) == outcome(body)


def test_integers_beyond_64_bits_stay_exact() -> None:
    value = decode_body(b'{"step": 123456789012345678901}', fast_json_loads)
    assert value["step"] == 123456789012345678901
    assert isinstance(value["step"], int)


def test_the_fast_reader_is_orjson_where_it_can_be() -> None:
    orjson = pytest.importorskip("orjson")
    body = b'{"a": [1, 2.5]}'
    assert fast_json_loads(body) == orjson.loads(body)
    with pytest.raises(ValueError, match="standard parser"):
        fast_json_loads(b'{"a": 12345678901234567890}')
