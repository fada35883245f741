"""The cookiecutter template renders a plugin distribution that installs, is discovered, loads
and passes its own tests.

The template is rendered the way cookiecutter renders it (Jinja2 over the file names and
contents, each default in cookiecutter.json rendered in order with the values before it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import jinja2

ROOT = Path(__file__).resolve().parents[1]
TEMPLATE = ROOT / "cookiecutter"


def render(template: Path, out: Path, overrides: dict[str, str]) -> tuple[Path, dict[str, Any]]:
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    context: dict[str, Any] = {}
    for key, default in json.loads((template / "cookiecutter.json").read_text()).items():
        value = overrides.get(key, default)
        context[key] = env.from_string(value).render(cookiecutter=context) \
            if isinstance(value, str) else value
    (root,) = [p for p in template.iterdir() if p.is_dir() and "{{" in p.name]
    for path in sorted(root.rglob("*")):
        if "__pycache__" in path.parts or not path.is_file():
            continue
        rel = env.from_string(str(path.relative_to(template))).render(cookiecutter=context)
        dest = out / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(env.from_string(path.read_text()).render(cookiecutter=context))
    project = out / env.from_string(root.name).render(cookiecutter=context)
    return project, context


def _env(site: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TALLOW_")}
    env["PYTHONPATH"] = os.pathsep.join([str(site), *filter(None, [env.get("PYTHONPATH")])])
    env.update(extra)
    return env


def test_template_renders_an_installable_working_plugin(tmp_path: Path) -> None:
    project, ctx = render(TEMPLATE, tmp_path / "rendered", {"plugin_name": "ci_sample"})
    dist, package = ctx["project_slug"], ctx["package_name"]
    assert (dist, package) == ("tallow-ci-sample", "tallow_ci_sample")
    meta = tomllib.loads((project / "pyproject.toml").read_text())["project"]
    assert meta["name"] == dist
    assert meta["entry-points"]["tallow"] == {dist: f"{package}.plugin"}
    assert (project / package / "plugin.py").is_file()
    assert (project / "tests" / "test_plugin.py").is_file()
    assert "{{" not in "".join(p.read_text() for p in project.rglob("*.py"))

    site = tmp_path / "site"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
         "--no-index", "--disable-pip-version-check", "--target", str(site), str(project)],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr

    listing = subprocess.run([sys.executable, "-m", "tallow", "plugins", "list", "--json"],
                             capture_output=True, text=True, timeout=120,
                             env=_env(site, TALLOW_PLUGINS=dist))
    assert listing.returncode == 0, listing.stderr
    status = {p["name"]: p for p in json.loads(listing.stdout)}[dist]
    assert status["status"] == "ok", status["reason"]
    assert status["version"] == ctx["version"]
    assert status["components"] == {"tool_parser": ["ci_sample-calls"]}

    # the rendered project's own tests pass against the installed plugin
    tests = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                            "tests"], capture_output=True, text=True, timeout=300,
                           cwd=project, env=_env(site))
    assert tests.returncode == 0, tests.stdout + tests.stderr
    assert "4 passed" in tests.stdout
