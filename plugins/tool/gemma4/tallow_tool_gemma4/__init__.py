"""tallow-tool-gemma4: tool calls in the Gemma 4 format.

A call is ``<|tool_call>call:NAME{key:value,...}<tool_call|>``, strings between ``<|"|>``
tokens. The registration module is :mod:`tallow_tool_gemma4.plugin`, the parser
:class:`tallow_tool_gemma4.parser.Gemma4ToolParser`.
"""

__version__ = "0.1.0"
