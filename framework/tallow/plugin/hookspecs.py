"""Every extension point of tallow, declared as pluggy hook specifications.

Registration hooks are called once at start-up, each with a typed registry; an implementation
registers lazy ``"module:attr"`` targets and returns nothing. ``tallow_configure`` gives every
plugin the effective configuration. No hook is ever called per request or per token; what a
plugin holds at run time is a component its owner starts and stops (a tool provider's
``start``/``stop``), not a process-wide hook.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

PROJECT = "tallow"

hookspec = pluggy.HookspecMarker(PROJECT)
"""Declares a hook (tallow's own use: the functions of this module)."""
hookimpl = pluggy.HookimplMarker(PROJECT)
"""Marks a plugin's implementation of a hook: ``@hookimpl`` above a function named like the
hook (``def tallow_register_architectures(registry): ...``)."""

if TYPE_CHECKING:  # pragma: no cover
    from tallow.config import TallowConfig

    from .registry import (
        ArchitectureRegistry,
        AttentionBackendRegistry,
        GrammarBackendRegistry,
        KVCodecRegistry,
        QuantSchemeRegistry,
        ReasoningParserRegistry,
        RouteRegistry,
        SpeculatorRegistry,
        ToolParserRegistry,
        ToolProviderRegistry,
        WeightFormatRegistry,
    )


@hookspec
def tallow_register_architectures(registry: "ArchitectureRegistry") -> None:
    """Register model classes.

    Call ``registry.register(hf_name, "pkg.module:Class", gguf=(gguf_arch, ...))`` once per
    Hugging Face ``architectures`` name the class serves; ``gguf`` lists the GGUF
    ``general.architecture`` values it also serves. The class follows
    :class:`tallow.plugin.ModelArchitecture`: it is built from an HF-style config, declares how
    checkpoint tensor names (HF and GGUF) map onto its parameters, and runs one flat batch.
    Must not import torch at registration time (targets are loaded lazily).
    """


@hookspec
def tallow_register_weight_formats(registry: "WeightFormatRegistry") -> None:
    """Register checkpoint loaders (:class:`tallow.plugin.WeightFormat`).

    ``registry.register(name, "pkg.module:Class", priority=N)``. When the model source does not
    name a format, the formats are asked by priority, highest first, whether they claim the
    source (``claims(source)``); the first that does loads it. A loader produces the HF-style
    config, the tokenizer, the chat template and an iterator of checkpoint tensors.
    """


@hookspec
def tallow_register_quant_schemes(registry: "QuantSchemeRegistry") -> None:
    """Register weight quantization schemes (:class:`tallow.plugin.QuantScheme`).

    A scheme says how it is detected from a checkpoint config, which GPU capability it needs
    (``validate``), how its weights are laid out, and which matmul it runs.
    """


@hookspec
def tallow_register_kv_codecs(registry: "KVCodecRegistry") -> None:
    """Register KV-cache codecs (:class:`tallow.plugin.KVCodec`):
    ``registry.register(name, "pkg.module:Class", bits=N)`` with the nominal bits per stored
    element (listings show them without importing the codec).

    A codec lays out the tensors of one layer's cache (codes, scales, ...) and provides a
    plain-torch reference ``encode`` (a step's K/V into the cache) and ``decode`` (blocks back
    to K/V). The torch attention backend serves any codec through them; a backend that
    implements a codec in kernels of its own names it in ``fused_kv_codecs``.
    """


@hookspec
def tallow_register_attention_backends(registry: "AttentionBackendRegistry") -> None:
    """Register attention backends (:class:`tallow.plugin.AttentionBackend`).

    ``registry.register(name, "pkg.module:Class", priority=N)``. Unless the config names a
    backend, the highest-priority backend serves whose ``validate(config)`` returns no reasons
    and whose instance accepts the model's attention layers (``supports_layer``) and the KV
    codec (``supports_kv_codec``); a named backend that refuses stops start-up with its
    reasons.
    """


@hookspec
def tallow_register_tool_parsers(registry: "ToolParserRegistry") -> None:
    """Register tool-call parsers (:class:`tallow.plugin.ToolParser`).

    Without ``--tool-parser``, the highest-priority parser whose ``matches(model_name,
    chat_template)`` is true is used. A parser turns model text into OpenAI ``tool_calls``, both
    whole and as streaming deltas.
    """


@hookspec
def tallow_register_reasoning_parsers(registry: "ReasoningParserRegistry") -> None:
    """Register reasoning parsers (:class:`tallow.plugin.ReasoningParser`).

    ``registry.register(name, "pkg.module:ParserClass")``. A parser splits a model's output into
    its reasoning (``<think>...</think>``, say) and its content, whole and as streaming deltas.
    None is chosen automatically: the server uses the one ``server.reasoning_parser``
    (``--reasoning-parser``) names, and fails at start-up, listing the registered names, when
    that name is unknown. Tool calls are then parsed from the content only.
    """


@hookspec
def tallow_register_tool_providers(registry: "ToolProviderRegistry") -> None:
    """Register tool providers (:class:`tallow.plugin.ToolProvider`), e.g. MCP clients.

    ``registry.register(name, "pkg.module:ProviderClass")``. The server builds one instance
    per provider with ``from_config(config)``, starts it with the app, offers the tools it
    lists to the model and runs the model's calls through it (the tool loop); see the
    contract on :class:`tallow.plugin.ToolProvider`.
    """


@hookspec
def tallow_register_routes(registry: "RouteRegistry") -> None:
    """Register extra HTTP routes served next to the OpenAI API (the web UI, say).

    ``registry.register("/path", "pkg.module:endpoint_or_app", methods=("GET",), mount=False)``;
    with ``mount=True`` the target is an ASGI app mounted under the path.
    """


@hookspec
def tallow_register_grammar_backends(registry: "GrammarBackendRegistry") -> None:
    """Register structured-output grammar backends (:class:`tallow.plugin.GrammarBackend`).

    ``registry.register(name, "pkg.module:BackendClass", priority=N)``. Unless
    ``runner.grammar_backend`` names one, the highest-priority backend whose
    ``validate(config)`` gives no reasons serves; a named backend that gives reasons stops
    start-up with them. The engine builds the backend as ``cls(tokenizer_info, config)`` when
    the first request with a ``response_format``, guided-decoding field or forced tool call
    arrives, and from then on the backend compiles each JSON Schema, regular expression,
    choice list or EBNF grammar once (``compile(spec)``, raising
    :class:`tallow.plugin.GrammarError` with the path of what it cannot enforce; the engine
    caches the result by the spec's hash) and gives every constrained sequence a
    :class:`tallow.plugin.GrammarMatcher`: the allowed-token bitmask before each step,
    ``accept`` of the sampled token, ``is_terminated``, and ``rollback`` when tokens are taken
    back. Must not import torch or the grammar library at registration time.
    """


@hookspec
def tallow_register_speculators(registry: "SpeculatorRegistry") -> None:
    """Register speculators for speculative decoding (:class:`tallow.plugin.Speculator`).

    ``registry.register(name, "pkg.module:SpeculatorClass")``. None is chosen automatically:
    the engine uses the one ``speculative.method`` (``--speculative-method``) names, builds it
    as ``cls(config)`` and fails at start-up, listing the registered names, when that name is
    unknown or the speculator's ``validate(config)`` gives reasons. Before each decode step the
    engine asks it for up to ``speculative.num_speculative_tokens`` tokens per sequence
    (``propose``) and verifies them with the target model in one step. Must not import torch at
    registration time.
    """


@hookspec(historic=True)
def tallow_configure(config: TallowConfig) -> None:
    """The effective configuration (a :class:`tallow.config.TallowConfig`) is known.

    Historic: a plugin registered later still receives it. Read your settings from
    ``config.plugins.settings.get(<distribution name>, {})``; do not mutate ``config``.
    """
