"""The request bodies of the native API, each declared once (see :mod:`..views.bodyspec`): the routes read them
with :func:`read_declared`, ``/openapi.json`` shows them (:data:`DECLARED`). A policy layer's declaration
is :data:`..policies.model.POLICY`: settings and stored policies are read with it too.

Not here: the report and the Kubeflow status, the wire format of :mod:`stepwatch.protocol`.
"""

from __future__ import annotations

import re
from typing import Any

from starlette.requests import Request

from ...protocol import COMMAND_KINDS, LIMITS, validate_params
from ..policies.model import POLICY
from ..store import ROLES
from ..store.access import ALL_NAMESPACES
from ..views.bodyspec import Body, BodyError, Field
from .errors import ApiError
from .request import read_json

__all__ = [
    "COMMAND_REQUEST",
    "DECLARED",
    "MAX_NUMBER",
    "REGISTRATION",
    "STATE_CHANGE",
    "TOKEN_REQUEST",
    "kubernetes_name",
    "read_declared",
]

NAME_PATTERN = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
"""A Kubernetes DNS-1123 label, as ``protocol.is_valid_name`` reads it (tests/server/api/test_bodies.py checks
that they agree)."""
MAX_NUMBER = 1e9
"""Largest GPU count, price or epoch count: a cost of GPUs x price x hours stays a finite float (a larger
one overflowed to infinity, and the job's views became 500s)."""
MAX_EXPIRY_S = 10 * 366 * 86400.0
"""The longest life of an API token: ten years."""


def kubernetes_name(key: str, description: str, *, required: bool = False, example: str | None = None) -> Field:
    """A job or namespace name: a Kubernetes name, so that it can be a TrainJob's."""
    return Field(
        key=key,
        type="string",
        required=required,
        max_length=LIMITS.max_name_length,
        pattern=NAME_PATTERN,
        what=f"1-{LIMITS.max_name_length} lowercase letters, digits or '-', starting and ending with a letter or "
        "digit (a Kubernetes name)",
        description=description,
        example=example,
    )


REASON = Field(
    key="reason",
    type="string",
    max_length=LIMITS.max_reason_length,
    default="",
    description="why (in the job's events and the audit log)",
)

REGISTRATION = Body(
    "Registration",
    (
        kubernetes_name("name", "the job's name", required=True, example="llama-finetune"),
        Field(
            key="params",
            type="object",
            max_properties=LIMITS.max_params,
            check=validate_params,
            description=f"hyperparameters: a flat object of strings, numbers, booleans and nulls (keys of "
            f"1-{LIMITS.max_param_key_length} printable characters, strings of at most "
            f"{LIMITS.max_param_value_length})",
        ),
        Field(key="total_steps", type="integer", minimum=1, maximum=LIMITS.max_integer, description="steps to take"),
        Field(key="total_epochs", type="number", minimum=0, maximum=MAX_NUMBER, description="epochs to take"),
        Field(key="gpus", type="number", minimum=0, maximum=MAX_NUMBER, default=0.0, description="GPUs the job holds"),
        Field(
            key="gpu_hour_cost",
            type="number",
            minimum=0,
            maximum=MAX_NUMBER,
            default=0.0,
            description="price of one GPU hour (default: the server's price for the namespace and GPU type)",
        ),
        Field(
            key="gpu_type",
            type="string",
            min_length=1,
            max_length=64,
            printable=True,
            what="a GPU type such as a100 or h100 (1-64 printable characters)",
            description="the GPU model, for the server's price list (kept in lowercase)",
            example="h100",
        ),
        Field(
            key="source",
            type="string",
            choices=("native", "runner", "kubeflow"),
            default="native",
            description="what reports: the report core, the local runner or a Kubeflow client",
        ),
        Field(
            key="supersede",
            type="boolean",
            default=False,
            description="mark a live attempt failed and start a new one",
        ),
        Field(key="policy", type="object", body=POLICY, description="the job's policy layer"),
    ),
    description="A job (or a new attempt of an ended one); the answer holds its write token.",
)

STATE_CHANGE = Body(
    "StateChange",
    (
        Field(
            key="state",
            type="string",
            required=True,
            choices=("running", "finished", "failed", "stopped"),
            description="how the job's process ended (running: it started)",
        ),
        Field(
            key="exit_code",
            type="integer",
            # 32 bits: the column's type on PostgreSQL (a larger one was a 500 from the database driver)
            minimum=-(2**31),
            maximum=2**31 - 1,
            what="an integer (a 32-bit exit status)",
            description="the process's exit status",
        ),
        REASON,
    ),
    description="How the job's process ended, as the local runner saw it.",
)

COMMAND_REQUEST = Body(
    "CommandRequest",
    (
        Field(key="kind", type="string", required=True, choices=COMMAND_KINDS, description="what the job should do"),
        REASON,
    ),
    description="A command for the job, handed to it with the answer to its next report.",
)

TOKEN_REQUEST = Body(
    "TokenRequest",
    (
        Field(
            key="role",
            type="string",
            required=True,
            choices=ROLES,
            description="viewer reads; editor also registers jobs, sends commands and sets policies; admin also "
            "manages tokens",
        ),
        Field(
            key="namespaces",
            type="array",
            required=True,
            min_items=1,
            items=Field(
                key="",
                type="string",
                max_length=LIMITS.max_name_length,
                pattern=f"{NAME_PATTERN}|{re.escape(ALL_NAMESPACES)}",
                what="a namespace name, or * for all",
                example="team-a",
            ),
            what='a list of namespace names, or ["*"] for all',
            description='the namespaces the role holds in, or ["*"] for all',
        ),
        Field(
            key="name",
            type="string",
            required=True,
            min_length=1,
            max_length=64,
            printable=True,
            description="what the token is for (in the audit log)",
            example="ci",
        ),
        Field(
            key="expires_in",
            type="number",
            above=0,
            maximum=MAX_EXPIRY_S,
            what="seconds, above 0 and at most ten years",
            description="seconds until it expires (default: never)",
        ),
        REASON,
    ),
    description="An API token to make; its secret is in the answer only.",
)

DECLARED = (REGISTRATION, POLICY, STATE_CHANGE, COMMAND_REQUEST, TOKEN_REQUEST)
"""Every declared body, for OpenAPI's components."""


async def read_declared(request: Request, body: Body) -> dict[str, Any]:
    """The request's JSON body read by its declaration (see ``Body.read``), or 422 naming the field."""
    data = await read_json(request)
    try:
        return body.read(data)
    except BodyError as exc:
        raise ApiError(422, str(exc), exc.field or None) from None
