"""tallow-reasoning-harmony: OpenAI's harmony format, as gpt-oss models write it.

:mod:`tallow_reasoning_harmony.messages` reads the message structure (headers, bodies, the
special tokens between them) incrementally; :mod:`.reasoning` maps the ``analysis`` channel to
reasoning and the rest to content; :mod:`.tools` turns messages addressed to ``functions.NAME``
into tool calls. :mod:`.plugin` registers both parsers as ``harmony``.
"""

__version__ = "0.1.0"
