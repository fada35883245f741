"""Each first-party plugin installed alone with the core: it imports, its entry point loads and
registers through the plugin manager, and its own tests pass, with no other tallow
distribution present except those it declares.

The environment: a fresh virtual environment per plugin (no pip, no system site-packages;
nothing is installed into it) whose site-packages is laid out as an installer would leave it:

- every third-party package of the environment running this test (torch, transformers, ...)
  as a symbolic link to its installed folder or file, so nothing is copied or reinstalled.
  Every file that belongs to a tallow distribution (``tallow`` and ``tallow-*``) is left out:
  the files its ``RECORD`` lists (the package itself, or an editable install's ``.pth`` file
  and import finder), its ``.dist-info``/``.egg-info`` metadata and ``.egg-link``; a ``.pth``
  file of another installer is copied without its lines that put a tallow source folder on
  the path;
- the core's package and the package of each tallow distribution the plugin needs, as links
  to their source folders in this tree (what is tested is this tree, as an editable install
  would), each with the metadata its wheel would carry: name, version, ``Requires-Dist``,
  entry points and top-level module, written from its pyproject.toml.

Which tallow distributions a plugin needs: those its ``dependencies`` name, transitively, for
the install check (steps 2–4 of tests/alone_runner.py); for its tests, also those its ``test``
extra names (a model plugin whose tests read weights through tallow-format-safetensors must say
so). When the two sets differ the install check runs in an environment of its own.

The interpreter of that environment runs the checks, with no ``PYTHONPATH``; a test that starts
``sys.executable`` (a fresh interpreter for a registration check, say) stays inside it.
Third-party packages are all visible: their declaration is what tests/test_plugin_dependencies.py
checks, from the source. What this test adds is what a reading of imports cannot show: a plugin
that reaches another through the plugin manager (a model test that loads weights through the
``gguf`` format, a backend that needs a KV codec registered) without declaring it.

Which tests (``PLUGINS_ALONE``):

- unset (CI): the plugin's conformance suites, ``tests/test_conformance*.py``, or its whole
  ``tests`` folder when it has none: :func:`alone_paths`. ``make test`` leaves exactly these
  paths out of its main pytest run (``--ignore``), so they run once, here, in the plugin's own
  environment, rather than twice; what the check adds to CI is one interpreter per plugin
  (two where its tests need more than it does). No marker filter: they run as the main run
  would run them (tests marked ``gpu`` skip themselves on a machine without one).
- ``full`` (``make test-alone``): the plugin's whole ``tests`` folder, as its own developer runs it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sysconfig
import time
import tomllib
import venv
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
PLUGINS = sorted(p.parent for p in ROOT.glob("plugins/*/*/pyproject.toml"))
RUNNER = Path(__file__).with_name("alone_runner.py")
FULL = os.environ.get("PLUGINS_ALONE", "") == "full"
#: seconds one plugin's checks may take: a guard against a hang, not a budget
TIMEOUT = 3600 if FULL else 1200


@cache
def _project(folder: Path) -> dict[str, Any]:
    return tomllib.loads((folder / "pyproject.toml").read_text())["project"]


@cache
def _first_party() -> dict[str, Path]:
    """Canonical distribution name → source folder, for every first-party plugin."""
    return {canonicalize_name(_project(p)["name"]): p for p in PLUGINS}


def _package(folder: Path) -> str:
    """The plugin's top-level module: the one its entry point names."""
    project = _project(folder)
    target = project["entry-points"]["tallow"][project["name"]]
    return target.split(":")[0].split(".")[0]


def _needs(requirements: list[str], seen: set[str] | None = None) -> set[str]:
    """The first-party plugins ``requirements`` name, with those their own requirements (and
    the extras named) name in turn."""
    seen = set() if seen is None else seen
    for text in requirements:
        req = Requirement(text)
        name = canonicalize_name(req.name)
        if name == "tallow" or (req.marker is not None and not req.marker.evaluate()):
            continue
        assert name in _first_party() or not name.startswith("tallow-"), (
            f"{text!r} names a tallow distribution that is not in plugins/"
        )
        if name not in _first_party() or name in seen:
            continue
        seen.add(name)
        project = _project(_first_party()[name])
        extras = project.get("optional-dependencies", {})
        nested = list(project.get("dependencies", []))
        for extra in req.extras:
            nested += extras.get(extra, [])
        _needs(nested, seen)
    return seen


def _runtime_needs(name: str) -> set[str]:
    return _needs(_project(_first_party()[name]).get("dependencies", []))


def _test_needs(name: str) -> set[str]:
    project = _project(_first_party()[name])
    test_extra = project.get("optional-dependencies", {}).get("test", [])
    return _needs(project.get("dependencies", []) + test_extra)


# ---------------------------------------------------------------------------------------------
# The third-party part of the environment
# ---------------------------------------------------------------------------------------------
def _site_dirs() -> list[Path]:
    import site

    dirs = list(site.getsitepackages())
    if site.ENABLE_USER_SITE:
        dirs.append(site.getusersitepackages())
    seen: list[Path] = []
    for d in map(Path, dirs):
        if d.is_dir() and d.resolve() not in [s.resolve() for s in seen]:
            seen.append(d)
    return seen


def _is_tallow(name: str | None) -> bool:
    name = canonicalize_name(name or "")
    return name == "tallow" or name.startswith("tallow-")


def _tallow_owned(site: Path) -> set[str]:
    """Names of the entries of ``site`` that belong to a tallow distribution."""
    owned: set[str] = set()
    for dist in metadata.distributions(path=[str(site)]):
        if not _is_tallow(dist.metadata["Name"]):
            continue
        meta = getattr(dist, "_path", None)  # its .dist-info / .egg-info folder
        if meta is not None:
            owned.add(Path(meta).name)
        for file in dist.files or []:
            located = Path(str(dist.locate_file(file)))
            if located.parent == site or site in located.parents:
                owned.add(located.relative_to(site).parts[0])
    owned |= {e.name for e in site.glob("*.egg-link") if _is_tallow(e.stem)}
    return owned - {"__pycache__"}


def _puts_tallow_on_path(line: str, site: Path) -> bool:
    """Whether a ``.pth`` line adds a folder holding the core or a tallow plugin package."""
    line = line.strip()
    if not line or line.startswith(("#", "import ", "import\t")):
        return False
    folder = (site / line).resolve()
    return (folder / "tallow" / "plugin").is_dir() or any(folder.glob("tallow_*/__init__.py"))


def third_party_entries(copies: Path) -> dict[str, Path]:
    """Entry name → what a plugin environment's site-packages holds under it: a link target,
    or a filtered copy of a ``.pth`` file (written into ``copies``). The first site folder
    holding a name wins, as on ``sys.path``."""
    entries: dict[str, Path] = {}
    for site in _site_dirs():
        owned = _tallow_owned(site)
        for entry in sorted(site.iterdir()):
            if entry.name in owned or entry.name in entries:
                continue
            if entry.suffix == ".pth" and entry.is_file():
                lines = entry.read_text().splitlines()
                kept = [line for line in lines if not _puts_tallow_on_path(line, site)]
                if len(kept) != len(lines):
                    copy = copies / f"{len(entries)}-{entry.name}"
                    copy.write_text("\n".join(kept) + "\n")
                    entries[entry.name] = copy
                    continue
            entries[entry.name] = entry
    assert "torch" in entries, "torch is not installed in this environment"
    return entries


@pytest.fixture(scope="session")
def third_party(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return third_party_entries(tmp_path_factory.mktemp("pth"))


# ---------------------------------------------------------------------------------------------
# One plugin's environment
# ---------------------------------------------------------------------------------------------
def _metadata(name: str, version: str, project: dict[str, Any]) -> str:
    lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    lines += [f"Requires-Dist: {r}" for r in project.get("dependencies", [])]
    for extra, reqs in project.get("optional-dependencies", {}).items():
        lines.append(f"Provides-Extra: {extra}")
        for text in reqs:
            req = Requirement(text)
            marker = f"({req.marker}) and " if req.marker else ""
            req.marker = None
            lines.append(f'Requires-Dist: {req}; {marker}extra == "{extra}"')
    return "\n".join(lines) + "\n"


def _entry_points(project: dict[str, Any]) -> str:
    groups = dict(project.get("entry-points", {}))
    if project.get("scripts"):
        groups["console_scripts"] = project["scripts"]
    return "".join(
        f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()) + "\n"
        for group, eps in groups.items()
    )


def _install_source(site: Path, folder: Path, package: Path) -> None:
    """The distribution of ``folder`` (a pyproject.toml) as a wheel would lay it out, its
    package a link to ``package`` in this tree."""
    project = _project(folder)
    name, version = project["name"], project["version"]
    (site / package.name).symlink_to(package, target_is_directory=True)
    info = site / f"{canonicalize_name(name).replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(_metadata(name, version, project))
    (info / "entry_points.txt").write_text(_entry_points(project))
    (info / "top_level.txt").write_text(package.name + "\n")
    (info / "INSTALLER").write_text("tests/test_plugins_alone.py\n")


def environment(where: Path, third_party: dict[str, Path], plugins: set[str]) -> Path:
    """A virtual environment at ``where`` holding the third-party packages, the core and the
    first-party ``plugins``; returns its interpreter."""
    venv.EnvBuilder(symlinks=True, with_pip=False).create(where)
    site = Path(sysconfig.get_path("purelib", vars={"base": str(where), "platbase": str(where)}))
    for entry, target in third_party.items():
        (site / entry).symlink_to(target, target_is_directory=target.is_dir())
    _install_source(site, ROOT, ROOT / "framework" / "tallow")
    for name in sorted(plugins):
        folder = _first_party()[name]
        _install_source(site, folder, folder / _package(folder))
    python = where / "bin" / "python"
    script = where / "bin" / "tallow"  # the core's console script, for tests that run it
    script.write_text(f"#!{python}\nimport sys\nfrom tallow.cli import main\nsys.exit(main())\n")
    script.chmod(0o755)
    return python


def child_env(env_dir: Path) -> dict[str, str]:
    """This process's environment without what would reach past the plugin's environment:
    the source tree on ``PYTHONPATH``, another virtual environment, pytest's and xdist's
    variables, tallow settings (``TALLOW_PLUGINS`` would choose plugins)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP")
        and not k.startswith(("TALLOW_", "PYTEST_"))
    }
    env["VIRTUAL_ENV"] = str(env_dir)
    env["PATH"] = f"{env_dir / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return env


def _run_checks(
    python: Path, name: str, hidden: list[str], pytest_args: list[str] | None, timeout: float
) -> dict[str, Any]:
    """Run tests/alone_runner.py in the environment of ``python``; its report and output."""
    env_dir = python.parents[1]
    report = env_dir / "report.json"
    spec = {
        "report": str(report),
        "package": _package(_first_party()[name]),
        "hidden": hidden,
        "pytest": pytest_args,
    }
    runner = env_dir / RUNNER.name  # its folder leads sys.path: keep it the environment's own
    shutil.copy(RUNNER, runner)
    try:
        proc = subprocess.run(
            [str(python), str(runner), json.dumps(spec)],
            cwd=ROOT,
            env=child_env(env_dir),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else exc.stdout
        pytest.fail(f"{name}: the checks ran past {timeout:.0f} s:\n{(out or '')[-6000:]}")
    found = json.loads(report.read_text()) if report.exists() else {}
    found["output"] = (proc.stdout[-8000:] + proc.stderr[-4000:]).strip()
    found["returncode"] = proc.returncode
    return found


def _check_install(found: dict[str, Any], name: str, present: set[str]) -> None:
    """Steps 2–4 of the runner: only ``present`` is there, and the plugin imports, loads,
    registers and resolves its components."""
    where = f"{name} alone with {', '.join(sorted(present - {name})) or 'the core only'}"
    assert found["returncode"] == 0, f"{where}: the runner failed\n{found['output']}"
    assert found["distributions"] == sorted(present | {"tallow"}), (where, found)
    assert not found["visible_hidden_modules"], (where, found["visible_hidden_modules"])
    failures = "\n".join(f"{m}:\n{e}" for m, e in found["import_failures"].items())
    assert not failures, f"{where}: modules that do not import:\n{failures}"
    listing = found["plugins_list"]
    assert listing["status"] == 0, f"{where}: tallow plugins list failed\n{listing['stderr']}"
    statuses = {p["name"]: p for p in listing["plugins"]}
    assert set(map(canonicalize_name, statuses)) == present | {"tallow"}, (where, statuses)
    bad = {n: (s["status"], s["reason"]) for n, s in statuses.items() if s["status"] != "ok"}
    assert not bad, f"{where}: plugins that did not load: {bad}"
    assert statuses[_project(_first_party()[name])["name"]]["components"], (
        f"{where}: the plugin registered no component"
    )


def _pytest_args(paths: list[Path]) -> list[str]:
    config = ["--rootdir", str(ROOT), "-c", str(ROOT / "pyproject.toml")]
    return ["-q", "-p", "no:cacheprovider", *config, *map(str, paths)]


def alone_paths(folder: Path) -> list[Path]:
    """The tests the CI form runs for the plugin in ``folder``: its conformance suites, else
    its whole tests folder."""
    tests = folder / "tests"
    return sorted(tests.glob("test_conformance*.py")) or [tests]


def test_make_test_leaves_to_this_check_exactly_what_it_runs() -> None:
    dry = subprocess.run(
        ["make", "-n", "-C", str(ROOT), "test", "PYTHON=python"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert dry.returncode == 0, dry.stderr
    (line,) = [line for line in dry.stdout.splitlines() if " -m pytest " in line]
    ignored = {
        ROOT / a.split("=", 1)[1].strip("'") for a in line.split() if a.startswith("--ignore=")
    }
    assert ignored == {p for folder in PLUGINS for p in alone_paths(folder)}


def test_a_plugin_without_the_plugin_it_imports_fails_here(
    tmp_path: Path, third_party: dict[str, Path]
) -> None:
    """The check can fail: tallow-model-deepseek builds on tallow-model-llama's modules; in an
    environment that leaves llama out, its modules do not import and `tallow plugins list`
    reports it broken (its components do not resolve)."""
    name = "tallow-model-deepseek"
    assert "tallow-model-llama" in _runtime_needs(name)
    python = environment(tmp_path / "env", third_party, {name})
    hidden = sorted(_package(_first_party()[n]) for n in set(_first_party()) - {name})
    found = _run_checks(python, name, hidden, None, TIMEOUT)
    assert found["returncode"] == 0, found["output"]
    assert found["distributions"] == ["tallow", name]
    assert not found["visible_hidden_modules"]
    assert "tallow_model_llama" in "".join(found["import_failures"].values())
    status = {p["name"]: p for p in found["plugins_list"]["plugins"]}[name]
    assert status["status"] == "broken" and "tallow_model_llama" in status["reason"], status


@pytest.mark.parametrize("name", sorted(_first_party()))
def test_plugin_alone(name: str, tmp_path: Path, third_party: dict[str, Path]) -> None:
    folder = _first_party()[name]
    runtime = _runtime_needs(name) | {name}
    testing = _test_needs(name) | {name}

    def hidden(present: set[str]) -> list[str]:
        return sorted(_package(_first_party()[n]) for n in set(_first_party()) - present)

    start = time.monotonic()
    python = environment(tmp_path / "test-env", third_party, testing)
    paths = [folder / "tests"] if FULL else alone_paths(folder)
    found = _run_checks(python, name, hidden(testing), _pytest_args(paths), TIMEOUT)
    if runtime == testing:
        _check_install(found, name, runtime)
    assert "pytest" in found, f"{name}: its tests did not run\n{found['output']}"
    assert found["pytest"] == 0, (
        f"{name}: its tests fail with only {', '.join(sorted(testing))} installed "
        f"(pytest {' '.join(map(str, paths))}); declare what they need in its pyproject\n"
        f"{found['output']}"
    )
    if runtime != testing:
        python = environment(tmp_path / "env", third_party, runtime)
        remaining = max(TIMEOUT - (time.monotonic() - start), 60.0)
        _check_install(_run_checks(python, name, hidden(runtime), None, remaining), name, runtime)
