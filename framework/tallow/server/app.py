"""The Starlette application: routes, middleware, error handling, plugin routes.

:func:`build_app` wires an engine (anything following the ``AsyncEngine`` contract) into an
ASGI app. The engine loop is started and stopped by the app's lifespan, so the same app serves
under uvicorn and under Starlette's test client.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from typing import AsyncIterator, Awaitable, Callable

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.types import Scope

import tallow
from tallow.config import TallowConfig

from .chat_endpoint import create_chat_completion
from .completions import create_completion
from .embeddings import create_embedding
from .errors import APIError, from_exception, invalid
from .messages import normalize_messages
from .metrics import CONTENT_TYPE
from .middleware import APIKeyAuth, BodyLimit, StatusCounter
from .parsers import ToolParsing, choose_tool_parser
from .reasoning import ReasoningParsing, choose_reasoning_parser
from .openapi import BODY_ERRORS, GENERATION_ERRORS, Endpoint, openapi_document
from .protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    EmbeddingRequest,
    TokenizeRequest,
    check_model,
    parse_json_body,
    parse_request,
)
from .responses import (
    ChatCompletionResponse,
    CompletionResponse,
    DetokenizeResponse,
    EmbeddingResponse,
    HealthResponse,
    ModelCard,
    ModelList,
    PluginsResponse,
    TokenizeResponse,
    ToolsResponse,
    VersionResponse,
)
from .served import ServedEngine
from .state import ServerState
from .tool_providers import ToolProviders
from .tools import validate_tools

log = logging.getLogger("tallow.server")

#: Where a web UI plugin serves the UI when ``server.ui`` is on.
UI_PATH = "/ui"

#: Paths that need the API key when one is configured (the OpenAI API and its helpers).
PROTECTED_PREFIXES = ("/v1/", "/tokenize", "/detokenize")

Handler = Callable[[ServerState, Request, dict[str, object]], Awaitable[Response]]


def _json_endpoint(
    state: ServerState, handler: Handler
) -> Callable[[Request], Awaitable[Response]]:
    """A POST endpoint that reads a JSON body and answers every failure OpenAI-style."""

    async def endpoint(request: Request) -> Response:
        try:
            body = parse_json_body(await request.body())
            return await handler(state, request, body)
        except ClientDisconnect:  # the client left before sending its whole body: not an error
            log.info(
                "%s %s: the client closed the connection before its request body was complete",
                request.method,
                request.url.path,
            )
            return Response(status_code=499)
        except APIError as exc:
            return exc.response()
        except Exception as exc:  # a bug: logged with its traceback, never sent to the client
            return from_exception(exc).response()

    return endpoint


def _get_endpoint(
    state: ServerState, handler: Callable[[ServerState, Request], Awaitable[Response]]
) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        try:
            return await handler(state, request)
        except APIError as exc:
            return exc.response()
        except Exception as exc:
            return from_exception(exc).response()

    return endpoint


# -- small endpoints ------------------------------------------------------------------------
def _model_card(state: ServerState) -> dict[str, object]:
    card: dict[str, object] = {
        "id": state.model_name,
        "object": "model",
        "created": state.created,
        "owned_by": "tallow",
        "root": state.model_name,
        "parent": None,
        "max_model_len": state.max_model_len,
        "task": state.task,
    }
    info = getattr(state.engine, "embedding", None)
    if info is not None:
        card["embedding"] = info.describe()
    return card


async def list_models(state: ServerState, request: Request) -> Response:
    return JSONResponse({"object": "list", "data": [_model_card(state)]})


async def get_model(state: ServerState, request: Request) -> Response:
    check_model(request.path_params["model"], state.served_names)
    return JSONResponse(_model_card(state))


async def health(state: ServerState, request: Request) -> Response:
    """200 with the engine's load while it serves, 503 once its loop has failed."""
    error = getattr(state.engine, "error", None)
    stats = state.engine.stats()
    body: dict[str, object] = {
        "status": "ok" if error is None else "error",
        "model": state.model_name,
        **{
            k: stats.get(k)
            for k in (
                "num_waiting",
                "num_running",
                "kv_usage",
                "num_free_blocks",
                "num_total_blocks",
                "kv_capacity_tokens",
                "prefix_cache_hit_rate",
            )
            if k in stats
        },
        "server_inflight": state.inflight,
    }
    if error is not None:
        body["error"] = f"{type(error).__name__}: {error}"
    return JSONResponse(body, status_code=200 if error is None else 503)


async def version(state: ServerState, request: Request) -> Response:
    return JSONResponse({"version": tallow.__version__})


async def metrics(state: ServerState, request: Request) -> Response:
    return Response(state.metrics.render(), media_type=CONTENT_TYPE)


def _describe_status(status: object) -> dict[str, object]:
    if hasattr(status, "to_dict"):
        described: dict[str, object] = status.to_dict()
        return described
    if dataclasses.is_dataclass(status) and not isinstance(status, type):
        return {
            k: (str(v) if not isinstance(v, (str, int, float, bool, list, dict, type(None))) else v)
            for k, v in dataclasses.asdict(status).items()
        }
    return dict(vars(status))


async def plugins(state: ServerState, request: Request) -> Response:
    pm = getattr(state.engine, "plugin_manager", None)
    if pm is None:
        return JSONResponse({"object": "list", "plugins": [], "components": {}})
    statuses = [_describe_status(s) for s in pm.statuses()]
    components = {reg.kind: [e.describe() for e in reg] for reg in pm.registries.all()}
    selected = state.tool_parsing.describe()
    if state.reasoning.name is not None:
        selected.update(state.reasoning.describe())
    structured = state.structured
    if structured is not None:
        entry = structured.entry  # set exactly when the backend is available
        selected["grammar_backend"] = entry.name if entry is not None else None
    return JSONResponse(
        {
            "object": "list",
            "plugins": statuses,
            "components": components,
            "selected": selected,
            "tool_providers": state.tool_providers.statuses(),
        }
    )


async def tokenize(state: ServerState, request: Request, body: dict[str, object]) -> Response:
    req = parse_request(TokenizeRequest, body)
    check_model(req.model, state.served_names)
    if (req.prompt is None) == (req.messages is None):
        raise invalid("prompt", "Give exactly one of 'prompt' or 'messages'.")
    if req.messages is not None:
        tools = validate_tools(req.tools) if req.tools else None
        text = await state.render_chat(
            normalize_messages(req.messages),
            tools,
            add_generation_prompt=req.add_generation_prompt is not False,
        )
        add_special = bool(req.add_special_tokens)
    else:
        text = req.prompt or ""
        add_special = req.add_special_tokens is not False
    ids = await state.encode(text, add_special_tokens=add_special)
    return JSONResponse({"tokens": ids, "count": len(ids), "max_model_len": state.max_model_len})


async def detokenize(state: ServerState, request: Request, body: dict[str, object]) -> Response:
    req = parse_request(DetokenizeRequest, body)
    check_model(req.model, state.served_names)
    vocab = getattr(state.tokenizer, "vocab_size", None)
    for i, token in enumerate(req.tokens):
        if token < 0 or (vocab and token >= vocab):
            raise invalid(
                f"tokens[{i}]",
                f"Invalid value for 'tokens[{i}]': {token} is not a "
                f"token id of this model (0..{(vocab or 1) - 1}).",
            )
    text = state.tokenizer.decode(req.tokens, skip_special_tokens=bool(req.skip_special_tokens))
    return JSONResponse({"prompt": text})


async def list_server_tools(state: ServerState, request: Request) -> Response:
    """``GET /v1/tools``: the tools the server runs itself, per provider, and the defaults."""
    config = getattr(state.config, "server", None)
    return JSONResponse(
        {
            "object": "list",
            "server_tools": getattr(config, "server_tools", "off"),
            "max_tool_rounds": getattr(config, "max_tool_rounds", 8),
            "providers": await state.tool_providers.describe(),
        }
    )


# -- assembly -------------------------------------------------------------------------------
def _plugin_routes(state: ServerState) -> list[BaseRoute]:
    pm = getattr(state.engine, "plugin_manager", None)
    if pm is None:
        return []
    routes: list[BaseRoute] = []
    for entry in pm.registries.routes:
        try:
            target = entry.load()
            if entry.meta.get("factory"):  # the plugin decides from the config what it serves
                target = target(state.config)
        except Exception as exc:
            log.error("route %s from %s cannot be loaded: %s", entry.name, entry.distribution, exc)
            continue
        if target is None:
            log.debug(
                "route %s from %s: not served under this configuration",
                entry.name,
                entry.distribution,
            )
            continue
        if entry.meta.get("mount"):
            routes.append(Mount(entry.name, app=target))
        else:
            routes.append(
                Route(entry.name, target, methods=list(entry.meta.get("methods", ("GET",))))
            )
        log.info("route %s from %s", entry.name, entry.distribution)
    return routes


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        return APIError(
            404, f"No such endpoint: {request.method} {request.url.path}.", code="not_found"
        ).response()
    if exc.status_code == 405:
        return APIError(
            405,
            f"Method {request.method} is not allowed on {request.url.path}.",
            code="method_not_allowed",
            headers=dict(exc.headers or {}),
        ).response()
    return APIError(exc.status_code, str(exc.detail)).response()


async def _server_error(request: Request, exc: Exception) -> Response:
    return from_exception(exc).response()


def _endpoints() -> list[Endpoint]:
    """Every built-in route; the app and its OpenAPI document are both made from this table."""
    return [
        Endpoint(
            "POST",
            "/v1/chat/completions",
            create_chat_completion,
            "Chat completion",
            ChatCompletionRequest,
            ChatCompletionResponse,
            streams=True,
            errors=GENERATION_ERRORS,
        ),
        Endpoint(
            "POST",
            "/v1/completions",
            create_completion,
            "Text completion",
            CompletionRequest,
            CompletionResponse,
            streams=True,
            errors=GENERATION_ERRORS,
        ),
        Endpoint(
            "POST",
            "/v1/embeddings",
            create_embedding,
            "Embeddings of texts or token ids",
            EmbeddingRequest,
            EmbeddingResponse,
            errors=GENERATION_ERRORS,
        ),
        Endpoint(
            "POST",
            "/tokenize",
            tokenize,
            "Token ids of a prompt or a conversation",
            TokenizeRequest,
            TokenizeResponse,
            errors=BODY_ERRORS + ((404, "Unknown model."),),
        ),
        Endpoint(
            "POST",
            "/detokenize",
            detokenize,
            "Text of token ids",
            DetokenizeRequest,
            DetokenizeResponse,
            errors=BODY_ERRORS + ((404, "Unknown model."),),
        ),
        Endpoint("GET", "/v1/models", list_models, "The served model", response=ModelList),
        Endpoint(
            "GET",
            "/v1/models/{model:path}",
            get_model,
            "One served model",
            response=ModelCard,
            errors=((404, "The model is not served here."),),
        ),
        Endpoint(
            "GET",
            "/health",
            health,
            "The engine's state and load",
            response=HealthResponse,
            errors=((503, "The engine has failed."),),
        ),
        Endpoint("GET", "/version", version, "The server's version", response=VersionResponse),
        Endpoint("GET", "/metrics", metrics, "Prometheus metrics", media_type=CONTENT_TYPE),
        Endpoint(
            "GET", "/v1/plugins", plugins, "Plugins and their components", response=PluginsResponse
        ),
        Endpoint(
            "GET",
            "/v1/tools",
            list_server_tools,
            "The tools the server runs itself, per tool provider",
            response=ToolsResponse,
        ),
    ]


def _is_protected(path: str) -> bool:
    return path.startswith(PROTECTED_PREFIXES)


#: how often the lifespan looks at the engine's ``error`` (a failed engine loop)
_ENGINE_WATCH_S = 0.2


async def _watch_engine(
    engine: ServedEngine, on_engine_dead: Callable[[BaseException], None]
) -> None:
    """Call ``on_engine_dead(error)`` once the engine's loop has failed."""
    while True:
        error = getattr(engine, "error", None)
        if error is not None:
            log.critical(
                "the engine has failed (%s: %s): every request gets 503 "
                "engine_dead and the server stops",
                type(error).__name__,
                error,
            )
            on_engine_dead(error)
            return
        await asyncio.sleep(_ENGINE_WATCH_S)


def build_app(
    engine: ServedEngine,
    config: TallowConfig | None = None,
    *,
    tool_parsing: ToolParsing | None = None,
    tool_providers: ToolProviders | None = None,
    reasoning: ReasoningParsing | None = None,
    manage_engine: bool = True,
    on_engine_dead: Callable[[BaseException], None] | None = None,
) -> Starlette:
    """The ASGI app serving ``engine``.

    ``tool_parsing`` is the tool parsers to use (None: chosen from the engine's plugin
    manager and ``config.server.tool_parser`` by :func:`tallow.server.parsers.choose_tool_parser`,
    which raises :class:`tallow.server.parsers.ToolParserError` for an unusable named parser).
    ``tool_providers`` is the tools the server runs itself (None: every registered tool
    provider that has something to offer under ``config``); the lifespan starts and stops them.
    ``reasoning`` is the reasoning parser (None: the one ``config.server.reasoning_parser``
    names, or for ``auto`` the one matching the model, by
    :func:`tallow.server.reasoning.choose_reasoning_parser`, which raises
    :class:`tallow.server.reasoning.ReasoningParserError` for an unknown name; none for
    ``none``).
    With ``manage_engine`` the app's lifespan starts the engine loop and shuts it down.
    ``on_engine_dead(error)`` is called once if the engine's loop fails (``tallow serve``
    stops the server and exits with status 1, so a supervisor restarts it); until then
    ``/health`` answers 503.
    """
    if tool_parsing is None:
        tool_parsing = choose_tool_parser(engine, config)
    if tool_providers is None:
        tool_providers = ToolProviders.from_plugins(getattr(engine, "plugin_manager", None), config)
    if reasoning is None:
        reasoning = choose_reasoning_parser(engine, config)
    state = ServerState(engine, config, tool_parsing, tool_providers, reasoning)
    endpoints = _endpoints()
    routes: list[BaseRoute] = [
        Route(
            ep.path,
            (_json_endpoint if ep.method == "POST" else _get_endpoint)(state, ep.handler),
            methods=[ep.method],
        )
        for ep in endpoints
    ]
    extra = _plugin_routes(state)
    server = getattr(config, "server", None)
    keys = list(getattr(server, "api_keys", None) or [])
    document = openapi_document(
        endpoints,
        [(r.path, sorted(r.methods or ("GET",))) for r in extra if isinstance(r, Route)],
        _is_protected,
        bool(keys),
    )

    async def openapi(request: Request) -> Response:
        return JSONResponse(document)

    routes += [Route("/openapi.json", openapi, methods=["GET"])] + extra
    templates = {r.path for r in routes if isinstance(r, Route)}

    def endpoint_of(scope: Scope) -> str:
        path: str = scope.get("path", "")
        if path in templates:
            return path
        if path.startswith("/v1/models/"):
            return "/v1/models/{model}"
        return "other"

    middleware = [
        Middleware(StatusCounter, counter=state.metrics.http_requests, endpoint_of=endpoint_of),
        Middleware(APIKeyAuth, keys=keys, protected_prefixes=PROTECTED_PREFIXES),
        Middleware(BodyLimit, max_bytes=int(getattr(server, "max_body_bytes", 33554432))),
    ]

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if manage_engine:
            await engine.start()
        await tool_providers.start()
        watch = (
            asyncio.create_task(_watch_engine(engine, on_engine_dead))
            if on_engine_dead is not None
            else None
        )
        try:
            yield
        finally:
            if watch is not None:
                watch.cancel()
            await tool_providers.stop()
            if manage_engine:
                await engine.shutdown()

    app = Starlette(
        routes=routes,
        middleware=middleware,
        lifespan=lifespan,
        exception_handlers={HTTPException: _http_error, Exception: _server_error},
    )
    app.state.tallow = state
    return app
