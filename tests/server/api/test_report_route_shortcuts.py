"""The report route's shortcuts answer as the long way does: its answer built without a ``ReportResponse``
when no command is pending, and the names of the path checked once each."""

from __future__ import annotations

import random
import string

import pytest

from stepwatch.protocol import LIMITS, Command, ProtocolError, ReportResponse, is_valid_name
from stepwatch.server.api import request
from stepwatch.server.api.routes.ingest import _answer


@pytest.mark.parametrize("count", [0, 1, 3, LIMITS.max_commands, LIMITS.max_commands + 1])
@pytest.mark.parametrize("seq", [0, 7, LIMITS.max_integer])
def test_the_answer_is_the_response_s(seq: int, count: int) -> None:
    commands = tuple(Command(id=f"c-{i}", kind="checkpoint", reason="r") for i in range(count))
    try:
        expected: object = ReportResponse(accepted_seq=seq, commands=commands).to_dict()
    except ProtocolError as exc:
        with pytest.raises(ProtocolError) as raised:
            _answer(seq, commands)
        assert (raised.value.field, raised.value.message) == (exc.field, exc.message)
        return
    assert _answer(seq, commands) == expected


def test_a_name_is_valid_once_checked_as_when_checked_afresh(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(request, "_VALID_NAMES", set())
    rng = random.Random(3)
    alphabet = string.ascii_lowercase[:4] + string.digits[:2] + "-_A. "
    names = ["a", "-a", "a-", "a" * 63, "a" * 64, "", "default", "bench-job-7", "Bench", "a.b", "x\n"]
    names += ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 6))) for _ in range(2000)]
    for _ in range(2):  # the second round reads what the first remembered
        assert [request._valid_name(n) for n in names] == [is_valid_name(n) for n in names]
    assert {n for n in names if is_valid_name(n)} == request._VALID_NAMES


def test_the_names_remembered_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(request, "_VALID_NAMES", set())
    for i in range(40_000):
        assert request._valid_name(f"job-{i}")
    assert 0 < len(request._VALID_NAMES) <= 16384
