"""``GET /openapi.json``: the OpenAPI 3.1 document of the server, built from its route table.

Request bodies come from the protocol models (:mod:`.protocol`), response bodies from
:mod:`.responses`, through pydantic's JSON Schema generation; the paths, methods and the API-key
requirement come from the same :class:`Endpoint` table that builds the app's routes, so the
document cannot list a route the app lacks or miss one it has. Routes added by plugins are
listed with their methods and auth, without body schemas (a plugin's route is an opaque app).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Awaitable, Callable

from pydantic import BaseModel
from starlette.responses import Response

import tallow

from .responses import ErrorResponse

_REF = "#/components/schemas/{model}"


@dataclass(frozen=True)
class Endpoint:
    """One route of the server: what it answers and how it is described."""

    method: str
    path: str
    handler: Callable[..., Awaitable[Response]]  # (state, request[, body])
    summary: str
    request: type[BaseModel] | None = None
    response: type[BaseModel] | None = None
    #: the response may be a server-sent event stream (``stream: true``)
    streams: bool = False
    #: the media type of a non-JSON 200 response (``/metrics``)
    media_type: str | None = None
    #: statuses this route may answer besides 200, with what they mean
    errors: tuple[tuple[int, str], ...] = ()


#: The failures of every endpoint that reads a JSON body.
BODY_ERRORS = (
    (400, "Invalid request: the error names the field at fault."),
    (413, "The request body is over server.max_body_bytes."),
)
#: The failures of an endpoint that runs the model, besides those of its body.
GENERATION_ERRORS = BODY_ERRORS + (
    (404, "The model named in the request is not served here."),
    (429, "The engine's waiting queue is full; retry (Retry-After)."),
    (503, "The server holds server.max_queue requests, or the engine has failed."),
)


class _Schemas:
    """Collects component schemas; each model is generated once, under its own name."""

    def __init__(self) -> None:
        self.components: dict[str, object] = {}

    def ref(self, model: type[BaseModel]) -> dict[str, object]:
        if model.__name__ not in self.components:
            schema = model.model_json_schema(ref_template=_REF)
            for name, sub in schema.pop("$defs", {}).items():
                self.components.setdefault(name, sub)
            self.components[model.__name__] = schema
        return {"$ref": _REF.format(model=model.__name__)}


def _json(schema: dict[str, object]) -> dict[str, object]:
    return {"application/json": {"schema": schema}}


def _operation(ep: Endpoint, schemas: _Schemas, secured: bool) -> dict[str, object]:
    ok: dict[str, object] = {"description": "Success."}
    if ep.media_type:
        ok["content"] = {ep.media_type: {"schema": {"type": "string"}}}
    elif ep.response is not None:
        content = _json(schemas.ref(ep.response))
        if ep.streams:
            content["text/event-stream"] = {
                "schema": {
                    "type": "string",
                    "description": "Server-sent events, 'data: <chunk JSON>' "
                    "each, ending with 'data: [DONE]'.",
                }
            }
        ok["content"] = content
    responses: dict[str, object] = {"200": ok}
    error = schemas.ref(ErrorResponse)
    for status, why in ep.errors:
        responses[str(status)] = {"description": why, "content": _json(error)}
    if secured:
        responses["401"] = {"description": "Missing or wrong API key.", "content": _json(error)}
    op: dict[str, object] = {
        "summary": ep.summary,
        "operationId": _operation_id(ep),
        "responses": responses,
        "security": [{"bearerAuth": []}] if secured else [],
    }
    if ep.request is not None:
        op["requestBody"] = {"required": True, "content": _json(schemas.ref(ep.request))}
    params = [
        part[1:-1].split(":")[0]
        for part in ep.path.split("/")
        if part.startswith("{") and part.endswith("}")
    ]
    if params:
        op["parameters"] = [
            {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
            for name in params
        ]
    return op


def _operation_id(ep: Endpoint) -> str:
    words = [w for w in ep.path.replace("{", "").replace("}", "").split("/") if w]
    return ep.method.lower() + "_" + "_".join(w.split(":")[0] for w in words)


def openapi_document(
    endpoints: list[Endpoint],
    plugin_routes: list[tuple[str, list[str]]],
    is_protected: Callable[[str], bool],
    keys_required: bool,
) -> dict[str, object]:
    """The document for ``endpoints`` and the plugins' ``(path, methods)`` routes.

    ``is_protected(path)`` says whether a path needs the API key when keys are configured;
    ``keys_required`` whether any are (without keys every route is open, and the document says
    so by listing no security requirement).
    """
    schemas = _Schemas()
    paths: dict[str, dict[str, object]] = {}
    for ep in endpoints:
        path = ep.path.replace(":path}", "}")
        secured = keys_required and is_protected(ep.path)
        paths.setdefault(path, {})[ep.method.lower()] = _operation(ep, schemas, secured)
    for path, methods in plugin_routes:
        secured = keys_required and is_protected(path)
        for method in methods:
            paths.setdefault(path, {})[method.lower()] = {
                "summary": "A route added by a plugin.",
                "responses": {"200": {"description": "Defined by the plugin."}},
                "security": [{"bearerAuth": []}] if secured else [],
            }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "tallow",
            "version": tallow.__version__,
            "description": "An OpenAI-compatible inference server.",
        },
        "paths": paths,
        "components": {
            "schemas": schemas.components,
            "securitySchemes": {
                "bearerAuth": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "One of server.api_keys, as 'Authorization: Bearer <key>'.",
                }
            },
        },
    }
