"""``random:<shape>`` models: real architectures and shapes, random weights made on the device.

Speed does not depend on weight values, so benchmarks and GPU parity tests use these instead of
multi-gigabyte downloads. The vocabulary is synthetic (token ``i`` reads ``<i>``).
"""

from __future__ import annotations

from typing import Any, ClassVar, Iterator

import torch

from tallow.plugin import Checkpoint, WeightFormat

from .random_shapes import SHAPES


def shape_config(source: str) -> dict[str, Any]:
    name = source[len("random:") :] if source.startswith("random:") else source
    if name not in SHAPES:
        raise ValueError(
            f"model.source: unknown random shape {name!r}; expected "
            f"random:<shape> with shape one of {', '.join(sorted(SHAPES))}"
        )
    config = {
        "model_type": "random",
        "hidden_act": "silu",
        "attention_bias": False,
        "torch_dtype": "bfloat16",
        **SHAPES[name],
    }
    return config


def synthetic_tokenizer(vocab_size: int) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {f"<{i}>": i for i in range(vocab_size)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<0>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    return tok


#: standard deviation of the random matrices
RANDOM_STD = 0.02


@torch.no_grad()
def initialize_random(model: torch.nn.Module, seed: int = 0, progress: str | None = None) -> None:
    """Fill every parameter on its own device: matrices ~ N(0, 0.02), norms 1, biases 0.

    A parameter that carries ``random_fill(generator, std)`` (a quantization method whose
    storage is made from float weights, e.g. while quantizing at load) fills itself: it draws
    its float weights, one layer at a time, so no float copy of the whole model exists.
    ``progress`` titles a progress bar over the parameters (shown on a terminal only)."""
    from tqdm.auto import tqdm

    gen = None
    params = list(model.named_parameters())
    for name, param in tqdm(
        params,
        desc=progress,
        unit="tensor",
        leave=False,
        disable=True if progress is None else None,
    ):
        if gen is None or gen.device != param.device:
            gen = torch.Generator(device=param.device).manual_seed(seed)
        fill = getattr(param, "random_fill", None)
        if fill is not None:
            fill(gen, RANDOM_STD)
        elif name.endswith("bias"):
            param.zero_()
        elif param.dim() == 1:
            param.fill_(1.0)
        elif param.is_floating_point():
            param.normal_(0.0, RANDOM_STD, generator=gen)


class RandomWeights(WeightFormat):
    name: ClassVar[str] = "random"

    @classmethod
    def claims(cls, source: str) -> bool:
        return isinstance(source, str) and source.startswith("random:")

    def load(self, source: str, *, revision: str | None = None) -> Checkpoint:
        config = shape_config(source)

        def tensors() -> Iterator[tuple[str, torch.Tensor]]:
            return iter(())

        quantization = config.get("quantization_config")
        return Checkpoint(
            source=source,
            config=config,
            architecture=config["architectures"][0],
            # a shape whose real checkpoints are quantized is built with their quant scheme
            quantization=quantization.get("quant_method") if quantization else None,
            tensors=tensors,
            naming="random",
            tokenizer=synthetic_tokenizer(config["vocab_size"]),
            tokenizer_config={"eos_token": "<0>", "add_bos_token": False},
        )
