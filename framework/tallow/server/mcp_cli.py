"""``tallow mcp``: the loaded model as an MCP server on stdio, for MCP hosts.

It offers two tools: ``generate`` (continue a text) and ``chat`` (answer a conversation,
rendered with the model's chat template). The engine is the same ``AsyncEngine`` that
``tallow serve`` runs, with every engine setting as a flag; the protocol is the official
``mcp`` SDK's (``pip install 'tallow[mcp]'``), imported only when this command runs. Stdout
carries the protocol, so logs go to stderr.

This is a frontend of the core, like ``serve``; ``tallow serve`` itself never imports the SDK
(the server's tool loop knows tool providers only through ``tallow.plugin.ToolProvider``).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
from typing import TYPE_CHECKING, Annotated, AsyncIterator, Literal

from pydantic import BaseModel, Field

if TYPE_CHECKING:
    from mcp.server.mcpserver import MCPServer

    from tallow.engine.async_engine import AsyncEngine

log = logging.getLogger("tallow.mcp")


def add_parser(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
) -> argparse.ArgumentParser:
    """Add the ``mcp`` subcommand to ``subparsers``; its ``func`` is :func:`run`."""
    from tallow.config import add_config_arguments

    parser = subparsers.add_parser(
        "mcp",
        help="serve the model to MCP hosts over stdio (tools generate and chat)",
        description="Run an MCP server on stdin/stdout whose tools generate and chat with the "
        "model (default: the embedded Qwen2.5-Coder-0.5B-Instruct). Logs go to stderr.",
    )
    add_config_arguments(parser)
    parser.set_defaults(func=run)
    return parser


class Message(BaseModel):
    """One message of a conversation."""

    role: Literal["system", "user", "assistant"]
    content: str


MaxTokens = Annotated[
    int, Field(ge=1, description="Most tokens to generate (cut to what the context leaves).")
]
Temperature = Annotated[
    float,
    Field(
        ge=0.0,
        le=2.0,
        description="Sampling temperature; 0 picks the most likely token every time.",
    ),
]


def build_server(engine: AsyncEngine) -> MCPServer:
    """An ``MCPServer`` whose tools run ``engine`` (an ``AsyncEngine``, started and shut down
    with the server)."""
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError

    from tallow.engine.sampling.params import SamplingParams

    @contextlib.asynccontextmanager
    async def lifespan(server: MCPServer) -> AsyncIterator[dict[str, object]]:
        await engine.start()
        try:
            yield {}
        finally:
            await engine.shutdown()

    app = MCPServer(
        f"tallow ({engine.model_name})",
        lifespan=lifespan,
        instructions=f"Generate text with the local model {engine.model_name}.",
    )
    counter = iter(range(1 << 62))

    async def complete(
        ids: list[int], prompt: str, max_tokens: int, temperature: float, stop: list[str]
    ) -> str:
        room = int(engine.max_model_len) - len(ids)
        if room <= 0:
            raise ValueError(
                f"the prompt has {len(ids)} tokens; the model's context holds "
                f"{engine.max_model_len}"
            )
        params = SamplingParams(
            max_tokens=min(max_tokens, room), temperature=temperature, stop=list(stop)
        )
        text = ""
        async for out in engine.generate(ids, params, f"mcp-{next(counter)}", prompt=prompt):
            text = out.outputs[0].text
        return text

    @app.tool()
    async def generate(
        prompt: str,
        max_tokens: MaxTokens = 256,
        temperature: Temperature = 0.0,
        stop: list[str] | None = None,
    ) -> str:
        """Continue ``prompt`` with the model (a plain text completion) and return the
        continuation."""
        try:
            ids = list(engine.tokenizer.encode(prompt, add_special_tokens=True))
            return await complete(ids, prompt, max_tokens, temperature, stop or [])
        except ValueError as exc:  # a request the model cannot serve: the caller's to fix
            raise ToolError(str(exc)) from None

    @app.tool()
    async def chat(
        messages: list[Message], max_tokens: MaxTokens = 512, temperature: Temperature = 0.0
    ) -> str:
        """Answer a conversation (``messages``, oldest first, the last one usually from the
        user) as the assistant, using the model's chat template; returns the reply."""
        try:
            if not messages:
                raise ValueError("messages: give at least one message")
            tok = engine.tokenizer
            prompt = tok.apply_chat_template(
                [m.model_dump() for m in messages], add_generation_prompt=True
            )
            ids = list(tok.encode(prompt, add_special_tokens=False))
            return await complete(ids, prompt, max_tokens, temperature, [])
        except ValueError as exc:  # no chat template, too long a conversation, ...
            raise ToolError(str(exc)) from None

    return app


def run(args: argparse.Namespace) -> int:
    """Load the model, then serve MCP on stdio until the host closes stdin."""
    from tallow.config import load_config
    from tallow.plugin.manager import load_plugins

    from .cli import setup_logging

    config = load_config(args)
    setup_logging(config.logging.level, config.logging.json)  # stderr: stdout is the protocol
    try:
        import mcp  # noqa: F401
    except ImportError:
        print("tallow: 'tallow mcp' needs the mcp SDK: pip install 'tallow[mcp]'", file=sys.stderr)
        return 2
    from tallow.engine.async_engine import AsyncEngine

    pm = load_plugins(config.plugins)
    pm.configure(config)
    try:
        engine = AsyncEngine.from_config(config, plugin_manager=pm)
    except Exception as exc:
        log.debug("engine start-up failed", exc_info=True)
        print(f"tallow: cannot serve the model: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    log.info("serving %s over MCP (stdio)", engine.model_name)
    build_server(engine).run("stdio")
    return 0
