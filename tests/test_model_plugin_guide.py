"""docs/write-a-model-plugin.md shows the GPT-NeoX plugin's code as it is.

Every fenced code block of the guide whose first line is a comment naming a file
(``# tallow_model_gptneox/model.py``) must appear verbatim, as consecutive lines, in that file of
plugins/model/gptneox; and together the blocks must show all of the plugin's code (every line
after each module's docstring), so the walkthrough cannot fall behind the plugin it builds.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "write-a-model-plugin.md"
PLUGIN = ROOT / "plugins" / "model" / "gptneox"
FULLY_SHOWN = (
    "tallow_model_gptneox/plugin.py",
    "tallow_model_gptneox/model.py",
    "tallow_model_gptneox/naming.py",
)

_BLOCK = re.compile(r"^```[\w-]*\n(.*?)^```", re.S | re.M)
_HEADER = re.compile(r"#\s*([\w./-]+\.(?:py|toml))\s*$")


def guide_excerpts() -> list[tuple[str, list[str]]]:
    """``(file, lines)`` of every code block headed by a file name."""
    out = []
    for block in _BLOCK.findall(GUIDE.read_text()):
        first, _, body = block.partition("\n")
        header = _HEADER.fullmatch(first.strip())
        if header:
            out.append((header.group(1), body.rstrip("\n").split("\n")))
    return out


def find(lines: list[str], excerpt: list[str]) -> int:
    """Where ``excerpt`` starts in ``lines``, or -1."""
    for i in range(len(lines) - len(excerpt) + 1):
        if lines[i : i + len(excerpt)] == excerpt:
            return i
    return -1


def _code_start(lines: list[str]) -> int:
    """The first line after the module docstring."""
    if not lines or not lines[0].startswith('"""'):
        return 0
    if lines[0].count('"""') >= 2:
        return 1
    return next(i for i in range(1, len(lines)) if lines[i].rstrip().endswith('"""')) + 1


def test_every_excerpt_is_in_the_plugin_verbatim():
    excerpts = guide_excerpts()
    assert len(excerpts) >= 10, "the guide lost its code blocks"
    for name, excerpt in excerpts:
        path = PLUGIN / name
        assert path.is_file(), f"the guide shows {name}, which plugins/model/gptneox lacks"
        lines = path.read_text().split("\n")
        assert find(lines, excerpt) >= 0, (
            f"docs/write-a-model-plugin.md: the block headed {name} (starting "
            f"{excerpt[0]!r}) is not in {path.relative_to(ROOT)} as written"
        )


def test_the_guide_shows_all_of_the_plugins_code():
    shown: dict[str, set[int]] = {}
    for name, excerpt in guide_excerpts():
        lines = (PLUGIN / name).read_text().split("\n")
        start = find(lines, excerpt)
        shown.setdefault(name, set()).update(range(start, start + len(excerpt)))
    for name in FULLY_SHOWN:
        lines = (PLUGIN / name).read_text().split("\n")
        missing = [
            i + 1
            for i in range(_code_start(lines), len(lines))
            if lines[i].strip() and i not in shown.get(name, set())
        ]
        assert not missing, f"docs/write-a-model-plugin.md does not show lines {missing} of {name}"


def test_a_changed_line_is_caught():
    name, excerpt = next((n, e) for n, e in guide_excerpts() if n.endswith("model.py"))
    lines = (PLUGIN / name).read_text().split("\n")
    assert find(lines, excerpt) >= 0
    assert find(lines, [*excerpt[:-1], excerpt[-1] + "  # edited"]) == -1
