"""The distributions as users get them: every wheel built, checked by twine, installed from
the wheels (not the source tree) into a fresh environment, and serving a request.

The environment is a virtual environment over this one's site-packages (torch is not
reinstalled; the test asserts pip left it alone). The wheels install there with ``--no-deps``
and ``pip check`` then proves each one's dependencies are met by what is installed, torch
included. tallow and every plugin are then imported from the environment's own
site-packages, and ``tallow serve`` answers a completion on a ``random:`` model.

``make dist`` builds the same wheels plus an sdist of each project; here the wheels come from
one ``pip wheel`` call and only the core's sdist is built, to keep the test within CI's time.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
import tomllib
import urllib.request
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PLUGINS = sorted(p.parent for p in ROOT.glob("plugins/*/*/pyproject.toml"))
pytestmark = pytest.mark.slow


def _name(project: Path) -> str:
    return tomllib.loads((project / "pyproject.toml").read_text())["project"]["name"]


def _run(*args: str, timeout: float, **kwargs: object) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout, **kwargs)  # type: ignore[call-overload]
    assert proc.returncode == 0, (
        f"{' '.join(args[:4])} ...:\n{proc.stdout[-4000:]}{proc.stderr[-4000:]}"
    )
    return proc


def _clean_env() -> dict[str, str]:
    """This environment without the source tree on the path or tallow settings."""
    return {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "VIRTUAL_ENV") and not k.startswith(("TALLOW_", "PYTEST_"))
    }


def test_the_all_extra_lists_every_first_party_plugin() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    listed = {
        re.split(r"[<>=!~ ;\[]", r, maxsplit=1)[0] for r in project["optional-dependencies"]["all"]
    }
    assert listed == {_name(p) for p in PLUGINS}


def test_wheels_install_into_a_fresh_environment_and_serve(tmp_path: Path) -> None:
    # a copy of the sources, so that building leaves nothing in the tree
    src = tmp_path / "src"
    ignore = shutil.ignore_patterns("build", "dist", "*.egg-info", "__pycache__", "tests")
    shutil.copytree(ROOT / "framework", src / "framework", ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    projects = [src]
    for plugin in PLUGINS:
        dest = src / plugin.relative_to(ROOT)
        shutil.copytree(plugin, dest, ignore=ignore)
        projects.append(dest)

    dist = tmp_path / "dist"
    _run(
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "-q",
        "--no-deps",
        "--no-build-isolation",
        "-w",
        str(dist),
        *map(str, projects),
        timeout=900,
        env=_clean_env(),
    )
    _run(
        sys.executable,
        "-m",
        "build",
        "--sdist",
        "--no-isolation",
        "--outdir",
        str(dist),
        str(src),
        timeout=300,
        env=_clean_env(),
    )
    wheels = sorted(dist.glob("*.whl"))
    assert len(wheels) == len(PLUGINS) + 1, [w.name for w in wheels]
    _run(sys.executable, "-m", "twine", "check", "--strict", *map(str, dist.iterdir()), timeout=300)

    env_dir = tmp_path / "venv"
    venv.EnvBuilder(system_site_packages=True, with_pip=False).create(env_dir)
    python = str(env_dir / "bin" / "python")
    site = _run(
        python,
        "-c",
        "import sysconfig; print(sysconfig.get_paths()['purelib'])",
        timeout=60,
        env=_clean_env(),
    ).stdout.strip()
    if sys.prefix != sys.base_prefix:
        # run from a virtual environment (CI's): a new environment's system site-packages are
        # the base interpreter's, so the packages installed into this one (pillow, the
        # plugins' libraries) are made visible after the new environment's own — as a plain
        # path, so that this environment's editable installs are not activated there
        outer = sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
        (Path(site) / "_outer_environment.pth").write_text("\n".join(outer) + "\n")
    torch_before = _run(
        python,
        "-c",
        "import torch; print(torch.__version__, torch.__file__)",
        timeout=300,
        env=_clean_env(),
    ).stdout
    report = tmp_path / "report.json"
    _run(
        python,
        "-m",
        "pip",
        "install",
        "--no-deps",
        "--no-index",
        "--ignore-installed",
        "--report",
        str(report),
        *map(str, wheels),
        timeout=600,
        env=_clean_env(),
    )
    installed = {item["metadata"]["name"] for item in json.loads(report.read_text())["install"]}
    assert installed == {"tallow", *(_name(p) for p in PLUGINS)}
    assert not installed & {"torch", "triton"}
    # every requirement of the installed wheels is met (torch by the outer environment)
    check = subprocess.run(
        [python, "-m", "pip", "check"],
        capture_output=True,
        text=True,
        timeout=300,
        env=_clean_env(),
    )
    ours = [line for line in check.stdout.splitlines() if line.lower().startswith("tallow")]
    assert not ours, "\n".join(ours)
    torch_after = _run(
        python,
        "-c",
        "import torch; print(torch.__version__, torch.__file__)",
        timeout=300,
        env=_clean_env(),
    ).stdout
    assert torch_after == torch_before and site not in torch_after

    listing = json.loads(
        _run(
            python, "-m", "tallow", "plugins", "list", "--json", timeout=300, env=_clean_env()
        ).stdout
    )
    statuses = {p["name"]: p for p in listing}
    for plugin in PLUGINS:
        status = statuses[_name(plugin)]
        assert status["status"] == "ok", (status["name"], status["reason"])
    where = _run(
        python,
        "-c",
        "import tallow, tallow_model_llama; "
        "print(tallow.__file__); print(tallow_model_llama.__file__)",
        timeout=120,
        env=_clean_env(),
    ).stdout.split()
    assert all(path.startswith(site) for path in where), where

    _serve_one_request(python, tmp_path)


def _serve_one_request(python: str, tmp_path: Path) -> None:
    log = (tmp_path / "serve.log").open("w+")
    proc = subprocess.Popen(
        [
            python,
            "-m",
            "tallow",
            "serve",
            "--model",
            "random:tiny-llama",
            "--dtype",
            "float32",
            "--device",
            "cpu",
            "--max-model-len",
            "256",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=_clean_env(),
        cwd=tmp_path,
    )
    try:
        deadline = time.monotonic() + 300
        url = None
        while url is None:
            assert proc.poll() is None, "tallow serve exited:\n" + _tail(log)
            assert time.monotonic() < deadline, "tallow serve did not start:\n" + _tail(log)
            found = re.search(r"tallow: serving .* at (http://\S+)", _tail(log))
            url = found.group(1) if found else None
            time.sleep(0.5)
        body = json.dumps(
            {"model": "random:tiny-llama", "prompt": "hello", "max_tokens": 4, "temperature": 0}
        ).encode()
        request = urllib.request.Request(
            f"{url}/v1/completions", data=body, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=120) as response:
            answer = json.loads(response.read())
        assert answer["choices"][0]["finish_reason"] in ("length", "stop"), answer
        assert answer["usage"]["completion_tokens"] >= 1, answer
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def _tail(log: object) -> str:
    log.seek(0)  # type: ignore[attr-defined]
    return log.read()[-4000:]  # type: ignore[attr-defined]
