"""Production code carries no measurements: no GPU model names and no throughput or bandwidth
figures in the comments, docstrings and strings of the core (``framework/``) and of every
first-party plugin's module (``plugins/<kind>/<name>/tallow_*``).

Measured figures go stale with the next commit and depend on the card they came from; they live
in docs/performance.md (one current table per area, each row with its card, date, commit and
command) and its changelog, docs/benchmarks.md. Code comments keep the reason (for instance
"memory-bound at batch 1") without the numbers. Architecture names (Ampere, Hopper) stay
allowed: they name capabilities code checks for, not a measurement.

The scan reads comment and string tokens (docstrings included) of each module. Names that code
needs as data (a table of known GPUs used to recognise the device, say) are exempt by their
exact symbol in :data:`ALLOWED_SYMBOLS`, each with its reason; the checker is shown to catch
planted text and to honour the exemption on sources written here.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: GPU model names (data-centre and workstation parts, as measurements name them)
DEVICE = re.compile(
    r"\b(?:H100|H200|H800|H20|GH200|A100|A800|A10G?|A30|A40|L40S?|B100|B200|GB200|V100|"
    r"MI2[0-9]0X?|MI3[0-9]{2}X?|RTX ?[0-9]{4})\b"
)
#: a number followed by a rate unit: a measured throughput, bandwidth or compute rate
FIGURE = re.compile(
    r"\d[\d,.]*\s*(?:k\s*|M\s*)?(?:tok/s|tokens/s|tok/sec|tokens per second|req/s|inputs/s|"
    r"[KMGT]i?B/s|TFLOP/s|TFLOPS)(?![A-Za-z])",
    re.IGNORECASE,
)

#: module (relative to the repository root) -> module-level names whose assignment may name
#: GPUs, and why. Empty today: no production module needs a GPU's name as data.
ALLOWED_SYMBOLS: dict[str, dict[str, str]] = {}


def production_modules(root: Path = ROOT) -> list[Path]:
    """Every module of the core and of the first-party plugins' packages (not their tests)."""
    core = sorted((root / "framework").rglob("*.py"))
    plugins = sorted(
        p for pkg in root.glob("plugins/*/*/tallow_*") if pkg.is_dir() for p in pkg.rglob("*.py")
    )
    return core + plugins


def _exempt_lines(tree: ast.Module, names: dict[str, str]) -> set[int]:
    """Lines of the module-level assignments to ``names``."""
    lines: set[int] = set()
    for node in tree.body:
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign):
            targets = [node.target]
        if any(isinstance(t, ast.Name) and t.id in names for t in targets):
            end = node.end_lineno or node.lineno
            lines.update(range(node.lineno, end + 1))
    return lines


def findings(source: str, allowed: dict[str, str] | None = None) -> list[tuple[int, str]]:
    """(line, text) of every comment or string token of ``source`` that names a GPU model or
    gives a rate figure, outside the assignments to the ``allowed`` names."""
    exempt = _exempt_lines(ast.parse(source), allowed) if allowed else set()
    found: list[tuple[int, str]] = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type not in (tokenize.COMMENT, tokenize.STRING):
            continue
        for offset, line in enumerate(tok.string.splitlines()):
            lineno = tok.start[0] + offset
            if lineno in exempt:
                continue
            if DEVICE.search(line) or FIGURE.search(line):
                found.append((lineno, line.strip()))
    return found


def test_production_code_names_no_gpu_and_gives_no_figures() -> None:
    modules = production_modules()
    assert len(modules) > 100, "the scan found too few modules: is the layout still the same?"
    bad: list[str] = []
    for path in modules:
        rel = path.relative_to(ROOT).as_posix()
        for lineno, text in findings(path.read_text(encoding="utf-8"), ALLOWED_SYMBOLS.get(rel)):
            bad.append(f"{rel}:{lineno}: {text}")
    assert not bad, (
        "measurements or GPU names in production code (move them to "
        "docs/performance.md, keep the reason):\n" + "\n".join(bad)
    )


def test_allowed_symbols_exist() -> None:
    # An exemption outlives its symbol silently otherwise.
    for rel, names in ALLOWED_SYMBOLS.items():
        tree = ast.parse((ROOT / rel).read_text(encoding="utf-8"))
        assert _exempt_lines(tree, names), f"{rel}: none of {sorted(names)} is assigned there"


@pytest.mark.parametrize(
    "text",
    [
        "# measured on an H200: faster",
        "# 243.3 tok/s at batch 1",
        "# reads at 4.3 TB/s",
        "# about 1,117 tokens/s over 64 sequences",
        "# GEMMs at ~745 TFLOP/s",
        '"""Tuned on an A100."""',
        "# 3,011 GB/s on o",
    ],
)
def test_planted_text_is_found(text: str) -> None:
    assert findings(f"x = 1\n{text}\n"), text


@pytest.mark.parametrize(
    "text",
    [
        "# memory-bound at batch 1: the GEMV reads every weight once per token",
        "# Hopper's wgmma needs 64 rows",
        'label = "decode tok/s"',
        "# bytes per token of the KV cache",
        "# the H dimension of the head",
    ],
)
def test_reasons_and_labels_pass(text: str) -> None:
    assert not findings(f"x = 1\n{text}\n"), text


def test_allowed_symbol_is_exempt_and_nothing_else() -> None:
    source = (
        'KNOWN = {"NVIDIA H200": 132}  # SMs of cards recognised by name\nOTHER = "NVIDIA H100"\n'
    )
    assert findings(source, {"KNOWN": "device table"}) == [(2, '"NVIDIA H100"')]
    assert len(findings(source)) == 2
