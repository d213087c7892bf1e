"""Checkpoint advice: the pure rule (tables) and automatic checkpoint commands through the API."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest

from stepwatch.server.analysis.checkpoint import advise, daly_interval

MakeReport = Callable[..., dict[str, Any]]
HOUR = 3600.0


def test_young_daly_interval() -> None:
    assert daly_interval(60, 24 * HOUR) == pytest.approx(math.sqrt(2 * 60 * 86400))  # ~54 min
    assert daly_interval(0, 24 * HOUR) == 0.0


@pytest.mark.parametrize(
    ("rate", "remaining", "max_at_risk", "next_after", "why"),
    [
        # 32 $/h and at most 8 $ at risk: every 15 min, before Daly's 54 min
        (32.0, None, 8.0, 900.0, "under 8"),
        # a generous budget: Daly's interval is shorter
        (32.0, None, 1000.0, math.sqrt(2 * 60 * 86400), "Young/Daly"),
        # no price: Daly alone
        (None, None, 8.0, math.sqrt(2 * 60 * 86400), "Young/Daly"),
        # finishes in 200 s, before the next is due (in 300 s): none
        (32.0, 200.0, 8.0, None, "finishes before"),
    ],
)
def test_advice(
    rate: float | None, remaining: float | None, max_at_risk: float, next_after: float | None, why: str
) -> None:
    advice = advise(
        now=1000.0,
        last=400.0,
        rate_per_hour=rate,
        remaining_s=remaining,
        max_at_risk=max_at_risk,
        checkpoint_cost_s=60.0,
        mtbf_s=24 * HOUR,
    )
    assert why in advice.reason
    assert advice.next_at == (None if next_after is None else pytest.approx(400.0 + next_after))
    assert advice.at_risk == (None if rate is None else pytest.approx(rate * 600 / HOUR))
    assert advice.due(1000.0) is False


def test_auto_checkpoints_keep_the_work_at_risk_under_the_budget(api: Any, make_report: MakeReport) -> None:
    policy = {"max_at_risk": 8.0, "auto_checkpoint": True}
    token = api.register("long", gpus=8, gpu_hour_cost=4.0, policy=policy)  # 32 $/h: a checkpoint every 15 min
    commands: list[dict[str, Any]] = []
    seq = 0
    for _ in range(40):  # 40 minutes, a report a minute
        seq += 1
        api.clock.advance(60)
        answer = api.report_ok("long", token, make_report(seq, seq * 100, {"loss": 1.0 / seq}))
        for command in answer["commands"]:
            if command not in commands:
                commands.append(command)
                seq += 1
                api.report_ok("long", token, make_report(seq, seq * 100, {"loss": 1.0 / seq}, acks=[command["id"]]))
    assert [c["kind"] for c in commands] == ["checkpoint", "checkpoint"]  # at ~15 and ~30 min
    view = api.job("long")["policy"]
    advice = view["checkpoint"]
    assert advice["interval_seconds"] == pytest.approx(900.0)
    assert advice["at_risk"] <= 8.0 + 32.0 / 60  # never more than the budget and one report's worth
    assert view["fired"]["checkpoint"]["action"] == "checkpoint"
    events = [e for e in api.events("long") if e["kind"] == "policy"]
    assert len(events) == 2 and "work at risk" in events[0]["message"]
