"""tallow-tool-llama3: Llama 3.x JSON tool calls.

The response is ``{"name": ..., "parameters": {...}}`` (several separated by ``;``), optionally
after ``<|python_tag|>``. The registration module is :mod:`tallow_tool_llama3.plugin`, the parser
:class:`tallow_tool_llama3.parser.Llama3JsonToolParser`.
"""

__version__ = "0.1.0"
