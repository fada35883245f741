"""tallow-reasoning-think: reasoning between ``<think>`` and ``</think>``.

The registration module is :mod:`tallow_reasoning_think.plugin`, the parsers are in
:mod:`tallow_reasoning_think.parser`.
"""

__version__ = "0.1.0"
