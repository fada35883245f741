"""The weight-format suite: a tiny checkpoint written by the plugin's own test is claimed and
read back with the declared tensor names, shapes and values; damaged files give
:class:`~tallow.plugin.ModelFileError` naming the file.

::

    class TestMyFormat(WeightFormatConformance):
        distribution = "tallow-myformat"
        component = "myformat"

        def write_checkpoint(self, directory):
            config, tensors = tiny_llama_checkpoint()
            ...  # write them in the format under directory
            return WrittenCheckpoint(source=str(path), tensors=tensors,
                                     architecture="LlamaForCausalLM", files=[path])

``write_checkpoint`` runs once per test, in a fresh directory; it may use ``self.monkeypatch``
(pytest's fixture) to point the format at what it wrote (a hub cache, say).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pytest
import torch

from tallow.layers import QuantizedWeight

from ..components import Checkpoint, WeightFormat
from ..model_files import ModelFileError
from .component import ComponentConformance


@dataclass
class WrittenCheckpoint:
    """What a test wrote: the source to load, and what loading it must give."""

    source: str
    #: name (as the format yields it) → the values it must hold (float; a quantized tensor is
    #: compared through its ``dequantize()``)
    tensors: dict[str, torch.Tensor]
    architecture: str
    #: the weight files the damaged-file checks break (each in turn, in a fresh copy)
    files: list[Path] = field(default_factory=list)
    #: largest difference allowed between a loaded value and the written one
    atol: float = 0.0


def tiny_llama_checkpoint(seed: int = 0) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """An HF ``config.json`` dict and random float32 tensors, Hugging Face names, of a one-layer
    Llama (hidden 32, 4 heads, 2 KV heads, vocabulary 64)."""
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 64,
        "max_position_embeddings": 128,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
    }
    gen = torch.Generator().manual_seed(seed)
    shapes = {
        "model.embed_tokens.weight": (64, 32),
        "lm_head.weight": (64, 32),
        "model.norm.weight": (32,),
        "model.layers.0.input_layernorm.weight": (32,),
        "model.layers.0.post_attention_layernorm.weight": (32,),
        "model.layers.0.self_attn.q_proj.weight": (32, 32),
        "model.layers.0.self_attn.k_proj.weight": (16, 32),
        "model.layers.0.self_attn.v_proj.weight": (16, 32),
        "model.layers.0.self_attn.o_proj.weight": (32, 32),
        "model.layers.0.mlp.gate_proj.weight": (64, 32),
        "model.layers.0.mlp.up_proj.weight": (64, 32),
        "model.layers.0.mlp.down_proj.weight": (32, 64),
    }
    return config, {name: torch.randn(shape, generator=gen) for name, shape in shapes.items()}


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _empty(path: Path) -> None:
    path.write_bytes(b"")


def _scramble_header(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[:16] = b"\xff" * min(16, len(data))
    path.write_bytes(bytes(data))


#: ways of damaging one file: name → function
DAMAGES: dict[str, Callable[[Path], None]] = {
    "truncated": _truncate,
    "empty": _empty,
    "scrambled header": _scramble_header,
}


def _values(tensor: torch.Tensor | QuantizedWeight) -> torch.Tensor:
    return (tensor.dequantize() if isinstance(tensor, QuantizedWeight) else tensor).float()


class WeightFormatConformance(ComponentConformance):
    registry_kind = "weight_formats"
    base_class = WeightFormat

    def write_checkpoint(self, directory: Path) -> WrittenCheckpoint:
        """Write a tiny checkpoint in the format under ``directory`` (see the module
        docstring)."""
        raise NotImplementedError(f"{type(self).__name__} must implement write_checkpoint")

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        if "damage" in metafunc.fixturenames:
            metafunc.parametrize("damage", list(DAMAGES))

    @pytest.fixture(autouse=True)
    def _keep_monkeypatch(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.monkeypatch = monkeypatch

    def load(self, component_class: type[WeightFormat], written: WrittenCheckpoint) -> Checkpoint:
        checkpoint = component_class().load(written.source)
        assert isinstance(checkpoint, Checkpoint), f"load() returned {checkpoint!r}"
        return checkpoint

    def test_claims_what_it_wrote(
        self, component_class: type[WeightFormat], tmp_path: Path
    ) -> None:
        written = self.write_checkpoint(tmp_path / "written")
        assert component_class.claims(written.source) is True
        (tmp_path / "empty").mkdir()
        for other in (tmp_path / "empty", tmp_path / "absent"):
            assert not component_class.claims(str(other)), f"claims {other}"

    def test_yields_the_declared_tensors(
        self, component_class: type[WeightFormat], tmp_path: Path
    ) -> None:
        written = self.write_checkpoint(tmp_path / "written")
        checkpoint = self.load(component_class, written)
        assert checkpoint.architecture == written.architecture
        assert checkpoint.naming in ("hf", "gguf") and isinstance(checkpoint.config, dict)
        got = dict(checkpoint.tensors())
        assert sorted(got) == sorted(written.tensors), "tensor names differ from those written"
        for name, expected in written.tensors.items():
            assert tuple(got[name].shape) == tuple(expected.shape), name
            torch.testing.assert_close(
                _values(got[name]),
                expected.float(),
                rtol=0,
                atol=written.atol,
                msg=lambda m: f"{name}: {m}",
            )
        assert sorted(name for name, _ in checkpoint.tensors()) == sorted(got), (
            "tensors() cannot be iterated a second time"
        )
        if checkpoint.tensor_shapes is not None:
            assert checkpoint.tensor_shapes == {n: tuple(t.shape) for n, t in got.items()}

    def test_damaged_files_raise_model_file_error(
        self, component_class: type[WeightFormat], tmp_path: Path, damage: str
    ) -> None:
        files = self.write_checkpoint(tmp_path / "probe").files
        assert files, "WrittenCheckpoint.files names no weight file to damage"
        for index in range(len(files)):
            written = self.write_checkpoint(tmp_path / f"copy{index}")
            victim = written.files[index]
            DAMAGES[damage](victim)
            with pytest.raises(ModelFileError) as err:
                checkpoint = component_class().load(written.source)
                for _ in checkpoint.tensors():
                    pass
            assert victim.name in str(err.value), (
                f"the error does not name the {damage} file {victim.name}: {err.value}"
            )
