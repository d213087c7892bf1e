"""Each declared request body (``stepwatch.server.api.bodies``): valid and invalid examples derived from
its declaration, sent to its route; the route's answer must agree with the body's schema in ``/openapi.json``
(valid: accepted; invalid: 422 naming the field the example broke, and the schema refuses it too)."""

from __future__ import annotations

import dataclasses
import itertools
import re
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from jsonschema import Draft202012Validator, FormatChecker  # type: ignore[import-untyped]
from starlette.applications import Starlette

from stepwatch.protocol import ProtocolError, is_valid_name, parse_rfc3339
from stepwatch.server import ServerSettings, create_app
from stepwatch.server.api.auth import mint_token
from stepwatch.server.api.bodies import (
    COMMAND_REQUEST,
    DECLARED,
    NAME_PATTERN,
    REGISTRATION,
    STATE_CHANGE,
    TOKEN_REQUEST,
)
from stepwatch.server.api.request import hash_token
from stepwatch.server.policies import PolicyError, parse_policy
from stepwatch.server.policies.model import POLICY
from stepwatch.server.store import AuditEntry, Store
from stepwatch.server.views.bodyspec import Body, Field

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

UNKNOWN_KEY = "no-such-field"


# ------------------------------------------------------------------------ examples from a declaration


def valid_value(field: Field) -> Any:
    """A value the field's rules accept: its example, else the smallest one its rules allow."""
    if field.example is not None:
        return field.example
    if field.type == "boolean":
        return True
    if field.type in ("integer", "number"):
        low = field.minimum if field.minimum is not None else (field.above + 1 if field.above is not None else 1)
        return int(low) if field.type == "integer" else float(low)
    if field.type == "string":
        assert field.pattern is None, f"{field.key}: a field with a pattern needs an example"
        return field.choices[0] if field.choices else "x" * max(field.min_length, 1)
    if field.type == "time":
        return 1_800_000_000.0
    if field.type == "array":
        assert field.items is not None
        return [valid_value(field.items)] * max(field.min_items, 1)
    return valid_body(field.body) if field.body is not None else {}


def valid_body(body: Body) -> dict[str, Any]:
    """Every field of ``body`` with a valid value."""
    return {f.key: valid_value(f) for f in body.fields}


def invalid_values(field: Field, path: str) -> Iterator[tuple[str, Any, str]]:
    """``(what, value, field at fault)`` for each rule of the field: a value that breaks it."""
    if field.type == "boolean":
        yield "a string", "yes", path
    elif field.type in ("integer", "number"):
        yield "a string", "1", path
        yield "a boolean", True, path
        if field.type == "integer":
            yield "a fraction", 1.5, path
        if field.minimum is not None:
            yield "under the minimum", field.minimum - 1, path
        if field.above is not None:
            yield "at the exclusive minimum", field.above, path
        yield "beyond any float", 10**400, path
        if field.maximum is not None:
            yield "over the maximum", field.maximum + 1, path
    elif field.type == "string":
        yield "a number", 5, path
        if field.choices:
            yield "not a choice", "no-such-choice", path
        if field.min_length:
            yield "too short", "", path
        if field.max_length is not None:
            yield "too long", "x" * (field.max_length + 1), path
        if field.printable:
            yield "a control character", "a\nb", path
        if field.pattern is not None:
            yield "off the pattern", f"{valid_value(field)}_X", path
    elif field.type == "time":
        yield "a boolean", True, path
        yield "a negative number", -5, path
        yield "not a time", "tomorrow", path
    elif field.type == "array":
        assert field.items is not None
        yield "not a list", "x", path
        if field.min_items:
            yield "too few items", [], path
        if field.max_items is not None:
            yield "too many items", [valid_value(field.items)] * (field.max_items + 1), path
        for what, item, at in invalid_values(field.items, f"{path}[0]"):
            yield f"an item {what}", [item], at
    else:
        yield "a list", [1], path
        if field.body is not None:
            for what, value, at in invalid_cases(field.body, path):
                yield what, value, at
        if field.max_properties is not None:
            yield "too many keys", {f"k{i}": 1 for i in range(field.max_properties + 1)}, path


def invalid_cases(body: Body, path: str = "") -> Iterator[tuple[str, dict[str, Any], str]]:
    """Valid bodies but for one field: ``(what, body, the field at fault)``."""
    full = valid_body(body)
    for field in body.fields:
        where = f"{path}.{field.key}" if path else field.key
        if field.required:
            yield f"{where} missing", {k: v for k, v in full.items() if k != field.key}, where
        for what, value, at in invalid_values(field, where):
            yield f"{where}: {what}", {**full, field.key: value}, at
    if body.closed:
        at = f"{path}.{UNKNOWN_KEY}" if path else UNKNOWN_KEY
        yield f"{at}: an unknown key", {**full, UNKNOWN_KEY: 1}, at


def valid_cases(body: Body) -> Iterator[tuple[str, dict[str, Any]]]:
    """The required fields only, every field, and every field with each optional one null."""
    full = valid_body(body)
    yield "required only", {f.key: full[f.key] for f in body.fields if f.required}
    yield "every field", full
    for field in body.fields:
        if not field.required:
            yield f"{field.key} null", {**full, field.key: None}


# ---------------------------------------------------------------------------------------- the routes


def _app(store: Store, clock: Any) -> Starlette:
    settings = ServerSettings(allowed_hosts=("testserver",), auth="tokens")
    return create_app(settings, store=store, clock=clock)


@pytest.fixture
def client(store: Store, clock: Any) -> Iterator[TestClient]:
    with TestClient(_app(store, clock), raise_server_exceptions=True) as client:
        token, secret = mint_token("admin", ("*",), "root", clock(), by="test")
        store.create_token(token, hash_token(secret), AuditEntry(clock(), "test", "token_created"))
        client.headers["Authorization"] = f"Bearer {secret}"
        yield client


def _job(client: TestClient) -> tuple[str, str]:
    """A new job: its path and its write token."""
    name = f"job-{len(client.get('/api/v1/jobs').json()['items'])}"
    answer = client.post("/api/v1/namespaces/default/jobs", json={"name": name})
    assert answer.status_code == 201, answer.text
    return f"/api/v1/namespaces/default/jobs/{name}", answer.json()["token"]


_NAMESPACES = itertools.count()


def _register(client: TestClient, body: Any) -> Any:
    # a namespace of its own: each valid body registers a new job, not a new attempt of the one before
    return client.post(f"/api/v1/namespaces/ns-{next(_NAMESPACES)}/jobs", json=body)


def _state(client: TestClient, body: Any) -> Any:
    path, token = _job(client)
    return client.post(f"{path}/state", json=body, headers={"Authorization": f"Bearer {token}"})


def _command(client: TestClient, body: Any) -> Any:
    path, _ = _job(client)
    return client.post(f"{path}/commands", json=body)


def _policy(client: TestClient, body: Any) -> Any:
    return client.put("/api/v1/namespaces/default/policy", json=body)


def _token(client: TestClient, body: Any) -> Any:
    return client.post("/api/v1/tokens", json=body)


ROUTES: dict[str, tuple[Body, Callable[[TestClient, Any], Any], int]] = {
    "Registration": (REGISTRATION, _register, 201),
    "StateChange": (STATE_CHANGE, _state, 200),
    "CommandRequest": (COMMAND_REQUEST, _command, 201),
    "Policy": (POLICY, _policy, 200),
    "TokenRequest": (TOKEN_REQUEST, _token, 201),
}
"""Each declared body, the route that reads it, and its answer to a valid one."""


def _schema(client: TestClient, name: str) -> Draft202012Validator:
    """The body's schema as ``/openapi.json`` says it (date-time checked as RFC 3339)."""
    document = client.get("/openapi.json").json()
    formats = FormatChecker()
    formats.checks("date-time", raises=ProtocolError)(lambda text: parse_rfc3339(text) is not None)
    schema = {"$ref": f"#/components/schemas/{name}", "components": document["components"]}
    return Draft202012Validator(schema, format_checker=formats)


def test_every_declared_body_has_a_route_here() -> None:
    assert sorted(body.name for body in DECLARED) == sorted(ROUTES)


@pytest.mark.parametrize("name", sorted(ROUTES))
def test_the_route_and_the_schema_agree_on_derived_examples(client: TestClient, name: str) -> None:
    body, send, accepted = ROUTES[name]
    schema = _schema(client, name)
    wrong: list[str] = []
    for what, example in valid_cases(body):
        if not schema.is_valid(example):
            wrong.append(f"{what}: the schema refuses it: {next(schema.iter_errors(example)).message}")
        answer = send(client, example)
        if answer.status_code != accepted:
            wrong.append(f"{what}: {answer.status_code} {answer.text[:200]}")
    cases = list(invalid_cases(body))
    assert len(cases) > 2 * len(body.fields)
    for what, example, field in cases:
        if schema.is_valid(example):
            wrong.append(f"{what}: the schema accepts it")
        answer = send(client, example)
        if answer.status_code != 422 or answer.json().get("details", {}).get("field") != field:
            wrong.append(f"{what}: {answer.status_code} {answer.text[:200]} (expected 422 on {field})")
        elif not answer.json()["message"].startswith(field):
            wrong.append(f"{what}: the message does not name the field: {answer.json()['message']}")
    assert not wrong, "\n".join(wrong)


def test_a_body_that_is_not_an_object_is_422_without_a_field(client: TestClient) -> None:
    for name, (_, send, _) in sorted(ROUTES.items()):
        answer = send(client, [1, 2])
        assert answer.status_code == 422, name
        if name != "Policy":  # a policy says it is the policy that is wrong (read the same in settings)
            assert answer.json()["message"] == "the body must be a JSON object, got list"
            assert "details" not in answer.json()


def test_a_policy_is_read_as_its_declaration_says_also_outside_a_request() -> None:
    """``parse_policy`` (settings, stored layers) reads the same declaration as the routes."""
    policy = parse_policy(valid_body(POLICY))
    assert policy.budget == 250.0 and policy.deadline == parse_rfc3339("2026-12-07T09:00:00Z")
    assert policy.on == {"not_learning": "checkpoint_stop", "diverging": "stop"}
    for what, example, field in invalid_cases(POLICY):
        with pytest.raises(PolicyError) as caught:
            parse_policy(example)
        assert caught.value.field == field, what


@pytest.mark.parametrize(
    "name", ["a", "job-1", "a" * 63, "a" * 64, "-a", "a-", "A", "a_b", "", "a.b", "1", "a--b", "é", "a\n"]
)
def test_the_name_pattern_is_the_protocols(name: str) -> None:
    declared = len(name) <= 63 and re.fullmatch(NAME_PATTERN, name) is not None
    assert declared == is_valid_name(name)


def test_an_optional_field_takes_null_as_absent() -> None:
    said = COMMAND_REQUEST.read({"kind": "stop", "reason": None})
    assert said == {"kind": "stop", "reason": ""}
    with_default = dataclasses.replace(COMMAND_REQUEST.fields[1], default="said")
    assert Body("X", (with_default,)).read({}) == {"reason": "said"}
