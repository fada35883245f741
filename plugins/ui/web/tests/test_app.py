"""The UI's routes without a browser: served only with server.ui, the files in the package,
and the security headers of every response."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.routing import Mount, Route
from starlette.testclient import TestClient

from tallow.plugin.testing import RouteConformance, make_config
from tallow_ui_web import app as ui

STATIC = Path(ui.__file__).parent / "static"


class TestUiMount(RouteConformance):
    distribution = "tallow-ui-web"
    component = "/ui"
    request_path = "/ui/"
    config = {"server": {"ui": True}}


class TestRootRedirect(RouteConformance):
    distribution = "tallow-ui-web"
    component = "/"
    expected_status = 307
    config = {"server": {"ui": True}}


@pytest.fixture(scope="module")
def client() -> TestClient:
    config = make_config({"server": {"ui": True}})
    app = Starlette(
        routes=[Route("/", ui.root_redirect(config)), Mount("/ui", app=ui.ui_app(config))]
    )
    return TestClient(app, follow_redirects=False)


def test_nothing_is_served_unless_server_ui_is_on() -> None:
    for config in (None, make_config({}), make_config({"server": {"ui": False}})):
        assert ui.ui_app(config) is None
        assert ui.root_redirect(config) is None


def test_root_redirects_to_the_ui(client: TestClient) -> None:
    response = client.get("/")
    assert response.status_code == 307 and response.headers["location"] == "/ui/"
    assert client.get("/ui").headers["location"].endswith("/ui/")


@pytest.mark.parametrize("path", ["/ui/", "/ui/app.js", "/ui/style.css", "/ui/nope.js", "/"])
def test_every_response_carries_the_security_headers(client: TestClient, path: str) -> None:
    response = client.get(path)
    csp = response.headers["content-security-policy"]
    directives = dict(d.strip().split(" ", 1) for d in csp.split(";"))
    assert directives["default-src"] == "'self'"
    assert directives["script-src"] == "'self'"  # no 'unsafe-inline', no 'unsafe-eval'
    assert directives["connect-src"] == "'self'"
    assert directives["frame-ancestors"] == "'none'"
    assert directives["object-src"] == "'none'"
    assert directives["img-src"] == "'self' data:"  # thumbnails of the user's own attachments
    assert "unsafe" not in csp and "*" not in csp and "http" not in csp
    assert response.headers["x-content-type-options"] == "nosniff"
    assert response.headers["x-frame-options"] == "DENY"


def test_the_page_and_its_modules_are_served_with_their_types(client: TestClient) -> None:
    page = client.get("/ui/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "<title>tallow</title>" in page.text
    for name in ("app.js", "api.js", "store.js", "view.js", "markdown.js", "highlight.js"):
        response = client.get(f"/ui/{name}")
        assert response.status_code == 200, name
        assert "javascript" in response.headers["content-type"], name
    assert client.get("/ui/style.css").headers["content-type"].startswith("text/css")


def test_the_package_holds_every_file_the_page_references() -> None:
    html = (STATIC / "index.html").read_text()
    referenced = set(re.findall(r'(?:src|href)="([^"]+)"', html))
    for js in STATIC.glob("*.js"):
        referenced |= {m + "" for m in re.findall(r'from "\./([^"]+)"', js.read_text())}
    assert referenced >= {"app.js", "style.css", "favicon.svg"}
    for name in referenced:
        assert (STATIC / name).is_file(), f"{name} is referenced but not shipped"


def test_no_inline_script_no_inline_style_no_other_origin() -> None:
    html = (STATIC / "index.html").read_text()
    assert not re.search(r"<script(?![^>]*\bsrc=)", html), "an inline script"
    assert not re.search(r"\son\w+=", html), "an inline event handler"
    assert not re.search(r"\sstyle=", html) and "<style" not in html
    for path in STATIC.iterdir():
        text = path.read_text()
        # nothing is loaded from another origin (a link target written by the model is data)
        assert not re.search(r"(?:src|href)=\"(?:https?:)?//", text), path.name
        assert "innerHTML" not in text and "outerHTML" not in text, path.name
        assert "insertAdjacentHTML" not in text and "document.write" not in text, path.name
        assert "eval(" not in text and "new Function" not in text, path.name


def test_the_wheel_ships_the_static_files() -> None:
    import tomllib

    project = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    assert "static/*" in project["tool"]["setuptools"]["package-data"]["tallow_ui_web"]


OFF = """
from tallow.plugin.testing import RouteConformance


class TestServedWithoutUi(RouteConformance):
    distribution = "tallow-ui-web"
    component = "/ui"
    request_path = "/ui/"
"""


def test_the_route_suite_fails_a_factory_route_its_config_does_not_serve(tmp_path: Path) -> None:
    from tallow.plugin.testing import suite_failures

    failed, output = suite_failures(OFF, tmp_path, timeout=120)
    assert failed == {"TestServedWithoutUi::test_answers_each_method"}, output
    assert "the factory serves nothing under config {}" in output
