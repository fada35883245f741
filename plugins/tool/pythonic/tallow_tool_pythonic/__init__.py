"""tallow-tool-pythonic: tool calls written as a Python list of calls (Llama 4).

A reply that is ``[get_weather(city="SF", days=3), other()]``, optionally wrapped in
``<|python_start|>`` … ``<|python_end|>``, is a list of calls whose keyword arguments are Python
literals. The registration module is :mod:`tallow_tool_pythonic.plugin`, the parser
:class:`tallow_tool_pythonic.parser.PythonicToolParser`.
"""

__version__ = "0.1.0"
