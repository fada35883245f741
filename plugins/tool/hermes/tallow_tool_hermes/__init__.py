"""tallow-tool-hermes: tool calls in the Hermes / Qwen2.5 format.

A call is ``<tool_call>`` + a JSON object ``{"name": ..., "arguments": {...}}`` + ``</tool_call>``;
several may follow one another. The registration module is :mod:`tallow_tool_hermes.plugin`, the
parser :class:`tallow_tool_hermes.parser.HermesToolParser`.
"""

__version__ = "0.1.0"
