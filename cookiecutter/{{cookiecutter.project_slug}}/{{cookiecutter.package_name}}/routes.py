"""An HTTP route served next to the OpenAI API: ``GET {{ cookiecutter.component_name }}``
answers with the plugin's name and version."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse

from . import __version__


async def status_page(request: Request) -> JSONResponse:
    return JSONResponse({"plugin": "{{ cookiecutter.project_slug }}", "version": __version__,
                         "status": "ok"})
