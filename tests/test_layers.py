"""The core's modules import only down the layer order of docs/architecture.md, and no two of
them import each other, directly or round a circle.

Checked on the syntax tree of every module of ``framework/tallow``: every ``import`` and
``from ... import`` counts, at module level, inside a function or class, and under ``if
TYPE_CHECKING:`` alike (an annotation that names a higher layer is a dependency on it too),
as do module names given as literals to ``importlib.import_module`` and the names the
``tallow`` package resolves lazily (``from tallow import LLM`` imports the engine). The two
checkers are shown to catch a planted upward import and a planted circle on module graphs
written here.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORE = ROOT / "framework"

#: The layers of the core, lowest first. A module belongs to the layer of the longest prefix
#: below that names it (a prefix names the module itself and everything under it); a module
#: may import from its own layer and the layers before it. docs/architecture.md says why.
LAYERS: list[tuple[str, ...]] = [
    # the package root (__version__; its Python API is resolved lazily) and the torch-free
    # contracts that kernels and layers implement and the plugin API re-exports
    ("tallow=", "tallow.types"),
    ("tallow.config", "tallow.default_model"),
    ("tallow.kernels",),
    ("tallow.distributed",),
    ("tallow.layers",),
    ("tallow.plugin", "tallow.builtins"),
    ("tallow.engine",),
    # the plugin test kit drives the engine the way a plugin's own tests do
    ("tallow.plugin.testing",),
    ("tallow.server",),
    ("tallow.bench",),
    # processes' entry points: the command line and a spawned tensor-parallel worker
    ("tallow.cli", "tallow.quantize_cli", "tallow.__main__", "tallow.distributed.__main__"),
]


def layer_of(module: str, layers: list[tuple[str, ...]] = LAYERS) -> int:
    """Index in ``layers`` of ``module``'s layer (longest matching prefix; ``name=`` matches
    ``name`` only)."""
    best, best_len = -1, -1
    for index, prefixes in enumerate(layers):
        for prefix in prefixes:
            exact = prefix.endswith("=")
            name = prefix.rstrip("=")
            hit = module == name or (not exact and module.startswith(name + "."))
            if hit and len(name) > best_len:
                best, best_len = index, len(name)
    if best < 0:
        raise ValueError(
            f"module {module} is in no layer: add it to LAYERS (and to docs/architecture.md)"
        )
    return best


@dataclass(frozen=True)
class Edge:
    """``source`` imports ``target`` at ``line``."""

    source: str
    target: str
    line: int


def _module_name(path: Path, root: Path) -> tuple[str, bool]:
    parts = list(path.relative_to(root).with_suffix("").parts)
    is_package = parts[-1] == "__init__"
    if is_package:
        parts = parts[:-1]
    return ".".join(parts), is_package


def lazy_names(init_source: str) -> dict[str, str]:
    """The names the ``tallow`` package resolves lazily (its ``_LAZY`` table: name ->
    ``"module:attr"``), each to the module that ``from tallow import name`` imports."""
    for node in ast.parse(init_source).body:
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.targets[0], ast.Name)
            and node.targets[0].id == "_LAZY"
        ):
            table = ast.literal_eval(node.value)
            return {name: target.partition(":")[0] for name, target in table.items()}
    return {}


LAZY = lazy_names((CORE / "tallow" / "__init__.py").read_text(encoding="utf-8"))


def imports_of(
    module: str,
    is_package: bool,
    source: str,
    known: set[str],
    filename: str = "<string>",
    lazy: dict[str, str] | None = None,
) -> list[Edge]:
    """Every import of ``source`` (module ``module``) that names a module of ``known``'s
    package: ``from pkg import mod`` names ``pkg.mod`` when that is a module, ``pkg`` else;
    ``from tallow import LLM`` names the module the package resolves ``LLM`` from (``lazy``,
    :data:`LAZY` when None)."""
    lazy = LAZY if lazy is None else lazy
    tree = ast.parse(source, filename)
    found: list[Edge] = []

    def add(target: str, line: int) -> None:
        edge = Edge(module, target, line)
        if target.split(".")[0] == "tallow" and edge not in found:
            found.append(edge)

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = module.split(".")[
                    : len(module.split(".")) - node.level + (1 if is_package else 0)
                ]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                if base == "tallow" and alias.name in lazy:
                    add(lazy[alias.name], node.lineno)
                else:
                    add(sub if sub in known else base, node.lineno)
        elif (
            isinstance(node, ast.Call)
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
            and (getattr(node.func, "attr", None) or getattr(node.func, "id", None))
            in ("import_module", "__import__")
        ):
            add(node.args[0].value, node.lineno)
    return found


def core_graph(root: Path = CORE) -> dict[str, list[Edge]]:
    """Each module of the core and its imports of other core modules."""
    paths = sorted((root / "tallow").rglob("*.py"))
    names = {_module_name(p, root)[0]: p for p in paths}
    known = set(names)
    return {
        name: imports_of(
            name, _module_name(path, root)[1], path.read_text(encoding="utf-8"), known, str(path)
        )
        for name, path in names.items()
    }


def upward_imports(
    graph: dict[str, list[Edge]], layers: list[tuple[str, ...]] = LAYERS
) -> list[str]:
    """The imports of ``graph`` that run up ``layers``, as ``module:line -> target``."""
    return [
        f"{e.source}:{e.line} -> {e.target} (layer {layer_of(e.source, layers)} imports "
        f"layer {layer_of(e.target, layers)})"
        for edges in graph.values()
        for e in edges
        if layer_of(e.target, layers) > layer_of(e.source, layers)
    ]


def import_cycles(graph: dict[str, list[Edge]]) -> list[list[str]]:
    """The circles of ``graph``: each strongly connected set of two or more modules (or a
    module importing itself), sorted (Tarjan's algorithm, iteratively)."""
    successors = {
        m: sorted({e.target for e in edges if e.target in graph}) for m, edges in graph.items()
    }
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, 0)]
        while work:
            node, i = work.pop()
            if i == 0:
                index[node] = low[node] = len(index)
                stack.append(node)
                on_stack.add(node)
            nexts = successors[node]
            if i < len(nexts):
                work.append((node, i + 1))
                nxt = nexts[i]
                if nxt not in index:
                    work.append((nxt, 0))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in successors[node]:
                    cycles.append(sorted(component))
    return sorted(cycles)


def test_every_core_module_has_a_layer() -> None:
    for module in core_graph():
        layer_of(module)


def test_the_core_imports_only_down() -> None:
    found = upward_imports(core_graph())
    assert not found, "imports that run up the layers:\n" + "\n".join(found)


def test_the_core_has_no_import_cycles() -> None:
    cycles = import_cycles(core_graph())
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def _planted(sources: dict[str, str]) -> dict[str, list[Edge]]:
    known = set(sources)
    return {
        name: imports_of(name, name in {"tallow.kernels", "tallow.engine"}, text, known)
        for name, text in sources.items()
    }


def test_the_checkers_catch_a_planted_upward_import_and_circle() -> None:
    sources = {
        "tallow.kernels": "",
        "tallow.kernels.kv_cache": "from tallow.plugin import KVCodec\n",
        "tallow.plugin": "",
        "tallow.engine": "",
        # upward only when the function runs, still a dependency
        "tallow.engine.builder": "def build():\n    from .loader import load\n",
        "tallow.engine.loader": "def load():\n    import tallow.bench.perplexity\n",
        "tallow.bench": "",
        "tallow.bench.perplexity": (
            "import importlib\nimportlib.import_module('tallow.engine.builder')\n"
        ),
        "tallow.layers": (
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
            "    from tallow.engine import builder\n"
        ),
        # the package's lazy Python API imports the engine when the name is taken
        "tallow.plugin.registry": "from tallow import __version__, LLM\n",
    }
    graph = _planted(sources)
    found = upward_imports(graph)
    assert [f.split(" ")[0] for f in found] == [
        "tallow.kernels.kv_cache:1",
        "tallow.engine.loader:2",
        "tallow.layers:3",
        "tallow.plugin.registry:1",
    ], found
    assert LAZY["LLM"] == "tallow.engine.llm"
    assert import_cycles(graph) == [
        ["tallow.bench.perplexity", "tallow.engine.builder", "tallow.engine.loader"]
    ]
    # a module importing the package it sits in, which imports it back, is a circle too
    assert import_cycles(
        _planted(
            {
                "tallow.engine": "from . import builder\n",
                "tallow.engine.builder": "from tallow.engine import LLM\n",
            }
        )
    ) == [["tallow.engine", "tallow.engine.builder"]]
    clean = _planted(
        {
            "tallow.kernels": "",
            "tallow.engine": "",
            "tallow.engine.builder": "from tallow.kernels import rms_norm\nfrom .loader import x\n",
            "tallow.engine.loader": "import tallow.kernels\n",
        }
    )
    assert upward_imports(clean) == [] and import_cycles(clean) == []


def test_layer_of_takes_the_longest_prefix() -> None:
    assert layer_of("tallow.plugin.testing.engine") > layer_of("tallow.engine.core")
    assert layer_of("tallow.plugin.components") < layer_of("tallow.engine.core")
    assert layer_of("tallow.distributed.__main__") > layer_of("tallow.distributed.launch")
    assert layer_of("tallow") == 0
