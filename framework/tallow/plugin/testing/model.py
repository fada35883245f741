"""The model-architecture suite: parity with Hugging Face ``transformers`` on a tiny random
config (logits of a prompt and of greedy steps, the greedy tokens), a check that the tiny
model's output is not trivially constant, a flat batch of chunked sequences, and the engine
generating what transformers generates.

::

    class TestMyModel(ModelArchitectureConformance):
        distribution = "tallow-mymodel"
        component = "MyModelForCausalLM"      # the HF ``architectures`` name it registers

        def hf_config(self):
            import transformers
            return transformers.MyModelConfig(hidden_size=64, num_hidden_layers=2, ...)

transformers builds the model of :meth:`~ModelArchitectureConformance.hf_config` with random
weights (norm weights and biases too), saves it as safetensors, and the registered class is
built from that ``config.json`` and loaded from those tensors.
"""

from __future__ import annotations

import json
import zlib
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import pytest
import torch

from tallow import SamplingParams
from tallow.layers import ArchConfig, BuildContext

from .component import ComponentConformance
from .engine import offline_llm
from .paged_runner import PagedRunner, randomize_
from .tokenizer import save_tokenizer

if TYPE_CHECKING:
    from transformers import PretrainedConfig


def assert_close_logits(
    ours: torch.Tensor, ref: torch.Tensor, what: str, rel: float = 1e-4
) -> None:
    """Logits agree to ``rel`` of their scale."""
    ref = ref.float()
    scale = max(1.0, float(ref.abs().max()))
    err = float((ours.float() - ref).abs().max())
    assert err <= rel * scale, f"{what}: max |diff| {err:.3e} > {rel:.0e} * scale {scale:.2f}"


def hf_greedy(
    model: Any,  # Any: a transformers causal LM of any architecture
    prompt: list[int],
    steps: int,
) -> tuple[list[int], list[torch.Tensor], torch.Tensor]:
    """transformers' greedy tokens, the logits of each step and the prompt's logits."""
    ids = torch.tensor([prompt])
    with torch.no_grad():
        prompt_logits = model(ids).logits[0]
        out = model.generate(
            ids,
            max_new_tokens=steps,
            min_new_tokens=steps,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
        )
    return out.sequences[0, len(prompt) :].tolist(), [s[0] for s in out.logits], prompt_logits


def random_hf_model(
    config: PretrainedConfig, seed: int = 0, std: float = 0.08
) -> Any:  # Any: a transformers causal LM of any architecture
    """A transformers causal LM of ``config`` in float32 eager attention, every parameter
    random (:func:`~tallow.plugin.testing.paged_runner.randomize_`), its head tied when the
    config says so, in eval mode."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(
        config, attn_implementation="eager", dtype=torch.float32
    )
    randomize_(model, seed, std)
    if getattr(config, "tie_word_embeddings", False):
        model.tie_weights()
    return model.eval()


def load_checkpoint_dir(directory: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """``config.json`` and every tensor of the safetensors files of a saved model."""
    from safetensors.torch import load_file

    tensors: dict[str, torch.Tensor] = {}
    for file in sorted(directory.glob("*.safetensors")):
        tensors.update(load_file(str(file)))
    return json.loads((directory / "config.json").read_text()), tensors


class ModelArchitectureConformance(ComponentConformance):
    registry_kind = "architectures"
    base_class = torch.nn.Module

    prompt: ClassVar[list[int]] = [3, 17, 50, 9, 64, 28, 5, 77, 31, 20, 1, 42]
    #: greedy steps compared with transformers
    steps: ClassVar[int] = 12
    #: logits agree to this fraction of their scale
    rel_tolerance: ClassVar[float] = 1e-4
    #: standard deviation of the random weights (norm weights are 1 + 0.2 N(0, 1))
    weight_std: ClassVar[float] = 0.08

    def hf_config(self) -> PretrainedConfig:
        """A tiny ``transformers`` config of the architecture (a ``PretrainedConfig``)."""
        raise NotImplementedError(f"{type(self).__name__} must implement hf_config")

    @pytest.fixture(scope="class")
    def transformers_model(self, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
        """(the transformers model with random weights, the directory it was saved to)."""
        pytest.importorskip("transformers", reason="transformers is the parity oracle")
        seed = zlib.crc32(self.component.encode()) % 1000
        model = random_hf_model(self.hf_config(), seed, std=self.weight_std)
        directory = tmp_path_factory.mktemp("model")
        model.save_pretrained(str(directory), safe_serialization=True)
        return model, directory

    @pytest.fixture(scope="class")
    def loaded(
        self,
        component_class: Any,  # Any: the model class, built as cls(ArchConfig, BuildContext)
        transformers_model: tuple[Any, Path],
    ) -> tuple[Any, set[str]]:
        """(the plugin's model built from the saved config and tensors, the parameters its
        ``load_weights`` says it filled)."""
        config, tensors = load_checkpoint_dir(transformers_model[1])
        model = component_class(ArchConfig(config), BuildContext())
        filled = model.load_weights(iter(tensors.items()), naming="hf")
        return model.eval(), set(filled)

    def test_config_names_the_architecture(self, transformers_model: tuple[Any, Path]) -> None:
        config = json.loads((transformers_model[1] / "config.json").read_text())
        assert config["architectures"] == [self.component]

    def test_loads_every_parameter(self, loaded: tuple[Any, set[str]]) -> None:
        model, filled = loaded
        needed = {
            name for name, p in model.named_parameters() if getattr(p, "from_checkpoint", True)
        }
        assert needed <= filled, f"parameters never loaded: {sorted(needed - filled)}"

    def test_greedy_parity_with_transformers(
        self, loaded: tuple[Any, set[str]], transformers_model: tuple[Any, Path]
    ) -> None:
        ref_tokens, ref_logits, ref_prompt = hf_greedy(
            transformers_model[0], self.prompt, self.steps
        )
        tokens, logits, prompt_logits = PagedRunner(loaded[0]).greedy(0, self.prompt, self.steps)
        assert_close_logits(prompt_logits, ref_prompt, "prompt logits", self.rel_tolerance)
        for i, (ours, ref) in enumerate(zip(logits, ref_logits)):
            assert_close_logits(ours, ref, f"logits of greedy step {i}", self.rel_tolerance)
        assert tokens == ref_tokens, "greedy tokens differ from transformers'"

    def test_output_is_not_trivially_constant(self, loaded: tuple[Any, set[str]]) -> None:
        """A model that ignores its input (a zero weight, a skipped layer) can still agree
        with a transformers model that is just as degenerate; the tiny one must not be."""
        tokens, _, prompt_logits = PagedRunner(loaded[0]).greedy(0, self.prompt, self.steps)
        assert len(set(prompt_logits.argmax(-1).tolist())) > 1, (
            "the prompt's next-token predictions are all the same token"
        )
        assert len(set(tokens)) > 1, f"greedy decoding repeats one token: {tokens}"
        assert float(prompt_logits.std(-1).min()) > 1e-3, "flat logits"

    def test_flat_batch_of_chunked_sequences(self, loaded: tuple[Any, set[str]]) -> None:
        """Two sequences sharing steps (one prefilled in two chunks beside the other's whole
        prompt and first decode) get the logits each gets alone."""
        model = loaded[0]
        a, b = self.prompt[:7], self.prompt[::-1]
        alone_a = PagedRunner(model).greedy(0, a, 0)[2]
        alone_b = PagedRunner(model).greedy(0, b, 0)[2]
        runner = PagedRunner(model)
        runner.add(0)
        runner.add(1)
        first_a, first_b = runner.step([(0, a[:3]), (1, b)])
        second_a, _ = runner.step([(0, a[3:]), (1, [int(first_b[-1].argmax())])])
        assert_close_logits(
            torch.cat([first_a, second_a]), alone_a, "chunked sequence", self.rel_tolerance
        )
        assert_close_logits(first_b, alone_b, "the sequence beside it", self.rel_tolerance)

    def test_engine_generates_what_transformers_does(
        self, transformers_model: tuple[Any, Path]
    ) -> None:
        """``LLM.generate`` with this plugin and tallow-format-safetensors (the saved directory plus a
        tiny tokenizer) gives transformers' greedy tokens."""
        from importlib.metadata import PackageNotFoundError, version

        try:
            version("tallow-format-safetensors")
        except PackageNotFoundError:
            pytest.skip(
                "needs the tallow-format-safetensors weight format installed to load the "
                "saved model"
            )

        hf, directory = transformers_model
        save_tokenizer(directory)
        ref_tokens = hf_greedy(hf, self.prompt, self.steps)[0]
        llm = self.llm(str(directory))
        params = SamplingParams(temperature=0.0, max_tokens=self.steps, ignore_eos=True)
        out = llm.generate([list(self.prompt)], params)[0]
        assert list(out.outputs[0].token_ids) == ref_tokens

    def llm(self, source: str) -> Any:  # Any: the engine's LLM, a layer above this kit
        plugins = ["tallow-format-safetensors"]
        if self.distribution not in ("tallow", "tallow-format-safetensors"):
            plugins.insert(0, self.distribution)
        return offline_llm(
            source,
            plugins=plugins,
            config={
                "model": {"dtype": "float32", "max_model_len": 64},
                "cache": {"num_blocks": 32, "block_size": 16},
            },
        )
