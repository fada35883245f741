"""The ``tallow`` command: plugins list, config show, lazily attached subcommands."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest
import yaml

from tallow import cli

ROOT = Path(__file__).resolve().parents[1]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TALLOW_")}
    env.update(extra)
    return env


def _tallow(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tallow", *args],
        capture_output=True,
        text=True,
        env=_env(**env),
        timeout=120,
        cwd=ROOT,
    )


def first_party_distributions() -> list[str]:
    """Names of the plugin distributions under plugins/, read at test time."""
    return sorted(
        tomllib.loads(p.read_text())["project"]["name"]
        for p in ROOT.glob("plugins/*/*/pyproject.toml")
    )


def test_help_and_plugin_listing_import_no_torch() -> None:
    script = textwrap.dedent("""
        import contextlib, io, sys
        from tallow.cli import main
        with contextlib.redirect_stdout(io.StringIO()) as out:
            try:
                main(["--help"])
            except SystemExit as exc:
                assert exc.code == 0, exc.code
        assert "plugins" in out.getvalue() and "config" in out.getvalue()
        with contextlib.redirect_stdout(io.StringIO()):
            assert main(["plugins", "list", "--json"]) == 0
            assert main(["config", "show"]) == 0
        heavy = sorted(m for m in ("torch", "triton", "transformers") if m in sys.modules)
        print(heavy)
    """)
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=_env(), timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]", "listing plugins imported " + proc.stdout


def test_every_first_party_plugin_loads_ok_on_a_fresh_install() -> None:
    proc = _tallow("plugins", "list", "--json")
    assert proc.returncode == 0, proc.stderr
    statuses = {p["name"]: p for p in json.loads(proc.stdout)}
    assert statuses["tallow"]["status"] == "ok" and statuses["tallow"]["mode"] == "builtin"
    for name in first_party_distributions():
        assert name in statuses, f"{name} is not discovered (is it installed? make install)"
        assert statuses[name]["status"] == "ok", statuses[name]["reason"]
        assert statuses[name]["components"], f"{name} registered nothing"


def test_plugins_list_table() -> None:
    proc = _tallow("plugins", "list", TALLOW_PLUGINS="")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split() == ["NAME", "VERSION", "STATUS", "MODE", "COMPONENTS", "/", "REASON"]
    core = next(line for line in lines if line.startswith("tallow "))
    assert " ok " in core and "attention_backend: torch" in core
    assert "kv_codec: auto (model dtype)" in core
    for name in first_party_distributions():
        row = next(line for line in lines if line.startswith(name + " "))
        assert " disabled " in row and "TALLOW_PLUGINS" in row


def test_plugins_list_shows_each_kv_codec_with_its_bits() -> None:
    proc = _tallow("plugins", "list", TALLOW_PLUGINS="tallow-kvcache-fp8")
    assert proc.returncode == 0, proc.stderr
    row = next(line for line in proc.stdout.splitlines() if line.startswith("tallow-kvcache-fp8 "))
    assert "kv_codec: fp8 (8 bits), fp8_e4m3 (8 bits), fp8_e5m2 (8 bits)" in row


def test_config_show_yaml_and_json_agree_and_follow_precedence(tmp_path: Path) -> None:
    path = tmp_path / "tallow.yaml"
    path.write_text("server:\n  port: 1111\n  api_keys: [hidden]\ncache:\n  block_size: 32\n")
    args = ("config", "show", "--config", str(path), "--max-num-seqs", "3")
    as_json = _tallow(*args, "--json", TALLOW_SERVER__PORT="2222")
    as_yaml = _tallow(*args, TALLOW_SERVER__PORT="2222")
    assert as_json.returncode == 0 and as_yaml.returncode == 0, as_json.stderr + as_yaml.stderr
    data = json.loads(as_json.stdout)
    assert yaml.safe_load(as_yaml.stdout) == data
    assert data["server"]["port"] == 2222 and data["cache"]["block_size"] == 32
    assert data["scheduler"]["max_num_seqs"] == 3
    assert data["server"]["api_keys"] == ["***"] and "hidden" not in as_yaml.stdout


def test_errors_exit_non_zero_with_the_message() -> None:
    bad = _tallow("config", "show", "--block-size", "12")
    assert bad.returncode == 2 and bad.stdout == ""
    assert (
        "cache.block_size (from flag --block-size): got '12', expected a power of two" in bad.stderr
    )
    missing = _tallow("plugins", "list", "--require-plugin", "tallow-not-installed>=1")
    assert missing.returncode == 1
    assert (
        "tallow-not-installed>=1 is required (plugins.require) but not installed" in missing.stderr
    )
    usage = _tallow("plugins")
    assert usage.returncode == 2 and "ACTION" in usage.stderr


def test_version() -> None:
    from tallow import __version__

    proc = _tallow("--version")
    assert proc.returncode == 0 and proc.stdout.strip() == f"tallow {__version__}"


def test_external_subcommands_attach_lazily(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "tallow_fake_cmd.py").write_text(
        textwrap.dedent("""
        def add_parser(subparsers):
            parser = subparsers.add_parser("fake", help="a fake command")
            parser.add_argument("--answer", type=int, required=True)
            parser.set_defaults(func=lambda args: args.answer)
            return parser
    """)
    )
    (tmp_path / "tallow_broken_cmd.py").write_text("raise ImportError('needs a GPU stack')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(
        cli,
        "EXTERNAL_COMMANDS",
        {
            "fake": ("tallow_fake_cmd", "a fake command"),
            "broken": ("tallow_broken_cmd", "a command whose module cannot import"),
            "absent": ("tallow_no_such_module.cli", "never listed"),
        },
    )
    monkeypatch.delitem(sys.modules, "tallow_fake_cmd", raising=False)

    parser = cli.build_parser(["plugins", "list"])
    assert "tallow_fake_cmd" not in sys.modules  # listed, not imported
    help_text = parser.format_help()
    assert "fake" in help_text and "a fake command" in help_text and "absent" not in help_text

    assert cli.main(["fake", "--answer", "7"]) == 7
    assert "tallow_fake_cmd" in sys.modules
    assert cli.main(["broken"]) == 2
    assert "the 'broken' command is not available: needs a GPU stack" in capsys.readouterr().err


def test_a_damaged_model_file_is_a_one_line_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Any command that loads a model (``tallow bench`` does) reports ModelFileError as one
    line naming the file and the field, without a traceback."""
    (tmp_path / "tallow_loads_cmd.py").write_text(
        textwrap.dedent("""
        from tallow.plugin import ModelFileError

        def fail(args):
            raise ModelFileError("/m/x.gguf", "metadata 'llama.block_count'", "7, but ...")

        def add_parser(subparsers):
            parser = subparsers.add_parser("loads")
            parser.set_defaults(func=fail)
            return parser
    """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(cli, "EXTERNAL_COMMANDS", {"loads": ("tallow_loads_cmd", "loads")})
    assert cli.main(["loads"]) == 1
    err = capsys.readouterr().err
    assert err == "tallow: /m/x.gguf: metadata 'llama.block_count': 7, but ...\n"


def test_plugins_list_groups_by_kind() -> None:
    proc = _tallow("plugins", "list", TALLOW_PLUGINS="tallow-kvcache-fp8,tallow-tool-json")
    assert proc.returncode == 0, proc.stderr
    headings = [line[:-1] for line in proc.stdout.splitlines() if line.endswith(":")]
    # the core first, then the kinds in their order, each once
    assert headings[0] == "core" and len(headings) == len(set(headings))
    order = [
        "core",
        "model",
        "format",
        "quant",
        "kvcache",
        "attention",
        "grammar",
        "reasoning",
        "speculator",
        "tool",
        "mcp",
        "ui",
        "other",
    ]
    assert headings == sorted(headings, key=order.index)
    kind = ""
    for line in proc.stdout.splitlines()[1:]:
        if line.endswith(":"):
            kind = line[:-1]
        elif line.startswith("tallow-"):
            assert line.split()[0].startswith(f"tallow-{kind}-"), (kind, line)
    as_json = json.loads(_tallow("plugins", "list", "--json").stdout)
    assert {p["name"]: p["kind"] for p in as_json}["tallow-kvcache-fp8"] == "kvcache"
