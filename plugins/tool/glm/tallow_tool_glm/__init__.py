"""tallow-tool-glm: tool calls in the GLM-4.5 / 4.6 / 4.7 format.

A call is ``<tool_call>NAME`` + ``<arg_key>K</arg_key><arg_value>V</arg_value>`` pairs +
``</tool_call>``; values are typed by the tool's JSON Schema. The registration module is
:mod:`tallow_tool_glm.plugin`, the parser :class:`tallow_tool_glm.parser.GlmToolParser`.
"""

__version__ = "0.1.0"
