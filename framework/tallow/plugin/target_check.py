"""Whether a registered ``"module:attr"`` target resolves, found without importing it.

Registration stores targets as strings so that listing plugins imports no torch; a typo in one
would otherwise surface only when the component is first used. :func:`target_problem` finds the
module (importing only its parent packages, as the plugin's own registration module already did)
and reads its source for a top-level definition of the attribute: a class, function,
assignment or import. A module whose names cannot be known from its source (compiled, a
``from x import *``, a module ``__getattr__``) is given the benefit of the doubt;
``import_them=True`` imports every target instead, which also catches a missing dependency.
"""

from __future__ import annotations

import ast
import importlib.machinery
import importlib.util
import sys
from importlib.machinery import ModuleSpec
from pathlib import Path
from typing import Iterable

from .errors import ComponentLoadError, describe_exception, missing_attribute
from .registry import Entry, Registries


def _bound_names(targets: Iterable[ast.expr]) -> Iterable[str]:
    for target in targets:
        if isinstance(target, ast.Name):
            yield target.id
        elif isinstance(target, (ast.Tuple, ast.List)):
            yield from _bound_names(target.elts)
        elif isinstance(target, ast.Starred):
            yield from _bound_names([target.value])


def _module_names(body: list[ast.stmt]) -> tuple[set[str], bool]:
    """The names a module body binds at top level (in ``if``/``try``/``with`` blocks too), and
    whether others may exist that the source does not show."""
    names: set[str] = set()
    opaque = False
    for node in body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
            opaque |= node.name == "__getattr__"
        elif isinstance(node, ast.Assign):
            names.update(_bound_names(node.targets))
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            names.update(_bound_names([node.target]))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                if alias.name == "*":
                    opaque = True
                else:
                    names.add(alias.asname or alias.name.split(".")[0])
        else:
            blocks = [getattr(node, key, None) or [] for key in ("body", "orelse", "finalbody")]
            blocks += [h.body for h in getattr(node, "handlers", None) or []]
            for block in blocks:
                if block and isinstance(block[0], ast.stmt):
                    more, hidden = _module_names(block)
                    names |= more
                    opaque |= hidden
    return names, opaque


def _find_spec(module_name: str) -> ModuleSpec | None:
    """The spec of ``module_name``, found as the import system would find it but without
    running any package's ``__init__`` (``importlib.util.find_spec`` imports the parents, which
    may import torch): the top-level package through the finders, each submodule in its
    parent's search locations."""
    parts = module_name.split(".")
    spec: ModuleSpec | None = None
    locations: list[str] | None = None
    for depth in range(1, len(parts) + 1):
        name = ".".join(parts[:depth])
        module = sys.modules.get(name)
        if module is not None and depth < len(parts):
            locations = getattr(module, "__path__", None)
        else:
            if depth == 1:
                spec = importlib.util.find_spec(name)  # no parent: imports nothing
            elif locations is None:
                return None  # the parent is not a package
            else:
                spec = importlib.machinery.PathFinder.find_spec(name, list(locations))
            if spec is None:
                return None
            locations = spec.submodule_search_locations
    return spec


def target_problem(target: str) -> str | None:
    """What is wrong with ``target`` (``"module:attr"``), or None when it resolves (or cannot be
    judged without importing it). Imports at most the module's parent packages."""
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        return f"{target!r} is not of the form 'module:attr'"
    first = attr.split(".")[0]
    module = sys.modules.get(module_name)
    if module is not None:  # imported already: ask it
        return (
            None
            if hasattr(module, first)
            else missing_attribute(f"module {module_name}", first, dir(module))
        )
    try:
        spec = _find_spec(module_name)
    except Exception as exc:  # a finder failed
        return f"cannot find module {module_name}: {describe_exception(exc)}"
    if spec is None:
        return f"no module named {module_name!r}"
    origin = spec.origin or ""
    if not origin.endswith(".py"):
        return None  # compiled or a namespace package: only importing it would tell
    try:
        tree = ast.parse(Path(origin).read_text(encoding="utf-8"), origin)
    except SyntaxError as exc:
        return f"module {module_name} does not compile: {exc.msg} ({origin}:{exc.lineno})"
    except (OSError, ValueError) as exc:
        return f"cannot read module {module_name} ({origin}): {exc}"
    names, opaque = _module_names(tree.body)
    if first in names or opaque:
        return None
    return missing_attribute(f"module {module_name}", first, names)


def _imported_problem(entry: Entry) -> str | None:
    try:
        entry.load()
    except ComponentLoadError as exc:
        return exc.detail
    return None


def target_problems(
    registries: Registries, distribution: str, *, import_them: bool = False
) -> list[str]:
    """``"<kind> '<name>': target '<target>': <problem>"`` for each lazy target registered by
    ``distribution`` that does not resolve (imported only with ``import_them``)."""
    problems = []
    for registry in registries.all():
        for entry in registry:
            if entry.distribution != distribution or not entry.lazy:
                continue
            problem = _imported_problem(entry) if import_them else target_problem(str(entry.target))
            if problem:
                problems.append(f"{entry.kind} {entry.name!r}: target {entry.target!r}: {problem}")
    return problems
