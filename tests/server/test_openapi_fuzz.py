"""schemathesis against the served ``/openapi.json``: requests generated from the document
(valid ones and invalid ones) never get a server error, and every response matches the
document (status code, content type, body schema). A real engine (``random:tiny-llama`` on the
CPU) serves the app under uvicorn on loopback, so generated requests run the whole path.

Bounded: a few examples per operation with a fixed seed (the same cases every run)."""

from __future__ import annotations

from typing import Any, Iterator

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, settings
from schemathesis import checks
from server_helpers import LiveServer, make_config

CHECKS = [
    checks.not_a_server_error,
    checks.status_code_conformance,
    checks.content_type_conformance,
    checks.response_schema_conformance,
]


@pytest.fixture(scope="module")
def served() -> Iterator[LiveServer]:
    from tallow.engine.async_engine import AsyncEngine
    from tallow.engine.llm import config_from_kwargs
    from tallow.plugin.manager import load_plugins
    from tallow.server.app import build_app

    engine = AsyncEngine.from_config(
        config_from_kwargs(
            model="random:tiny-llama",
            dtype="float32",
            device="cpu",
            max_model_len=128,
            num_blocks=512,
            block_size=16,
        ),
        plugin_manager=load_plugins(None),
    )
    with LiveServer(build_app(engine, make_config())) as srv:
        yield srv


@pytest.fixture(scope="module")
def api_schema(served: LiveServer) -> Any:
    return schemathesis.openapi.from_url(served.url + "/openapi.json")


schema = schemathesis.pytest.from_fixture("api_schema")


@schema.parametrize()
@settings(
    max_examples=8,
    deadline=None,
    derandomize=True,
    database=None,
    phases=(Phase.explicit, Phase.generate),
    suppress_health_check=list(HealthCheck),
)
def test_no_server_errors_and_responses_match_the_document(case: Any) -> None:
    case.call_and_validate(checks=CHECKS, timeout=60)
