"""tallow-tool-json: the fallback tool parser — a response that is a JSON call or a list of them.

Also reads the output of forced calls (``tool_choice: "required"`` or a named function). The
registration module is :mod:`tallow_tool_json.plugin`, the parser
:class:`tallow_tool_json.parser.JsonToolParser`.
"""

__version__ = "0.1.0"
