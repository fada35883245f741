"""A griffe extension for the docs site: Sphinx cross-reference roles in tallow's docstrings.

The docstrings name other objects as ``:class:`~tallow.layers.Attention```, ``:func:`get_rope```
and so on. This extension checks that every such name still exists in tallow (a warning
otherwise, which fails the strict build: a renamed symbol cannot leave a stale reference in a
docstring) and renders the reference as inline code, the last component only when the name
starts with ``~``, as Sphinx does.
"""

from __future__ import annotations

import ast
import logging
import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|data|attr|exc|obj):`(~?)([\w.]+)(\(\))?`")
# mkdocs --strict counts the warnings logged under its own logger
_log = logging.getLogger("mkdocs.plugins.tallow_docs")


def _lazy_target(module: Any, part: str) -> str | None:
    """Where a module's ``__getattr__`` finds ``part``, from its ``_LAZY`` table, which static
    analysis cannot follow: ``{"LLM": "tallow.engine.llm:LLM"}`` (a full target) or
    ``{"PagedRunner": "paged_runner"}`` (a submodule holding the name)."""
    table = module.members.get("_LAZY") if getattr(module, "is_module", False) else None
    try:
        lazy = ast.literal_eval(str(table.value)) if table is not None else {}
    except (ValueError, SyntaxError):
        return None
    target = lazy.get(part) if isinstance(lazy, dict) else None
    if not isinstance(target, str):
        return None
    if ":" in target:
        return target.replace(":", ".")
    return f"{module.path}.{target}.{part}"


def _member(obj: Any, part: str) -> Any:
    """``obj``'s member ``part`` with aliases and lazy exports followed; None when absent,
    ``True`` when it comes from outside tallow (nothing further can be checked)."""
    members = getattr(obj, "members", None)
    if members is None:
        return None
    if part not in members:
        lazy = _lazy_target(obj, part)
        if lazy is None:
            return None
        try:
            return obj.modules_collection[lazy]
        except KeyError:
            return None
    member = members[part]
    if member.is_alias:
        try:
            return member.final_target
        except (griffe.AliasResolutionError, griffe.CyclicAliasError):
            return True
    return member


def _walk_path(obj: Any, parts: list[str]) -> bool:
    for part in parts:
        if obj is True:
            return True
        obj = _member(obj, part)
        if obj is None:
            return False
    return True


def _exists(root: griffe.Module, where: griffe.Object, name: str) -> bool:
    parts = name.lstrip(".").split(".")
    if parts[0] == root.name and not name.startswith("."):
        return _walk_path(root, parts[1:])
    # Relative, as Sphinx searches: the object itself, then its parents up to the package.
    scope: Any = where
    while scope is not None:
        if parts[0] in scope.members:
            return _walk_path(scope, parts)
        scope = scope.parent
    try:
        resolved = where.resolve(parts[0])
    except griffe.NameResolutionError:
        return False
    if resolved.split(".")[0] != root.name:
        return True  # torch, transformers, ...: outside what this can check
    return _walk_path(root, resolved.split(".")[1:] + parts[1:])


class SphinxRoles(griffe.Extension):
    """Checks and renders the Sphinx roles of every docstring in the ``tallow`` package."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        if pkg.name != "tallow":
            return
        self._walk(pkg, pkg)

    def _walk(self, root: griffe.Module, obj: griffe.Object) -> None:
        if obj.docstring is not None:
            obj.docstring.value = _ROLE.sub(
                lambda m: self._render(root, obj, m), obj.docstring.value
            )
        for member in obj.members.values():
            if not member.is_alias:
                self._walk(root, member)

    def _render(self, root: griffe.Module, obj: griffe.Object, m: re.Match[str]) -> str:
        short, name, call = m.group(1), m.group(2), m.group(3) or ""
        if not _exists(root, obj, name):
            _log.warning("%s: the docstring names %r, which is not in tallow", obj.path, name)
        shown = name.rsplit(".", 1)[-1] if short else name
        return f"`{shown}{call}`"
