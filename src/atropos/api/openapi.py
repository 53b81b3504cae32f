"""The OpenAPI document of the trajectory API, generated from the msgspec wire structs.

The same structs validate requests, so the document cannot drift from what the server checks.
It serves `GET /openapi.json` and drives the schema fuzz test.
"""

from __future__ import annotations

import functools
from typing import Any

import msgspec

from atropos import __version__, wire

_REF = "#/components/schemas/{name}"


def _body(name: str, ref: dict[str, Any]) -> dict[str, Any]:
    return {"required": True, "content": {"application/json": {"schema": ref}}}


@functools.cache
def openapi_document() -> dict[str, Any]:
    """Build the OpenAPI 3.1 document (cached; it never changes at run time).

    Long because it is the document: a table of paths and their schemas.
    """
    kinds = [
        wire.Registration,
        wire.RegisterEnv,
        wire.EnvIdentifier,
        wire.BatchAck,
        wire.PolicyPublished,
        wire.Group,
        wire.EnvStatusRequest,
        wire.EvalResult,
    ]
    (reg, env, ident, ack, published, group, env_status, evaluated), components = (
        msgspec.json.schema_components(kinds, ref_template=_REF)
    )
    ok = {"200": {"description": "OK", "content": {"application/json": {"schema": {}}}}}
    bad = {"description": "the body breaks a rule; the message names the field"}
    data = {**ok, "413": bad, "422": bad, "404": bad, "400": bad}

    def get(summary: str, **extra: Any) -> dict[str, Any]:
        return {"get": {"summary": summary, "responses": ok, **extra}}

    def integer(name: str, low: int, high: int) -> dict[str, Any]:
        schema = {"type": "integer", "minimum": low, "maximum": high}
        return {"name": name, "in": "query", "required": False, "schema": schema}

    def post(summary: str, schema: dict[str, Any], responses: dict[str, Any]) -> dict[str, Any]:
        return {
            "post": {
                "summary": summary,
                "requestBody": _body(summary, schema),
                "responses": responses,
            }
        }

    rollouts_query = [integer("after", -1, 2**62), integer("limit", 1, 1000)]
    env_query = [{"name": "env_id", "in": "query", "required": True, "schema": {"type": "integer"}}]
    lease_query = [
        {
            "name": "lease",
            "in": "query",
            "required": False,
            "schema": {"type": "number", "exclusiveMinimum": 0, "maximum": 604800},
        }
    ]
    paths: dict[str, Any] = {
        "/": get("liveness"),
        "/health": get("health"),
        "/register": post("register the trainer", reg, {**ok, "422": bad}),
        "/register-env": post("register an environment", env, {**ok, "422": bad}),
        "/disconnect-env": post("disconnect an environment", ident, {**ok, "404": bad, "422": bad}),
        "/wandb_info": get("wandb group and project"),
        "/info": get("batch size and max token length"),
        "/batch": get("next batch", parameters=lease_query),
        "/batch/ack": post("acknowledge a leased batch", ack, {**ok, "404": bad, "422": bad}),
        "/policy_version": post(
            "the trainer: the servers now serve this step's weights", published, {**ok, "422": bad}
        ),
        "/eval_results": post(
            "an env's evaluation of one policy version", evaluated, {**ok, "404": bad, "422": bad}
        ),
        "/latest_example": get("most recent group"),
        "/scored_data": post("push one group", group, data),
        "/scored_data_list": post("push several groups", {"type": "array", "items": group}, data),
        "/status": get("step and queue size"),
        "/status-env": {
            **get("per-env status", parameters=env_query),
            **post(
                "per-env status; the env's own drop and failure counts (optional)",
                env_status,
                {**ok, "404": bad, "422": bad},
            ),
        },
        "/reset_data": {"post": {"summary": "forget everything", "responses": ok}},
        "/stats": get("statistics"),
        "/stats/history": get("statistics sampled over the last hour"),
        "/rollouts": get(
            "recently accepted groups, read-only",
            parameters=rollouts_query,
            responses={**ok, "422": bad},
        ),
        "/metrics": get("Prometheus metrics"),
    }
    return {
        "openapi": "3.1.0",
        "info": {"title": "Atropos trajectory API", "version": __version__},
        "paths": paths,
        "components": {"schemas": components},
    }
