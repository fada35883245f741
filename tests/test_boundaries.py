"""Plugins reach tallow only through its public surface: tallow.plugin, tallow.layers,
tallow.kernels. Checked on the syntax tree of every module under plugins/ (tests excluded):
imports, and lazy ``"module:attr"`` registration targets naming a tallow module."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PUBLIC = ("plugin", "layers", "kernels")
# names importable from the top-level package itself without reaching an internal
PUBLIC_TOP_LEVEL = PUBLIC + ("__version__",)
TARGET = re.compile(r"^tallow\.(\w+)(\.[\w.]+)?:[\w.]+$")


def _allowed(module: str) -> bool:
    parts = module.split(".")
    return parts[0] != "tallow" or (len(parts) > 1 and parts[1] in PUBLIC)


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
                found += [f"{where}: from tallow import {a.name}" for a in node.names
                          if a.name not in PUBLIC_TOP_LEVEL]
            elif not _allowed(node.module):
                found.append(f"{where}: from {node.module} import ...")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names_module = TARGET.match(node.value) or node.value in dynamic
            if names_module and not _allowed(node.value.partition(":")[0]):
                found.append(f"{where}: reference {node.value!r}")
    return found


def plugin_sources() -> list[Path]:
    return sorted(p for p in ROOT.glob("plugins/**/*.py")
                  if "tests" not in p.relative_to(ROOT).parts and "build" not in p.parts)


def test_plugins_use_only_the_public_surface() -> None:
    found = [v for path in plugin_sources()
             for v in violations(path.read_text(encoding="utf-8"),
                                 str(path.relative_to(ROOT)))]
    assert not found, "plugins reach tallow internals:\n" + "\n".join(found)


def test_the_checker_catches_each_kind_of_reach() -> None:
    bad = '''
import tallow.engine.scheduler
import tallow
from tallow.server import app
from tallow import LLM
from tallow.config import TallowConfig
import importlib
importlib.import_module("tallow.engine.runner")

def register(registry):
    registry.register("x", "tallow.engine.sampling:Sampler")
'''
    found = violations(bad)
    assert len(found) == 7, found
    good = '''
from tallow.plugin import hookimpl, AttentionBackend
from tallow.layers import Attention
import tallow.kernels.attention_ref
from tallow import __version__, plugin
import torch

def register(registry):
    registry.register("x", "tallow.layers.torch_attention:TorchAttentionBackend")
    registry.register("y", "tallow_mine.module:Thing")
'''
    assert violations(good) == []
