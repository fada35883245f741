"""tallow's OpenAI-compatible HTTP server: Starlette and sse-starlette on uvicorn.

:func:`tallow.server.app.build_app` turns an engine that follows the ``AsyncEngine`` contract
into an ASGI app; ``tallow serve`` (:mod:`tallow.server.cli`) loads the model and runs that app
under uvicorn. The endpoints, fields and errors are documented in ``docs/api.md``.

Importing this package imports nothing else, so ``tallow --help`` stays cheap.
"""
