"""tallow-tool-minimax: tool calls in the MiniMax M2 format.

A block ``<minimax:tool_call>`` … ``</minimax:tool_call>`` holds one or more
``<invoke name="NAME"><parameter name="P">V</parameter>...</invoke>`` calls; values are typed by
the tool's JSON Schema. The registration module is :mod:`tallow_tool_minimax.plugin`, the parser
:class:`tallow_tool_minimax.parser.MiniMaxM2ToolParser`.
"""

__version__ = "0.1.0"
