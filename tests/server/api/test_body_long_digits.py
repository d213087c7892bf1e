"""Which bodies the server leaves to the standard JSON parser: those with an integer orjson may read as a
float (a run of 19 digits or more that is not a fraction's), and no others (issue 31: a report whose
learning rate is written ``0.00030000000000000003`` was read twice, once by each parser)."""

from __future__ import annotations

import json
import random

import pytest

from stepwatch.protocol import decode_body
from stepwatch.server.api.request import fast_json_loads

orjson = pytest.importorskip("orjson")

LEFT = [
    b"12345678901234567890",  # the body is the number
    b'{"a": 12345678901234567890}',
    b'{"a": -9223372036854775809}',
    b'{"a": [1, 1234567890123456789]}',
    b'{"a": 12345678901234567890.5}',  # an integer part that long
    b'{"a": 1e1234567890123456789}',  # an exponent that long
    b'{"a": 1.5E-0000000000000000001}',
    b'{"a": "1234567890123456789"}',  # in a string: left over, harmless (the standard parser decides)
]
READ = [
    b'{"lr": 0.00029953640931685877}',
    b'{"a": -0.1000000000000000055511151231257827, "b": 3.000000000000000000000001e-5}',
    b'{"a": 999999999999999999, "b": -999999999999999999}',  # 18 digits
    b'{"a": 1.5e300, "b": 0.5}',
]


@pytest.mark.parametrize("body", LEFT)
def test_a_long_integer_goes_to_the_standard_parser(body: bytes) -> None:
    with pytest.raises(ValueError, match="standard parser"):
        fast_json_loads(body)


@pytest.mark.parametrize("body", READ)
def test_a_long_fraction_is_read_by_orjson(body: bytes) -> None:
    assert fast_json_loads(body) == json.loads(body)


def test_the_fast_reading_equals_the_standard_one_for_random_numbers() -> None:
    rng = random.Random(31)
    for _ in range(3000):
        text = f"{rng.choice(['', '-'])}{rng.randint(0, 10 ** rng.randint(0, 22))}"
        if rng.random() < 0.7:
            digits = "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 30)))
            text += "." + "0" * rng.randint(0, 20) + digits
        if rng.random() < 0.3:
            text += f"e{rng.randint(-330, 330)}"
        body = f'{{"v": [{text}]}}'.encode()
        standard = decode_body(body)
        fast = decode_body(body, fast_json_loads)
        assert json.dumps(fast) == json.dumps(standard), body  # type-exact (an int stays an int)


def _long_integer_by_definition(body: bytes) -> bool:
    """The definition the server's search keeps: a run of 19 digits or more, at the start of the body or after
    a byte that is neither a digit nor a dot (its first reading, a substring search for that shape)."""
    shape = bytes(48 if 48 <= c <= 57 else 46 if c == 46 else 32 for c in body)
    return b" " + b"0" * 19 in shape or shape.startswith(b"0" * 19)


def test_the_search_for_long_integers_finds_what_its_definition_says() -> None:
    from stepwatch.server.api.request import _long_integer

    rng = random.Random(7)
    pieces = ["0", "7", ".", " ", "-", "e", "x", '"', ",", "[", "]"]
    for _ in range(4000):
        parts = []
        for _ in range(rng.randint(0, 12)):
            if rng.random() < 0.4:
                parts.append(rng.choice("0123456789") * rng.randint(15, 24))  # runs about 19 long
            else:
                parts.append(rng.choice(pieces))
        body = "".join(parts).encode()
        assert _long_integer(body) == _long_integer_by_definition(body), body
    for body in (*LEFT, *READ, b"1" * 19, b"." + b"1" * 19, b"." + b"1" * 40 + b"." + b"1" * 19 + b" " + b"1" * 19):
        assert _long_integer(body) == _long_integer_by_definition(body), body


def test_the_search_is_linear_in_a_body_of_fractions() -> None:
    """Bodies of long fractions back to back, the worst case for a search that looks on past each run:
    a body four times as long takes about four times as long, not sixteen."""
    import time

    from stepwatch.server.api.request import _long_integer

    def cost(n: int) -> float:
        body = (b"." + b"1" * 20) * n
        best = float("inf")
        for _ in range(5):
            started = time.perf_counter()
            assert not _long_integer(body)
            best = min(best, time.perf_counter() - started)
        return best

    assert cost(3000) < 10 * cost(750)
