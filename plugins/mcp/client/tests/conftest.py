"""Fixtures of tallow-mcp-client's tests (the helpers are in mcp_fixtures.py)."""

from __future__ import annotations

import pathlib
import subprocess
import sys
from typing import Iterator

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))

from mcp_fixtures import HttpServer  # noqa: E402


@pytest.fixture
def http_server() -> Iterator[HttpServer]:
    server = HttpServer().start()
    yield server
    server.kill()


@pytest.fixture
def git_repo(tmp_path: pathlib.Path) -> pathlib.Path:
    """A temporary git repository with one commit."""
    repo = tmp_path / "repo"
    repo.mkdir()

    def git(*args: str) -> None:
        subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)

    git("init", "-q", "-b", "main")
    (repo / "hello.txt").write_text("hello from the test repository\n")
    git("add", "hello.txt")
    git(
        "-c",
        "user.name=Test",
        "-c",
        "user.email=test@example.com",
        "commit",
        "-q",
        "-m",
        "Add the greeting file",
    )
    (repo / "hello.txt").write_text("changed\n")
    return repo
