"""The OpenAPI 3.1 description of the server's API, served at ``/openapi.json`` and shown at ``/docs``.

The request bodies of the native API come from their declarations (:mod:`.bodies`), the ones the
routes read them with; the wire format's (reports, Kubeflow statuses) from :mod:`stepwatch.protocol`'s
dataclasses and limits (:mod:`.openapi_wire`); the answers are described here. Paths come in groups,
each a function.
"""

from __future__ import annotations

from typing import Any

from ..policies.model import POLICY
from ..views.bodyspec import Body
from ..views.serialisers import LIST_COLUMNS
from .bodies import COMMAND_REQUEST, DECLARED, REGISTRATION, STATE_CHANGE, TOKEN_REQUEST, kubernetes_name
from .openapi_job import JOB_SCHEMA
from .openapi_wire import wire_schemas

__all__ = ["openapi_document"]

_NAME = kubernetes_name("", "").schema()

_ERROR_SCHEMA: dict[str, Any] = {
    "Status": {
        "type": "object",
        "description": "Every error, as a Kubernetes Status object.",
        "properties": {
            "kind": {"const": "Status"},
            "apiVersion": {"const": "v1"},
            "status": {"const": "Failure"},
            "code": {"type": "integer"},
            "reason": {"type": "string"},
            "message": {"type": "string"},
            "details": {"type": "object", "properties": {"field": {"type": "string"}}},
        },
        "required": ["kind", "code", "reason", "message"],
    },
}
"""The one error shape."""

_VIEW_SCHEMAS: dict[str, Any] = {
    "Job": {
        **JOB_SCHEMA,
        "description": (
            "A job with its derived progress, ETA, last metrics, health (state, since, evidence) and cost "
            "(rate_per_hour, spent, projected, wasted). eta.source says where the ETA shown comes from: "
            "reported (the job's own: its Kubeflow client's estimatedRemainingSeconds as posted, or its report "
            "core's, counted down since it arrived), estimate (stepwatch's, from the recent rate; also in "
            "eta.estimate_seconds beside a reported one) or final. trainerStatus (full views) is the last "
            "status an upstream Kubeflow client posted, as posted, or the job in that shape. health_history "
            "(full views) is every verdict the job had, oldest first, kept after it recovers or ends: state, "
            "from and to (server times; to is null while it stands), since (when the analysis says it began), "
            "message, rank where one is named, start and end (the time it covers: the spans cover the job "
            "without overlap or gap, unknown spans where no verdict held), seconds it stood, its cost and what "
            "of it was wasted. progress.percent is the shown value (one decimal, rounded down); the live rates "
            "are null when the job is stalled or ended, cost.rate_per_hour null once it ended. A verdict by where "
            "each rank stands names the rank and its place in words in health.evidence (see its schema)."
        ),
    },
    "JobList": {
        "type": "object",
        "properties": {
            "items": {"type": "array", "items": {"$ref": "#/components/schemas/Job"}},
            "total": {"type": "integer"},
        },
    },
    "JobColumns": {
        "type": "object",
        "description": (
            "A list as columns (form=columns): the same compact views as JobList's items, each field an array "
            "with one value per job, in the list's order. A column's name is a field of the view, or "
            "field.subfield for the fields of its objects (progress.percent, times.elapsed_seconds, "
            "cost.spent...); metrics and health.evidence stay objects. Clients should ignore columns they do not "
            "know (later servers may add some)."
        ),
        "properties": {
            "columns": {
                "type": "object",
                "properties": {name: {"type": "array"} for name in LIST_COLUMNS},
                "required": list(LIST_COLUMNS),
                "additionalProperties": {"type": "array"},
            },
            "total": {"type": "integer"},
        },
        "required": ["columns", "total"],
    },
}
"""What the API answers about jobs."""


def _errors(*codes: int) -> dict[str, Any]:
    return {
        str(code): {
            "description": "error",
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Status"}}},
        }
        for code in codes
    }


def _ok(schema: str, code: int = 200, description: str = "OK") -> dict[str, Any]:
    return {
        str(code): {
            "description": description,
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{schema}"}}},
        }
    }


def _list_ok() -> dict[str, Any]:
    forms = [{"$ref": "#/components/schemas/JobList"}, {"$ref": "#/components/schemas/JobColumns"}]
    return {
        "200": {
            "description": "OK: JobList, or JobColumns with form=columns",
            "content": {"application/json": {"schema": {"oneOf": forms}}},
        }
    }


def _body(schema: str | Body) -> dict[str, Any]:
    ref = schema.ref() if isinstance(schema, Body) else {"$ref": f"#/components/schemas/{schema}"}
    return {"required": True, "content": {"application/json": {"schema": ref}}}


def _path(name: str) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "schema": _NAME}


def _query(name: str, schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "schema": schema, "description": description}


_NS = [_path("namespace")]
_JOB = [_path("namespace"), _path("name")]
_BEARER: list[dict[str, list[str]]] = [{"jobToken": []}]
_API: list[dict[str, list[str]]] = [{"apiToken": []}, {}]
"""An API token when the server has authentication on (``STEPWATCH_AUTH``); nothing when it is off."""
_OPEN = frozenset({"/api/v1/version", "/healthz"})
"""Paths anyone may read, whatever the authentication."""
_LIST_QUERY = [
    _query("namespace", _NAME, "only this namespace"),
    _query("state", {"type": "string"}, "comma-separated states"),
    _query(
        "health",
        {"type": "string"},
        "comma-separated health states: healthy, stalled, not_learning, diverging, straggling, unknown",
    ),
    _query("text", {"type": "string"}, "part of the name or namespace"),
    _query("min_progress", {"type": "number", "minimum": 0, "maximum": 100}, "percent"),
    _query("max_progress", {"type": "number", "minimum": 0, "maximum": 100}, "percent"),
    _query(
        "sort",
        {"type": "string"},
        "name, namespace, state, progress, step, created, updated or eta; '-' first for descending",
    ),
    _query("limit", {"type": "integer", "minimum": 1, "maximum": 10000}, "page size"),
    _query("offset", {"type": "integer", "minimum": 0}, "page start"),
    _query("all_attempts", {"type": "boolean"}, "every attempt, not only the latest"),
    _query(
        "form",
        {"enum": ["items", "columns"], "default": "items"},
        "items: an array of job views (JobList); columns: the same views as one array per field (JobColumns), "
        "40% of the bytes and quicker to decode",
    ),
    _query("full", {"type": "boolean"}, "full views (with params and trainerStatus); items only"),
]


def openapi_document(version: str) -> dict[str, Any]:
    """The whole document."""
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "stepwatch",
            "version": version,
            "description": (
                "Live progress, ETA, health and cost of training jobs. Errors are Kubernetes Status objects."
            ),
        },
        "paths": _secured({**_job_paths(), **_writer_paths(), **_policy_paths(), **_meta_paths(), **_access_paths()}),
        "components": _components(),
    }


def _components() -> dict[str, Any]:
    return {
        "schemas": {
            **_ERROR_SCHEMA,
            **wire_schemas(),  # generated from the protocol's dataclasses and limits (.openapi_wire)
            **{body.name: body.schema() for body in DECLARED},
            **_VIEW_SCHEMAS,
        },
        "securitySchemes": {
            "jobToken": {"type": "http", "scheme": "bearer", "description": "the job's write token"},
            "apiToken": {
                "type": "http",
                "scheme": "bearer",
                "description": "an API token (stepwatch token create), when the server has authentication on",
            },
        },
    }


def _secured(paths: dict[str, Any]) -> dict[str, Any]:
    """``paths``, each operation that says no security of its own asking for an API token (and saying the
    401 and 403 that come without one), but for the paths anyone may read."""
    for path, operations in paths.items():
        for operation in operations.values():
            if "security" not in operation and path not in _OPEN:
                operation["security"] = _API
                operation["responses"] = {**operation["responses"], **_errors(401, 403)}
    return paths


def _job_paths() -> dict[str, Any]:
    """Jobs: list, register, read, command."""
    return {
        "/api/v1/jobs": {
            "get": {"summary": "List jobs", "parameters": _LIST_QUERY, "responses": {**_list_ok(), **_errors(400)}}
        },
        "/api/v1/namespaces/{namespace}/jobs": {
            "get": {
                "summary": "List the jobs of a namespace",
                "parameters": _NS + _LIST_QUERY[1:],
                "responses": {**_list_ok(), **_errors(400, 404)},
            },
            "post": {
                "summary": "Register a job (or a new attempt of a finished one); returns its write token",
                "parameters": _NS,
                "requestBody": _body(REGISTRATION),
                "responses": {
                    "201": {"description": "registered: {job, token}"},
                    **_errors(404, 409, 413, 422, 503),
                },
            },
        },
        "/api/v1/namespaces/{namespace}/jobs/{name}": {
            "get": {
                "summary": "Get a job",
                "parameters": [*_JOB, _query("attempt", {"type": "integer", "minimum": 1}, "an earlier attempt")],
                "responses": {**_ok("Job"), **_errors(404)},
            }
        },
        "/api/v1/namespaces/{namespace}/jobs/{name}/history": {
            "get": {
                "summary": "Metric history, downsampled keeping minima, maxima and non-finite points",
                "parameters": [
                    *_JOB,
                    _query("metrics", {"type": "string"}, "comma-separated metric names (default: all)"),
                    _query("max_points", {"type": "integer", "minimum": 2, "maximum": 10000}, "points per metric"),
                ],
                "responses": {"200": {"description": "{metrics: {name: [points]}}"}, **_errors(400, 404)},
            }
        },
        "/api/v1/namespaces/{namespace}/jobs/{name}/events": {
            "get": {
                "summary": "Events of a job",
                "parameters": [
                    *_JOB,
                    _query("after", {"type": "integer"}, "event id"),
                    _query("limit", {"type": "integer"}, "at most"),
                ],
                "responses": {"200": {"description": "{items: [events]}"}, **_errors(400, 404)},
            }
        },
        "/api/v1/namespaces/{namespace}/jobs/{name}/commands": {
            "get": {
                "summary": "Commands not yet acknowledged",
                "parameters": _JOB,
                "responses": {"200": {"description": "{items}"}, **_errors(404)},
            },
            "post": {
                "summary": "Ask the job to checkpoint or stop",
                "parameters": _JOB,
                "requestBody": _body(COMMAND_REQUEST),
                "responses": {**_ok("Command", 201, "queued"), **_errors(404, 409, 422)},
            },
        },
    }


def _writer_paths() -> dict[str, Any]:
    """What a job's processes write with its token: reports, how it ended, Kubeflow statuses."""
    return {
        "/api/v1/namespaces/{namespace}/jobs/{name}/reports": {
            "post": {
                "summary": "Report (training process): one rank's window of metrics; answers pending commands",
                "parameters": _JOB,
                "security": _BEARER,
                "requestBody": _body("Report"),
                "responses": {**_ok("ReportResponse"), **_errors(403, 404, 413, 422, 503)},
            }
        },
        "/api/v1/namespaces/{namespace}/jobs/{name}/state": {
            "post": {
                "summary": "Record how the job's process ended (the local runner)",
                "parameters": _JOB,
                "security": _BEARER,
                "requestBody": _body(STATE_CHANGE),
                "responses": {**_ok("Job"), **_errors(403, 404, 422)},
            }
        },
        "/apis/trainer.kubeflow.org/v1alpha1/namespaces/{namespace}/trainjobs/{name}/status": {
            "post": {
                "summary": "Kubeflow Trainer progress (KEP-2779), for upstream clients; echoes the payload",
                "parameters": _JOB,
                "security": _BEARER,
                "requestBody": _body("TrainerStatusBody"),
                "responses": {**_ok("TrainerStatusBody"), **_errors(403, 413, 422, 429, 503)},
            }
        },
    }


def _policy_paths() -> dict[str, Any]:
    """Policies (a job's layer, a namespace's) and the money they watch."""
    return {
        "/api/v1/namespaces/{namespace}/jobs/{name}/policy": {
            "get": {
                "summary": "The job's policy layer, its effective policy and what the policy did",
                "parameters": _JOB,
                "responses": {"200": {"description": "{job, effective, set_by, fired}"}, **_errors(404)},
            },
            "put": {
                "summary": "Replace the job's policy layer (applies at once; an event)",
                "parameters": _JOB,
                "requestBody": _body(POLICY),
                "responses": {"200": {"description": "{job, effective, set_by, fired}"}, **_errors(404, 422)},
            },
        },
        "/api/v1/costs": {
            "get": {
                "summary": "Money per namespace and overall: GPUs in use, $/h, spent, projected, wasted, saved",
                "parameters": [
                    _query("namespace", _NAME, "only this namespace"),
                    {
                        "name": "since",
                        "in": "query",
                        "schema": {"type": "number", "minimum": 0},
                        "description": "jobs live now or ended after this time (Unix seconds); default all",
                    },
                ],
                "responses": {"200": {"description": "{currency, total, namespaces: {ns: totals}}"}, **_errors(400)},
            }
        },
        "/api/v1/namespaces/{namespace}/policy": {
            "get": {
                "summary": "The namespace's policy layer over the server's",
                "parameters": _NS,
                "responses": {"200": {"description": "{namespace, policy, server, effective}"}, **_errors(404)},
            },
            "put": {
                "summary": "Replace the namespace's policy layer ({} clears it)",
                "parameters": _NS,
                "requestBody": _body(POLICY),
                "responses": {"200": {"description": "{namespace, policy, server, effective}"}, **_errors(404, 422)},
            },
        },
    }


def _meta_paths() -> dict[str, Any]:
    """The live stream, the version, the probes and Prometheus."""
    return {
        "/api/v1/events": {
            "get": {
                "summary": "Live updates (server-sent events: job, points, event); resumes from Last-Event-ID",
                "parameters": [
                    _query("namespace", _NAME, "only this namespace"),
                    _query("job", _NAME, "only this job"),
                ],
                "responses": {"200": {"description": "text/event-stream"}, **_errors(400, 404)},
            }
        },
        "/api/v1/version": {
            "get": {"summary": "Server and API version", "responses": {"200": {"description": "versions"}}}
        },
        "/healthz": {"get": {"summary": "Liveness and basic counters", "responses": {"200": {"description": "ok"}}}},
        "/metrics": {
            "get": {
                "summary": "Prometheus metrics: live jobs' progress, ETA, health and cost; totals per namespace",
                "responses": {
                    "200": {
                        "description": "Prometheus text exposition format 0.0.4",
                        "content": {"text/plain": {"schema": {"type": "string"}}},
                    }
                },
            }
        },
    }


def _access_paths() -> dict[str, Any]:
    """Who am I, API tokens and the audit log."""
    return {
        "/api/v1/whoami": {
            "get": {
                "summary": "The caller's identity and its roles over namespaces",
                "security": _API,
                "responses": {"200": {"description": "{who, auth, token_id, expires_at, grants}"}, **_errors(401)},
            }
        },
        "/api/v1/tokens": {
            "get": {
                "summary": "Every API token, never its secret (admin of every namespace)",
                "security": _API,
                "responses": {"200": {"description": "{items: [tokens]}"}, **_errors(401, 403)},
            },
            "post": {
                "summary": "Create an API token (admin of every namespace); its secret is in this answer only",
                "security": _API,
                "requestBody": _body(TOKEN_REQUEST),
                "responses": {"201": {"description": "{token, secret}"}, **_errors(401, 403, 409, 413, 422)},
            },
        },
        "/api/v1/tokens/{id}": {
            "delete": {
                "summary": "Revoke an API token (admin of every namespace): refused at once, on every replica",
                "security": _API,
                "parameters": [
                    {"name": "id", "in": "path", "required": True, "schema": {"type": "string", "maxLength": 64}},
                    _query("reason", {"type": "string"}, "why (in the audit log)"),
                ],
                "responses": {"200": {"description": "the revoked token"}, **_errors(401, 403, 404)},
            }
        },
        "/api/v1/audit": {
            "get": {
                "summary": "Who did what and why (commands, policy and token changes), oldest first",
                "security": _API,
                "parameters": [
                    _query("namespace", _NAME, "only this namespace"),
                    _query("job", _NAME, "only this job"),
                    _query("after", {"type": "integer", "minimum": 0}, "entry id"),
                    _query("limit", {"type": "integer", "minimum": 1, "maximum": 1000}, "at most"),
                ],
                "responses": {"200": {"description": "{items: [entries]}"}, **_errors(400, 401, 403)},
            }
        },
    }
