"""tallow-reasoning-gemma4: Gemma 4's thought channel, ``<|channel>thought`` … ``<channel|>``.

The registration module is :mod:`tallow_reasoning_gemma4.plugin`, the parser
:class:`tallow_reasoning_gemma4.parser.Gemma4ReasoningParser`.
"""

__version__ = "0.1.0"
