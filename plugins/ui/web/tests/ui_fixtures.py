"""Helpers of the browser tests: the live server's handle, a page of the UI and how to make one."""

from __future__ import annotations

import pathlib
import re
import socket
from dataclasses import dataclass, field
from typing import Any

import httpx

#: Debian's package; Playwright's own browser download is never used
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
API_KEY = "sk-tallow-ui-test"
#: what chromium logs for the refusals the tests cause on purpose (a missing key, a 400)
EXPECTED_CONSOLE = re.compile(
    r"Failed to load resource: the server responded with a status "
    r"of 40[01]"
)
#: the screenshots of docs/web-ui.md
IMAGES = pathlib.Path(__file__).resolve().parents[4] / "docs" / "images"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class UiServer:
    url: str
    proc: Any
    log: Any

    def metrics(self) -> dict[str, float]:
        """The server's Prometheus samples without labels, by name."""
        text = httpx.get(f"{self.url}/metrics", timeout=10).text
        samples: dict[str, float] = {}
        for line in text.splitlines():
            if line and not line.startswith("#") and "{" not in line:
                name, _, value = line.partition(" ")
                samples[name] = float(value)
        return samples

    def log_text(self) -> str:
        self.log.flush()
        return pathlib.Path(self.log.name).read_text()


@dataclass
class Ui:
    """A page of the UI in a fresh browser context, with what went wrong in it."""

    page: Any
    context: Any
    server: UiServer
    errors: list[str] = field(default_factory=list)
    requests: list[Any] = field(default_factory=list)
    #: native dialogs (confirm) the test expects: each one is accepted, any other is an error
    expected_dialogs: list[str] = field(default_factory=list)

    def open(self) -> "Ui":
        self.page.goto(f"{self.server.url}/")  # redirected to /ui/
        self.page.wait_for_selector("#model option", state="attached", timeout=20_000)
        return self

    def settings(self, **values: Any) -> None:
        """Sets the settings panel's fields (by element id without ``set-``) and closes it."""
        self.page.click("#open-settings")
        for name, value in values.items():
            selector = f"#set-{name}"
            if isinstance(value, bool):
                self.page.set_checked(selector, value)
            else:
                self.page.fill(selector, str(value))
        self.page.click("#settings-form button[value=save]")
        self.page.wait_for_selector("#settings", state="hidden")

    def send(self, text: str, *, wait_start: bool = True) -> None:
        """Types ``text`` and presses Enter; waits until the answer has started (unless the
        answer is over too soon to see it start)."""
        self.page.fill("#prompt", text)
        self.page.press("#prompt", "Enter")
        if wait_start:
            self.page.wait_for_selector("#stop", state="visible", timeout=10_000)

    def wait_done(self, timeout: float = 120) -> None:
        self.page.wait_for_selector("#send", state="visible", timeout=timeout * 1000)

    def answer(self) -> Any:
        """The last assistant message's element."""
        return self.page.locator(".message.assistant").last


def new_ui(browser: Any, server: UiServer, *, key: bool, **context_args: Any) -> Ui:
    context = browser.new_context(base_url=server.url, **context_args)
    if key:  # the key as the prompt leaves it; the prompt itself has its own test
        context.add_init_script(f"localStorage.setItem('tallow-ui:api-key', {API_KEY!r});")
    page = context.new_page()
    ui = Ui(page, context, server)
    page.on("pageerror", lambda exc: ui.errors.append(f"page error: {exc}"))
    page.on(
        "console",
        lambda msg: (
            ui.errors.append(f"console {msg.type}: {msg.text}")
            if msg.type == "error" and not EXPECTED_CONSOLE.search(msg.text)
            else None
        ),
    )

    def on_dialog(dialog: Any) -> None:
        if ui.expected_dialogs:
            ui.expected_dialogs.pop(0)
            dialog.accept()
        else:
            ui.errors.append(f"unexpected dialog: {dialog.message}")
            dialog.dismiss()

    page.on("dialog", on_dialog)
    # every Content-Security-Policy violation is kept: a clean page has none
    context.add_init_script(
        "document.addEventListener('securitypolicyviolation', (e) => {"
        " (window.__cspViolations = window.__cspViolations || []).push(e.violatedDirective); });"
    )
    page.on("request", lambda request: ui.requests.append(request))
    return ui
