"""``POST /v1/chat/completions``: the server's tool loop (:mod:`.tool_loop`) when the request
uses tools the server runs itself, the plain chat handler (:class:`.chat.ChatCompletion`) else.
The choice lives here, above both, because the tool loop builds on the chat handler."""

from __future__ import annotations

from .chat import ChatCompletion
from .protocol import ChatCompletionRequest
from .serving import Handler
from .state import ServerState
from .tool_loop import ToolLoop, wants_server_tools


class ChatEndpoint(ChatCompletion):
    """The chat handler as served: hands requests with server tools to the tool loop."""

    @classmethod
    async def create(cls, state: ServerState, req: ChatCompletionRequest) -> Handler:
        if wants_server_tools(state, req):
            return ToolLoop(state, req, await state.tool_providers.tools())
        return ChatCompletion(state, req)


create_chat_completion = ChatEndpoint.serve
