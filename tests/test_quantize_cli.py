"""`tallow quantize`: the core finds a quant scheme that writes the asked file type and hands it
the checkpoint a weight format read; without one it says what is offered."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, ClassVar

import pytest

from tallow.plugin import QuantScheme, hookimpl
from tallow.plugin.testing import isolated_plugin_manager
from tallow.quantize_cli import QuantizeError, find_file_quantizer, quantize_model


class RecordingScheme(QuantScheme):
    """Writes what it was given as JSON."""

    name: ClassVar[str] = "recording"
    file_types: ClassVar[tuple[str, ...]] = ("rec8", "rec4_m")

    @classmethod
    def quantize_file(
        cls,
        checkpoint: Any,
        out_path: str,
        file_type: str,
        *,
        device: str = "cpu",
        progress: bool = True,
    ) -> dict[str, Any]:
        Path(out_path).write_text(
            json.dumps(
                {
                    "type": file_type,
                    "device": device,
                    "arch": checkpoint.architecture,
                    "hidden": checkpoint.config["hidden_size"],
                }
            )
        )
        return {"file_type": file_type, "tensors": 0}


class SilentScheme(QuantScheme):
    name: ClassVar[str] = "silent"


class SchemePlugin:
    @hookimpl
    def tallow_register_quant_schemes(self, registry: Any) -> None:
        registry.register("silent", SilentScheme, priority=10)
        registry.register("recording", RecordingScheme, priority=0)


@pytest.fixture
def registries() -> Any:
    pm = isolated_plugin_manager(("tallow-test-schemes", SchemePlugin()), builtins=True)
    return pm.registries


def test_the_scheme_offering_the_type_writes_the_file(registries: Any, tmp_path: Path) -> None:
    out = tmp_path / "model.rec"
    summary = quantize_model(registries, "random:tiny-llama", str(out), "REC8", device="cpu")
    written = json.loads(out.read_text())
    assert written["type"] == "rec8" and written["device"] == "cpu"
    assert written["arch"] == "LlamaForCausalLM" and written["hidden"] == 64
    assert summary["scheme"] == "recording (tallow-test-schemes)"
    assert summary["source"] == "random:tiny-llama" and summary["file_type"] == "rec8"


def test_an_existing_output_needs_force(registries: Any, tmp_path: Path) -> None:
    out = tmp_path / "model.rec"
    out.write_text("keep me")
    with pytest.raises(QuantizeError, match="exists; pass --force"):
        quantize_model(registries, "random:tiny-llama", str(out), "rec8", device="cpu")
    assert out.read_text() == "keep me"
    quantize_model(registries, "random:tiny-llama", str(out), "rec8", device="cpu", force=True)
    assert json.loads(out.read_text())["type"] == "rec8"


def test_an_unknown_type_lists_what_the_schemes_offer(registries: Any) -> None:
    with pytest.raises(
        QuantizeError,
        match=r"'q9_k'.*recording \(tallow-test-schemes\): "
        r"rec8, rec4_m",
    ):
        find_file_quantizer(registries, "q9_k")


def test_the_command_without_any_file_writing_scheme_says_what_to_install(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TALLOW_")}
    env["TALLOW_PLUGINS"] = ""
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "tallow",
            "quantize",
            "random:tiny-llama",
            str(tmp_path / "x.gguf"),
            "--type",
            "q4_k_m",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert out.returncode == 2
    assert "no installed quant scheme writes model files" in out.stderr
    assert "tallow-quant-gguf" in out.stderr
    assert not (tmp_path / "x.gguf").exists()


def test_quant_scheme_base_writes_no_files() -> None:
    assert QuantScheme.file_types == ()
    with pytest.raises(NotImplementedError, match="does not write model files"):
        SilentScheme.quantize_file(None, "x", "q8_0")
