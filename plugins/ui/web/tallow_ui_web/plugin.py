"""Registration of the web UI's routes (imports nothing heavy).

Both are factories that serve nothing unless ``server.ui`` is on, so an installed UI stays
invisible until asked for (``tallow serve --ui``).
"""

from __future__ import annotations

from tallow.plugin import hookimpl


@hookimpl
def tallow_register_routes(registry) -> None:
    registry.register("/ui", "tallow_ui_web.app:ui_app", mount=True, factory=True)
    registry.register("/", "tallow_ui_web.app:root_redirect", methods=("GET",), factory=True)
