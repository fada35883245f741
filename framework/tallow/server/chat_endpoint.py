"""``POST /v1/chat/completions``: the server's tool loop (:mod:`.tool_loop`) when the request
uses tools the server runs itself, the plain chat handler (:class:`.chat.ChatCompletion`) else.
The choice lives here, above both, because the tool loop builds on the chat handler."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from .chat import ChatCompletion
from .generation import run_generation
from .protocol import ChatCompletionRequest, check_model, parse_request, reject_unsupported
from .state import ServerState
from .tool_loop import create_with_server_tools, wants_server_tools


async def create_chat_completion(state: ServerState, request: Request,
                                 body: dict[str, Any]) -> Response:
    req = parse_request(ChatCompletionRequest, body)
    check_model(req.model, state.served_names)
    state.require_generation("/v1/chat/completions")
    reject_unsupported(req)
    if wants_server_tools(state, req):
        return await create_with_server_tools(state, request, req)
    handler = ChatCompletion(state, req)
    ids, params, prompt = await handler.prepare()
    return await run_generation(
        state, request, lambda: state.engine.generate(ids, params, handler.id, prompt=prompt,
                                                      priority=req.priority or 0),
        "messages", bool(req.stream), handler.respond, handler.stream, handler.timer, req.n or 1)
