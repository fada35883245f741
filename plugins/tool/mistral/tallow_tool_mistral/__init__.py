"""tallow-tool-mistral: tool calls in Mistral's ``[TOOL_CALLS]`` formats.

``[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`` (v3 tokenizers) and
``[TOOL_CALLS]name[ARGS]{...}`` (v11+, optionally ``name[CALL_ID]id[ARGS]{...}``). The
registration module is :mod:`tallow_tool_mistral.plugin`, the parser
:class:`tallow_tool_mistral.parser.MistralToolParser`.
"""

__version__ = "0.1.0"
