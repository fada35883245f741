"""The routes suite: a registered HTTP route loads, and served the way ``tallow serve`` serves
plugin routes (a Starlette ``Route`` with its methods, or a ``Mount`` of an ASGI app; a
``factory=True`` route first built from ``config``), answers each of its methods.

::

    class TestMyPage(RouteConformance):
        distribution = "tallow-mypage"
        component = "/mypage"                  # the registered path
        expected_status = 200
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Iterator

import pytest

from ..registry import Entry
from .component import ComponentConformance

if TYPE_CHECKING:
    from starlette.testclient import TestClient


class RouteConformance(ComponentConformance):
    registry_kind = "routes"

    #: the path requested (default: the registered path; under a mount, any path inside it)
    request_path: ClassVar[str | None] = None
    expected_status: ClassVar[int] = 200
    #: for a route registered with ``factory=True``: the settings (a nested mapping, as in
    #: ``tallow.yaml``) under which the factory must serve it
    config: ClassVar[dict[str, Any]] = {}

    @pytest.fixture(scope="class")
    def client(
        self,
        entry: Entry,
        component_class: Any,  # Any: an ASGI app, or an endpoint function
    ) -> Iterator[TestClient]:
        from starlette.applications import Starlette
        from starlette.routing import BaseRoute, Mount, Route
        from starlette.testclient import TestClient

        target = component_class
        if entry.meta.get("factory"):
            from . import make_config

            target = component_class(make_config(self.config))
            assert target is not None, (
                f"{self.component}: the factory serves nothing under config {self.config!r}"
            )
        if entry.meta.get("mount"):
            route: BaseRoute = Mount(entry.name, app=target)
        else:
            route = Route(entry.name, target, methods=list(entry.meta.get("methods", ("GET",))))
        # the route's own answer is checked: a redirect is not followed
        with TestClient(Starlette(routes=[route]), follow_redirects=False) as client:
            yield client

    def test_path_and_methods(self, entry: Entry) -> None:
        assert entry.name.startswith("/")
        methods = entry.meta.get("methods", ("GET",))
        assert methods and all(
            m.upper() in {"GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"}
            for m in methods
        ), methods

    def test_target_is_callable(self, component_class: object) -> None:
        assert callable(component_class), f"{self.component}: target {component_class!r}"

    def test_answers_each_method(self, entry: Entry, client: TestClient) -> None:
        path = self.request_path or entry.name
        for method in entry.meta.get("methods", ("GET",)):
            response = client.request(method, path)
            assert response.status_code == self.expected_status, (
                f"{method} {path}: {response.status_code} {response.text[:200]}"
            )
