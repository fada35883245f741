"""tallow-tool-qwen3-coder: tool calls in the Qwen3-Coder XML format.

A call is ``<tool_call><function=NAME><parameter=ARG>value</parameter>...</function></tool_call>``;
parameter values are typed by the tool's JSON Schema. The registration module is
:mod:`tallow_tool_qwen3_coder.plugin`, the parser
:class:`tallow_tool_qwen3_coder.parser.Qwen3CoderToolParser`.
"""

__version__ = "0.1.0"
