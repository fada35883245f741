"""Parity of a model plugin with transformers beyond the conformance suite's one tiny config:
more configs and prompts, other weight formats, the GPU, and the whole engine.

::

    from tallow.plugin.testing.model_parity import (
        assert_greedy_parity, load_saved, random_hf_model)
    from tallow_format_safetensors.format import SafetensorsFormat

    def test_longrope(tmp_path):
        hf = random_hf_model(transformers.Phi3Config(...), seed=0)
        model = load_saved(hf, tmp_path, Phi3ForCausalLM, SafetensorsFormat().load)
        assert_greedy_parity(model, hf, prompt, steps=20)

transformers is imported only by the helpers that build its models.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch

from tallow import SamplingParams
from tallow.layers import ArchConfig, BuildContext, CausalLM
from tallow.plugin.components import Checkpoint

from .engine import offline_llm
from .model import assert_close_logits, hf_greedy, random_hf_model
from .paged_runner import PagedRunner
from .tokenizer import save_tokenizer

__all__ = [
    "random_hf_model",
    "assert_greedy_parity",
    "assert_cuda_parity",
    "assert_engine_greedy",
    "load_model",
    "load_saved",
    "expert_choices",
]


def assert_greedy_parity(
    model: CausalLM,
    hf: Any,  # Any: a transformers causal LM of any architecture
    prompt: list[int],
    steps: int = 20,
    *,
    rel: float = 1e-4,
    what: str = "",
) -> list[int]:
    """``model`` (through a :class:`PagedRunner`, on its own device) matches transformers'
    ``hf`` on ``prompt``: the prompt's logits, ``steps`` greedy tokens and the logits of every
    step, to ``rel`` of their scale. Also asserts that the weights are random enough for the
    check to mean something: the greedy tokens and the prompt's argmaxes are not all one token.
    Returns the tokens."""
    ref_tokens, ref_logits, ref_prompt = hf_greedy(hf, prompt, steps)
    tokens, logits, prompt_logits = PagedRunner.holding(model, len(prompt) + steps).greedy(
        0, prompt, steps
    )
    assert_close_logits(prompt_logits.cpu(), ref_prompt, f"{what}: prompt logits", rel)
    for i, (ours, ref) in enumerate(zip(logits, ref_logits)):
        assert_close_logits(ours.cpu(), ref, f"{what}: logits of step {i}", rel)
    assert tokens == ref_tokens, f"{what}: greedy tokens differ: {tokens} != {ref_tokens}"
    assert len(set(ref_tokens)) > 1, f"{what}: greedy output is one token repeated"
    assert len(set(ref_prompt.argmax(-1).tolist())) > 1, f"{what}: logits ignore the input"
    return tokens


def assert_cuda_parity(
    load: Callable[..., Any],
    hf: Any,  # Any: a transformers causal LM of any architecture
    prompt: list[int],
    steps: int = 20,
    *,
    what: str = "",
    bf16_rel: float = 5e-2,
) -> None:
    """On a CUDA device: ``load(dtype=torch.float32, device="cuda")`` has every parameter and
    buffer on the device and passes :func:`assert_greedy_parity` against ``hf`` (transformers on
    the CPU); ``load(dtype=torch.bfloat16, device="cuda")`` gives prompt logits within
    ``bf16_rel`` of it."""
    model = load(dtype=torch.float32, device="cuda")
    assert all(t.is_cuda for t in [*model.parameters(), *model.buffers()])
    assert_greedy_parity(model, hf, prompt, steps, what=f"{what} on cuda")
    low = load(dtype=torch.bfloat16, device="cuda")
    logits = PagedRunner.holding(low, len(prompt)).greedy(0, prompt, 0)[2]
    with torch.no_grad():
        ref = hf(torch.tensor([prompt])).logits[0]
    assert_close_logits(logits.cpu(), ref, f"{what}: bfloat16 prompt logits", bf16_rel)


def assert_engine_greedy(
    path: str | Path,
    hf: Any,  # Any: a transformers causal LM of any architecture
    prompts: Sequence[list[int]],
    steps: int,
    *,
    plugins: Sequence[str],
    config: Mapping[str, Any] | None = None,
) -> None:
    """The whole engine on the saved model directory ``path`` (given a tiny tokenizer if it has
    none), with exactly the core and ``plugins`` loaded
    (:func:`~tallow.plugin.testing.engine.offline_llm`), generates transformers' greedy tokens
    for every prompt, all prompts in one batch. ``config`` adds settings (``{"model":
    {"device": "cuda"}}``); the model runs in float32 unless it says otherwise."""
    root = Path(path)
    if not (root / "tokenizer.json").exists():
        save_tokenizer(root)
    settings = {key: dict(value) for key, value in (config or {}).items()}
    settings.setdefault("model", {}).setdefault("dtype", "float32")
    llm = offline_llm(str(root), plugins=plugins, config=settings)
    outs = llm.generate(
        [list(p) for p in prompts],
        SamplingParams(temperature=0.0, max_tokens=steps, ignore_eos=True),
    )
    for prompt, out in zip(prompts, outs):
        expected = hf_greedy(hf, list(prompt), steps)[0]
        assert list(out.outputs[0].token_ids) == expected, f"prompt {list(prompt)}"


def expert_choices(model: CausalLM, prompt: list[int]) -> list[torch.Tensor]:
    """The expert ids [tokens, top_k] every :class:`~tallow.layers.FusedMoE` layer of
    ``model`` chooses for ``prompt`` (one prefill through a :class:`PagedRunner`), in layer
    order: a parity check means something for the experts only if the prompt reaches most of
    them."""
    from tallow.layers import FusedMoE

    chosen: list[torch.Tensor] = []
    hooks = [
        m.experts.register_forward_hook(lambda mod, args, out: chosen.append(args[2]))
        for m in model.modules()
        if isinstance(m, FusedMoE)
    ]
    try:
        PagedRunner.holding(model, len(prompt)).greedy(0, prompt, 0)
    finally:
        for hook in hooks:
            hook.remove()
    return chosen


def load_model(
    cls: type[CausalLM],
    checkpoint: Checkpoint,
    *,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    config: Mapping[str, Any] | None = None,
) -> CausalLM:
    """Build ``cls`` from a weight format's checkpoint (its config, or ``config``), load its
    tensors under the checkpoint's naming, and put it in eval mode."""
    build = BuildContext(dtype=dtype, device=torch.device(device))
    model = cls(ArchConfig(dict(config if config is not None else checkpoint.config)), build)
    model.load_weights(checkpoint.tensors(), naming=checkpoint.naming)
    return model.eval()


def load_saved(
    hf: Any,  # Any: a transformers causal LM of any architecture
    path: str | Path,
    cls: type[CausalLM],
    read: Callable[[str], Checkpoint],
    *,
    config: Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> CausalLM:  # Any: load_model's dtype and device
    """Save transformers' ``hf`` as safetensors at ``path`` (once: a directory that already
    holds it is reused), read it back with a weight format's ``read`` (``SafetensorsFormat()
    .load``), check the architecture it reports, and :func:`load_model` ``cls`` from it;
    ``config`` entries replace the checkpoint's."""
    path = Path(path)
    if not (path / "config.json").exists():
        hf.save_pretrained(str(path), safe_serialization=True)
    checkpoint = read(str(path))
    assert checkpoint.architecture in cls.hf_architectures, checkpoint.architecture
    return load_model(cls, checkpoint, config={**checkpoint.config, **(config or {})}, **kwargs)
