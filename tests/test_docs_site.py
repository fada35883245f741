"""The documentation site builds in strict mode, and its docstring-reference check bites.

``mkdocs build --strict`` fails on any warning: an API-reference entry (``::: tallow.x.Y``)
whose object was renamed or removed, a broken link between pages, or a Sphinx role in a
docstring (``:class:`~tallow.layers.Foo```) that names nothing in tallow (checked by
docs/_ext/sphinx_roles.py). The docs extra (``pip install -e '.[docs]'``, part of
``make install``) provides mkdocs.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _require_mkdocs() -> None:
    for module in ("mkdocs", "mkdocstrings_handlers.python", "material"):
        if importlib.util.find_spec(module) is None:
            pytest.fail(
                f"{module} is not installed: the docs extra is part of `make install` "
                "(pip install -e '.[docs]')"
            )


def test_site_builds_in_strict_mode(tmp_path):
    _require_mkdocs()
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    # not --quiet: it raises mkdocs' log level above WARNING, and strict mode then counts nothing
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout}{proc.stderr}"
    site = tmp_path / "site"
    layers = (site / "reference" / "layers" / "index.html").read_text()
    for name in (
        "tallow.layers.LayerNorm",
        "tallow.layers.get_act",
        "tallow.layers.Attention",
        "tallow.layers.rope_from_config",
    ):
        assert f'id="{name}"' in layers, f"the tallow.layers reference lacks {name}"
    api = (site / "reference" / "python-api" / "index.html").read_text()
    assert 'id="tallow.engine.llm.LLM"' in api
    guide = (site / "write-a-model-plugin" / "index.html").read_text()
    assert "GPTNeoXForCausalLM" in guide
    assert ":class:" not in layers, "a Sphinx role was left unrendered"


def _roles_extension():
    path = ROOT / "docs" / "_ext" / "sphinx_roles.py"
    spec = importlib.util.spec_from_file_location("tallow_docs_sphinx_roles", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_docstring_naming_a_missing_symbol_is_a_warning(caplog):
    _require_mkdocs()
    import griffe

    roles = _roles_extension()
    pkg = griffe.load("tallow", search_paths=[str(ROOT / "framework")], resolve_aliases=False)
    layers = pkg["layers"]
    norm = pkg["layers.layer_norm.LayerNorm"]
    # absolute, with ~, relative to the module, a member of a class, and outside tallow
    # ... and names a package's __getattr__ serves from its _LAZY table
    for good in (
        "tallow.layers.RMSNorm",
        "tallow.plugin.AttentionBackend",
        "RMSNorm",
        "LayerNorm.forward",
        "torch.nn.LayerNorm",
        "tallow.LLM",
        "tallow.SamplingParams",
        "tallow.plugin.testing.PagedRunner",
    ):
        assert roles._exists(pkg, norm, good), good
    for stale in (
        "tallow.layers.RMSNormal",
        "tallow.nothing.Here",
        "LayerNorm.backward",
        "NoSuchName",
        "tallow.LLMX",
        "tallow.plugin.testing.PagedRunnr",
    ):
        assert not roles._exists(pkg, norm, stale), stale

    norm.docstring.value = "See :class:`~tallow.layers.RMSNorm` and :func:`tallow.layers.gone`."
    with caplog.at_level("WARNING", logger="mkdocs.plugins.tallow_docs"):
        roles.SphinxRoles()._walk(pkg, layers)
    assert norm.docstring.value == "See `RMSNorm` and `tallow.layers.gone`."
    assert [r.getMessage() for r in caplog.records] == [
        "tallow.layers.layer_norm.LayerNorm: the docstring names 'tallow.layers.gone', which is "
        "not in tallow"
    ]
