"""The cookiecutter template renders, for every kind of component, a plugin distribution that
installs, is discovered through its entry point, loads, and passes its own tests (tallow's
conformance suite for the kind among them).

All kinds are rendered with cookiecutter and installed editable into one virtual environment
layered on the current one (``--system-site-packages`` plus this environment's site directory,
so tallow and its test dependencies are the ones under test); each project's tests then run
in that environment, in a subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
import sysconfig
import tomllib
import venv
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

cookiecutter_main = pytest.importorskip(
    "cookiecutter.main", reason="cookiecutter renders the template"
)

ROOT = Path(__file__).resolve().parents[1]
TEMPLATE = ROOT / "cookiecutter"
KINDS = json.loads((TEMPLATE / "cookiecutter.json").read_text())["kind"]
#: what each kind registers: (registry kind, component name for plugin_name "ci-<kind>")
COMPONENTS = {
    "tool-parser": ("tool_parser", "ci_tool_parser"),
    "model": ("architecture", "ArceeForCausalLM"),
    "weight-format": ("weight_format", "ci_weight_format"),
    "quant-scheme": ("quant_scheme", "ci_quant_scheme"),
    "kv-codec": ("kv_codec", "ci_kv_codec"),
    "attention-backend": ("attention_backend", "ci_attention_backend"),
    "tool-provider": ("tool_provider", "ci_tool_provider"),
    "routes": ("route", "/ci-routes"),
    "grammar-backend": ("grammar_backend", "ci_grammar_backend"),
}
#: modules a rendered plugin may import from tallow
PUBLIC = ("tallow.plugin", "tallow.layers", "tallow.kernels")


def render(kind: str, out: Path) -> Path:
    return Path(
        cookiecutter_main.cookiecutter(
            str(TEMPLATE),
            no_input=True,
            output_dir=str(out),
            extra_context={"kind": kind, "plugin_name": f"ci-{kind}"},
        )
    )


def layered_venv(path: Path) -> Path:
    """A virtual environment that sees this one's packages (editable installs included)."""
    venv.EnvBuilder(system_site_packages=True, with_pip=False).create(path)
    python = path / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    ours = sysconfig.get_paths()["purelib"]
    # addsitedir runs this environment's .pth files (the editable finders) too
    (Path(site) / "tallow-test-parent.pth").write_text(f"import site; site.addsitedir({ours!r})\n")
    return python


def clean_env() -> dict[str, str]:
    return {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("TALLOW_", "PYTEST_", "VIRTUAL_ENV"))
    }


def test_every_kind_renders_installs_and_passes_its_tests(tmp_path: Path) -> None:
    assert set(KINDS) == set(COMPONENTS)
    projects = {kind: render(kind, tmp_path / "rendered") for kind in KINDS}
    for kind, project in projects.items():
        files = {p.relative_to(project).as_posix() for p in project.rglob("*") if p.is_file()}
        package = project.name.replace("-", "_")
        assert {
            "pyproject.toml",
            "README.md",
            "PUBLISHING.md",
            ".gitignore",
            f"{package}/plugin.py",
            "tests/test_conformance.py",
        } <= files, (kind, files)
        modules = [f for f in files if f.startswith(f"{package}/") and f.endswith(".py")]
        assert len(modules) == 3, f"{kind}: expected __init__, plugin and one component: {modules}"
        meta = tomllib.loads((project / "pyproject.toml").read_text())["project"]
        assert meta["entry-points"]["tallow"] == {project.name: f"{package}.plugin"}
        for source in project.rglob("*.py"):
            text = source.read_text()
            assert "cookiecutter." not in text and "{%" not in text, source
            for line in text.splitlines():
                if line.startswith(("from tallow", "import tallow")):
                    module = line.split()[1]
                    if module == "tallow" or module.startswith("tallow."):
                        assert module.startswith(PUBLIC), f"{source}: {line}"

    python = layered_venv(tmp_path / "venv")
    install = subprocess.run(
        [
            str(python),
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--disable-pip-version-check",
            *[arg for p in projects.values() for arg in ("-e", str(p))],
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=clean_env(),
    )
    assert install.returncode == 0, install.stdout + install.stderr

    listing = subprocess.run(
        [str(python), "-m", "tallow", "plugins", "list", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        env=clean_env(),
    )
    assert listing.returncode == 0, listing.stderr
    statuses = {p["name"]: p for p in json.loads(listing.stdout)}
    for kind, project in projects.items():
        status = statuses[project.name]
        assert status["status"] == "ok", (kind, status["reason"])
        registry_kind, component = COMPONENTS[kind]
        assert status["components"] == {registry_kind: [component]}, (kind, status)

    def own_tests(project: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs"],
            capture_output=True,
            text=True,
            timeout=600,
            cwd=project,
            env=clean_env(),
        )

    # the runs are independent, and each spends most of its time importing torch: one per core
    with ThreadPoolExecutor(max_workers=min(len(projects), os.cpu_count() or 1)) as pool:
        runs = dict(zip(projects, pool.map(own_tests, projects.values())))
    failures = [
        f"--- {kind}:\n{run.stdout[-3000:]}{run.stderr[-1500:]}"
        for kind, run in runs.items()
        if run.returncode != 0 or " passed" not in run.stdout or "skipped" in run.stdout
    ]
    assert not failures, "\n".join(failures)
