"""Every name the code uses is defined: pyflakes over the core, the first-party plugins and the
benchmarks. Code that only runs on a GPU (warm-ups, CUDA-graph paths, GPU benchmarks) is
never executed by CI, so a name left undefined there by a merge would otherwise first fail on
the GPU machine."""

from __future__ import annotations

import pathlib

from pyflakes import api as pyflakes_api
from pyflakes import reporter as pyflakes_reporter

ROOT = pathlib.Path(__file__).resolve().parents[1]
CHECKED = ("framework/tallow", "plugins", "bench", "cookiecutter")
#: the messages that mean "this raises NameError when the line runs"
FATAL = ("undefined name", "undefined local variable")


class _Collect(pyflakes_reporter.Reporter):
    def __init__(self) -> None:
        self.messages: list[str] = []

    def unexpectedError(self, filename, msg) -> None:  # noqa: N802 (pyflakes' API)
        self.messages.append(f"{filename}: {msg}")

    def syntaxError(self, filename, msg, lineno, offset, text) -> None:  # noqa: N802
        self.messages.append(f"{filename}:{lineno}: syntax error: {msg}")

    def flake(self, message) -> None:
        text = str(message)
        if any(f in text for f in FATAL):
            self.messages.append(text)


def python_files() -> list[pathlib.Path]:
    files = []
    for top in CHECKED:
        for path in sorted((ROOT / top).rglob("*.py")):
            # cookiecutter's templates are Jinja, not Python, until rendered
            if "{{" in str(path.relative_to(ROOT)):
                continue
            files.append(path)
    return files


def test_no_undefined_names() -> None:
    files = python_files()
    assert len(files) > 100, "the checked folders moved"
    collect = _Collect()
    for path in files:
        pyflakes_api.check(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)), collect)
    assert not collect.messages, "\n".join(collect.messages)
