"""Fixtures of the browser tests: one ``tallow serve --ui`` of the embedded default model (with
an API key) per module, and Debian's chromium driven headless by Playwright (helpers in
ui_fixtures.py)."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import tempfile
import time
from typing import Any, Iterator

import httpx
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))

from ui_fixtures import API_KEY, CHROMIUM, CHROMIUM_ARGS, Ui, UiServer, free_port, new_ui  # noqa: E402


@pytest.fixture(scope="module")
def server() -> Iterator[UiServer]:
    """``tallow serve --ui --api-key ...`` on a free port, stopped after the module."""
    port = free_port()
    log = tempfile.NamedTemporaryFile("w+", prefix="tallow-ui-", suffix=".log")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tallow",
            "serve",
            "--ui",
            "--api-key",
            API_KEY,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--max-model-len",
            "4096",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ},
    )
    srv = UiServer(f"http://127.0.0.1:{port}", proc, log)
    deadline = time.monotonic() + 300
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"tallow serve exited with {proc.returncode}:\n" + srv.log_text()[-4000:]
                )
            try:
                if httpx.get(f"{srv.url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(
                    "tallow serve was not ready in 300 s:\n" + srv.log_text()[-4000:]
                )
            time.sleep(0.5)
        yield srv
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        log.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not os.path.exists(CHROMIUM):
        pytest.skip(
            f"Debian's chromium is not installed ({CHROMIUM}); `make install` installs "
            "it with apt-get"
        )
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
        )
        yield browser
        browser.close()


@pytest.fixture
def make_ui(browser: Any, server: UiServer) -> Iterator[Any]:
    """``make_ui(key=True, **context_args) -> Ui``; each fails the test at teardown if its page
    logged an error, raised, or opened a dialog it did not expect."""
    made: list[Ui] = []

    def make(key: bool = True, **context_args: Any) -> Ui:
        ui = new_ui(browser, server, key=key, **context_args)
        made.append(ui)
        return ui

    yield make
    problems = [e for ui in made for e in ui.errors]
    for ui in made:
        if not ui.page.is_closed():
            violations = ui.page.evaluate("window.__cspViolations || []")
            problems += [f"CSP violation: {v}" for v in violations]
        ui.context.close()
    assert not problems, problems
