"""Plugins reach tallow only through its public surface: tallow.plugin, tallow.layers,
tallow.kernels. Checked on the syntax tree of every module under plugins/ (tests excluded):
imports, and lazy ``"module:attr"`` registration targets naming a tallow module. A name taken
from one of those packages must be in its ``__all__``; tallow.kernels is used through the
package only (its submodules are the core's layout, not an API)."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PUBLIC = ("plugin", "layers", "kernels")
# names importable from the top-level package itself without reaching an internal
PUBLIC_TOP_LEVEL = PUBLIC + ("__version__",)
TARGET = re.compile(r"^tallow\.(\w+)(\.[\w.]+)?:[\w.]+$")
#: public packages whose submodules plugins may not import: everything goes through the package
PACKAGE_ONLY = ("kernels",)


def public_names(package: str) -> set[str]:
    """The ``__all__`` of ``tallow.<package>``, read from its source (importing it would import
    torch)."""
    init = ROOT / "framework" / "tallow" / package / "__init__.py"
    for node in ast.parse(init.read_text(encoding="utf-8")).body:
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.targets[0], ast.Name)
            and node.targets[0].id == "__all__"
        ):
            return set(ast.literal_eval(node.value))
    raise AssertionError(f"tallow.{package} has no __all__")


EXPORTS = {package: public_names(package) for package in PUBLIC}


def _allowed(module: str) -> bool:
    parts = module.split(".")
    if parts[0] != "tallow":
        return True
    if len(parts) < 2 or parts[1] not in PUBLIC:
        return False
    return len(parts) == 2 or parts[1] not in PACKAGE_ONLY


def _dynamic_imports(tree: ast.AST) -> set[str]:
    """Module names passed as literals to ``importlib.import_module`` or ``__import__``."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            called = getattr(node.func, "attr", None) or getattr(node.func, "id", None)
            if called in ("import_module", "__import__") and isinstance(node.args[0].value, str):
                names.add(node.args[0].value)
    return names


def violations(source: str, filename: str = "<string>") -> list[str]:
    """Every reference of ``source`` to a tallow internal, as ``file:line: what``."""
    tree = ast.parse(source, filename)
    dynamic = _dynamic_imports(tree)
    found: list[str] = []
    for node in ast.walk(tree):
        where = f"{filename}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "tallow" or not _allowed(alias.name):
                    found.append(f"{where}: import {alias.name}")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "tallow":
                found += [
                    f"{where}: from tallow import {a.name}"
                    for a in node.names
                    if a.name not in PUBLIC_TOP_LEVEL
                ]
            elif not _allowed(node.module):
                found.append(f"{where}: from {node.module} import ...")
            elif node.module.startswith("tallow."):
                package = node.module.split(".")[1]
                if node.module == f"tallow.{package}":
                    found += [
                        f"{where}: from {node.module} import {a.name} (not in its __all__)"
                        for a in node.names
                        if a.name not in EXPORTS[package]
                    ]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names_module = TARGET.match(node.value) or node.value in dynamic
            if names_module and not _allowed(node.value.partition(":")[0]):
                found.append(f"{where}: reference {node.value!r}")
    return found


def plugin_sources() -> list[Path]:
    return sorted(
        p
        for p in ROOT.glob("plugins/**/*.py")
        if "tests" not in p.relative_to(ROOT).parts and "build" not in p.parts
    )


def test_plugins_use_only_the_public_surface() -> None:
    found = [
        v
        for path in plugin_sources()
        for v in violations(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))
    ]
    assert not found, "plugins reach tallow internals:\n" + "\n".join(found)


def test_the_checker_catches_each_kind_of_reach() -> None:
    bad = """
import tallow.engine.scheduler
import tallow
from tallow.server import app
from tallow import LLM
from tallow.config import TallowConfig
import importlib
importlib.import_module("tallow.engine.runner")
import tallow.kernels.attention_ref
from tallow.kernels.pdl import wait_prior
from tallow.kernels import kv_cache, rms_norm
from tallow.layers import Attention, NotExported
from tallow.plugin import hookimpl, make_config

def register(registry):
    registry.register("x", "tallow.engine.sampling:Sampler")
    registry.register("y", "tallow.kernels.kv_cast:CastKVCodec")
"""
    found = violations(bad)
    assert len(found) == 13, found
    assert {f.split(": ", 1)[1] for f in found} >= {
        "import tallow.kernels.attention_ref",
        "from tallow.kernels.pdl import ...",
        "from tallow.kernels import kv_cache (not in its __all__)",
        "from tallow.layers import NotExported (not in its __all__)",
        "from tallow.plugin import make_config (not in its __all__)",
        "reference 'tallow.kernels.kv_cast:CastKVCodec'",
    }
    good = """
from tallow.plugin import hookimpl, AttentionBackend
from tallow.plugin.testing import make_config
from tallow.layers import Attention
from tallow.layers.attention import AttentionMetadata
from tallow.kernels import paged_attention_ref, step_jit as jit
import tallow.kernels
from tallow import __version__, plugin
import torch

def register(registry):
    registry.register("x", "tallow.layers.torch_attention:TorchAttentionBackend")
    registry.register("y", "tallow_mine.module:Thing")
"""
    assert violations(good) == []


def test_the_kernels_surface_is_documented_and_imports_no_triton() -> None:
    """Every public name of tallow.kernels is named in its docstring and resolves; importing the
    package imports torch but not Triton."""
    init = ROOT / "framework" / "tallow" / "kernels" / "__init__.py"
    doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
    undocumented = sorted(n for n in EXPORTS["kernels"] if f"``{n}" not in doc)
    assert not undocumented, (
        f"tallow.kernels exports names its docstring does not name: {undocumented}"
    )
    code = (
        "import sys, tallow.kernels as k; assert 'triton' not in sys.modules, 'triton'; "
        "[getattr(k, n) for n in k.__all__ if n not in k._LAZY]; "
        "assert 'triton' not in sys.modules, 'triton after the eager names'; "
        "import importlib.util as u; "
        "[getattr(k, n) for n in k.__all__] if u.find_spec('triton') else None"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
