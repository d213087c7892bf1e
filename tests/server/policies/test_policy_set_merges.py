"""A policy set later merges into the one that stands (issue 30 item 9): nothing set at start drops silently.

``PUT .../policy`` and ``stepwatch policy set`` used to replace the whole layer, so a budget set later
wiped the ``not_learning`` and ``diverging`` triggers, the budget and the deadline given at start. Now a
set merges (trigger by trigger under ``on``; ``null`` removes a key), replaces only when asked
(``"replace": true`` or ``?replace=true``), ``{}`` clears, and every answer shows the policy in force.
"""

from __future__ import annotations

from typing import Any

import pytest

from stepwatch.server.policies.model import merge_layer

pytestmark = pytest.mark.both_stores

AT_START = {
    "on": {"not_learning": "checkpoint_stop", "diverging": "stop"},
    "budget": 250.0,
    "deadline": 1_900_000_000.0,
}


def test_merge_layer_is_a_json_merge_patch_trigger_by_trigger() -> None:
    stands = {"on": {"stalled": "notify", "diverging": "stop"}, "budget": 10.0, "notify": ["https://a"]}
    patch = {"on": {"stalled": None, "late": "notify"}, "budget": None, "notify": ["https://b"], "dry_run": True}
    assert merge_layer(stands, patch) == {
        "on": {"diverging": "stop", "late": "notify"},
        "notify": ["https://b"],
        "dry_run": True,
    }
    assert merge_layer(None, {"on": {"stalled": None}}) == {}
    assert merge_layer(stands, {"on": None}) == {"budget": 10.0, "notify": ["https://a"]}
    assert stands["on"] == {"stalled": "notify", "diverging": "stop"}  # untouched


def test_triggers_budget_and_deadline_set_at_start_survive_a_later_set(api: Any) -> None:
    api.register("ft", policy=AT_START)
    path = f"{api.job_path('ft')}/policy"
    answer = api.client.put(path, json={"budget": 400, "on": {"stalled": "notify"}})
    assert answer.status_code == 200, answer.text
    shown = answer.json()
    expected = {
        "on": {"not_learning": "checkpoint_stop", "diverging": "stop", "stalled": "notify"},
        "budget": 400.0,
        "deadline": 1_900_000_000.0,
    }
    assert shown["job"] == expected  # the answer is the policy in force, not only what was sent
    assert {k: shown["effective"]["on"][k] for k in expected["on"]} == expected["on"]
    assert shown["effective"]["budget"] == 400.0 and shown["effective"]["deadline"] == 1_900_000_000.0
    assert api.client.get(path).json()["job"] == expected

    # the checkpoint example of docs/policies.md no longer wipes what was set just before it
    api.client.put(path, json={"max_at_risk": 8, "auto_checkpoint": True})
    assert api.client.get(path).json()["job"] == {**expected, "max_at_risk": 8.0, "auto_checkpoint": True}


def test_null_removes_and_a_replace_only_when_asked(api: Any) -> None:
    api.register("rp", policy=AT_START)
    path = f"{api.job_path('rp')}/policy"
    removed = api.client.put(path, json={"on": {"diverging": None}, "deadline": None}).json()["job"]
    assert removed == {"on": {"not_learning": "checkpoint_stop"}, "budget": 250.0}
    replaced = api.client.put(path, json={"replace": True, "on": {"stalled": "stop"}}).json()["job"]
    assert replaced == {"on": {"stalled": "stop"}}
    replaced = api.client.put(path + "?replace=true", json={"budget": 5}).json()["job"]
    assert replaced == {"budget": 5.0}
    assert api.client.put(path, json={}).json()["job"] in ({}, None)  # {} clears, as it always did
    bad = api.client.put(path, json={"replace": "yes"})
    assert bad.status_code == 422 and bad.json()["details"]["field"] == "replace"
    bad = api.client.put(path, json={"on": {"stalled": "explode"}})
    assert bad.status_code == 422 and bad.json()["details"]["field"] == "on.stalled"


def test_a_namespace_layer_merges_too(api: Any) -> None:
    path = "/api/v1/namespaces/nlp/policy"
    api.client.put(path, json={"on": {"diverging": "stop"}, "budget": 100})
    shown = api.client.put(path, json={"on": {"not_learning": "notify"}}).json()
    assert shown["policy"] == {"on": {"not_learning": "notify", "diverging": "stop"}, "budget": 100.0}
    assert api.client.put(path, json={"replace": True, "dry_run": True}).json()["policy"] == {"dry_run": True}
