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

import copy
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch

from tallow import SamplingParams
from tallow.layers import ArchConfig, BuildContext, CausalLM
from tallow.plugin.components import Checkpoint

from .engine import offline_llm
from .model import assert_close_logits, hf_greedy, random_hf_model
from .paged_runner import PagedRunner, prefill_logits
from .tokenizer import save_tokenizer

__all__ = [
    "random_hf_model",
    "assert_greedy_parity",
    "assert_cuda_parity",
    "assert_engine_greedy",
    "load_model",
    "load_saved",
    "expert_choices",
    "routing_margins",
    "routing_agreement",
    "clear_routing_prompt",
    "logits_routed_alike",
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
    bf16_prompt: list[int] | None = None,
    device: str = "cuda",
) -> None:
    """On a CUDA device (or ``device``): ``load(dtype=torch.float32, device="cuda")`` has
    every parameter and buffer on the device and passes :func:`assert_greedy_parity` against
    ``hf`` (transformers on the CPU); ``load(dtype=torch.bfloat16, device="cuda")`` gives
    prompt logits (of ``bf16_prompt`` if given) close to ``hf``'s: within ``bf16_rel`` of
    their scale, or within twice as far as transformers' own bfloat16 run lies from ``hf``
    where that is further (how far bfloat16 rounding alone moves this model's logits; ours
    rounds at other places, another deviation of that size).

    A mixture-of-experts model whose router meets a near-tie (:func:`routing_margins`) may
    choose other experts on the GPU than on the CPU, or in bfloat16 than in float32, and from
    that token on its logits rightly differ by far more than rounding. So each comparison
    first finds the first token whose experts differ from the reference run's (our model in
    float32 on the CPU for the float32 check, in float32 on the GPU for the bfloat16 one),
    asserts that the reference's routing margin there is within the comparison's own
    tolerance (a choice with a wider margin must not change: a wrong kernel or loader), and
    compares the logits of the tokens before it. A prompt from :func:`clear_routing_prompt`
    has no near-tie: every token is compared (the greedy tokens that follow may still meet
    one)."""
    model = load(dtype=torch.float32, device=device)
    kind = torch.device(device).type
    assert all(t.device.type == kind for t in [*model.parameters(), *model.buffers()])
    ref_tokens = hf_greedy(hf, prompt, steps)[0]
    sequence = [*prompt, *ref_tokens[:-1]]
    agree = len(sequence)
    if _has_experts(model):
        cpu = load(dtype=torch.float32, device="cpu")
        agree = routing_agreement(cpu, model, sequence, 1e-4, f"{what} on {device}")
    if agree == len(sequence):
        assert_greedy_parity(model, hf, prompt, steps, what=f"{what} on {device}")
    else:
        _assert_prefix_logits(model, hf, sequence, agree, 1e-4, f"{what} on {device}")
    low = load(dtype=torch.bfloat16, device=device)
    prompt = bf16_prompt if bf16_prompt is not None else prompt
    agree = routing_agreement(model, low, prompt, bf16_rel, f"{what} in bfloat16")
    rel = max(bf16_rel, 2 * _bfloat16_deviation(hf, prompt, agree))
    _assert_prefix_logits(low, hf, prompt, agree, rel, f"{what}: bfloat16 prompt logits")
    if agree < len(prompt):
        # past the near-tie transformers is no oracle; our float32 model given the experts
        # (and weights) the bfloat16 run chose computes what the bfloat16 one should
        ours, ref = logits_routed_alike(low, model, prompt)
        what = f"{what}: bfloat16 prompt logits, float32 routed alike"
        assert_close_logits(ours.float().cpu(), ref.float().cpu(), what, rel)


def logits_routed_alike(
    model: CausalLM, ref: CausalLM, tokens: list[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """The prefill logits of ``tokens`` by ``model``, and by ``ref`` with every MoE layer
    handed the routing (expert ids and weights) that ``model``'s layer chose."""
    from tallow.layers import FusedMoE

    routes: list[tuple[torch.Tensor, torch.Tensor]] = []

    def keep(mod: Any, args: tuple[Any, ...]) -> None:  # Any: the experts hooked
        routes.append((args[1].float(), args[2]))

    def hand(mod: Any, args: tuple[Any, ...]) -> tuple[Any, ...]:  # Any: the experts hooked
        weights, ids = routes[len(given)]
        given.append(mod)
        return (args[0], weights.to(args[1].device), ids.to(args[2].device), *args[3:])

    given: list[Any] = []  # Any: the experts handed a routing so far
    logits = []
    for target, hook in ((model, keep), (ref, hand)):
        hooks = [
            m.experts.register_forward_pre_hook(hook)
            for m in target.modules()
            if isinstance(m, FusedMoE)
        ]
        try:
            logits.append(prefill_logits(target, tokens))
        finally:
            for h in hooks:
                h.remove()
    assert len(given) == len(routes), "the models differ in their MoE layers"
    return logits[0], logits[1]


def _bfloat16_deviation(hf: Any, prompt: list[int], count: int) -> float:  # Any: an LM
    """How far a bfloat16 copy of transformers' ``hf`` puts the logits of the first ``count``
    positions of ``prompt`` from ``hf``'s, relative to the scale of all of them (as
    :func:`~tallow.plugin.testing.model.assert_close_logits` measures)."""
    if count == 0:
        return 0.0
    low = copy.deepcopy(hf).to(torch.bfloat16)
    with torch.no_grad():
        ids = torch.tensor([prompt])
        ref = hf(ids).logits[0].float()
        ours = low(ids).logits[0].float()
    return float((ours[:count] - ref[:count]).abs().max()) / max(1.0, float(ref.abs().max()))


def _has_experts(model: CausalLM) -> bool:
    from tallow.layers import FusedMoE

    return any(isinstance(m, FusedMoE) for m in model.modules())


def routing_agreement(
    ref: CausalLM, model: CausalLM, tokens: list[int], rel: float, what: str = ""
) -> int:
    """How many leading ``tokens`` get the same experts in every MoE layer of ``model`` as in
    ``ref`` (all of them for a model without experts); asserts that the first token that
    differs was a near-tie in ``ref``: a relative routing margin of at most ``rel``."""
    ours = expert_choices(model, tokens)
    theirs = expert_choices(ref, tokens)
    first = len(tokens)
    where = -1
    for layer, (a, b) in enumerate(zip(ours, theirs)):
        differ = (a.cpu().sort(-1).values != b.cpu().sort(-1).values).any(-1).nonzero()
        if len(differ) and int(differ[0]) < first:
            first, where = int(differ[0]), layer
    if where >= 0:
        margin = float(routing_margins(ref, tokens)[where][first])
        assert margin <= rel, (
            f"{what}: token {first} takes other experts in MoE layer {where} although its "
            f"routing margin {margin:.2e} exceeds the tolerance {rel:.0e}"
        )
    return first


def _assert_prefix_logits(
    model: CausalLM, hf: Any, tokens: list[int], count: int, rel: float, what: str
) -> None:  # Any: a transformers causal LM of any architecture
    """The logits of one prefill of ``tokens`` by ``model`` at the first ``count`` positions
    are within ``rel`` of the scale of all of ``hf``'s (none to compare when ``count`` is
    0)."""
    if count == 0:
        return
    logits = prefill_logits(model, tokens)
    with torch.no_grad():
        ref = hf(torch.tensor([tokens])).logits[0]
    # the scale stays that of every position's logits, as when all of them are compared
    ours = ref.clone()
    ours[:count] = logits[:count].float().cpu()
    assert_close_logits(ours, ref, f"{what} (the first {count} of {len(tokens)} tokens)", rel)


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
        prefill_logits(model, prompt)
    finally:
        for hook in hooks:
            hook.remove()
    return chosen


def routing_margins(model: CausalLM, prompt: list[int]) -> list[torch.Tensor]:
    """For every :class:`~tallow.layers.FusedMoE` layer of ``model`` (in layer order), each
    token's relative margin ``[tokens]`` of ``prompt`` (one prefill): how far its
    ``top_k``-th choice lies above the best expert left out, in the quantity the router ranks
    (the logits for softmax routers, sigmoid scores plus the correction bias for sigmoid
    ones; with grouped top-k also how far its last chosen group's score lies above the best
    group left out, the smaller of the two), over the largest magnitude of that quantity
    among the token's experts. Rounding that moves the quantity by less than that fraction
    of its scale cannot change the token's experts; a margin near zero is a near-tie, which
    another device or dtype may break the other way."""
    from tallow.layers import FusedMoE
    from tallow.layers.moe_router import expert_scores, group_mask, group_scores

    margins: list[torch.Tensor] = []

    def keep(mod: Any, args: tuple[Any, ...]) -> None:  # Any: the FusedMoE hooked
        x = args[0].reshape(-1, args[0].shape[-1])
        logits = mod.gate(x).float()
        spec = mod.router
        choice = logits  # a softmax router ranks as its logits do
        if spec.scoring == "sigmoid":
            bias = getattr(mod.gate, "e_score_correction_bias", None)
            choice = expert_scores(logits, spec, bias)[1]
        scale = choice.abs().amax(-1).clamp_min(1e-30)
        margin = torch.full((x.shape[0],), float("inf"), device=x.device)
        if spec.num_groups > spec.topk_groups:  # the groups are chosen first
            groups = group_scores(choice, spec).topk(spec.topk_groups + 1, dim=-1).values
            margin = groups[:, -2] - groups[:, -1]
            choice = group_mask(choice, spec)
        if choice.shape[-1] > spec.top_k:  # else every expert is chosen: nothing to flip
            top = choice.topk(spec.top_k + 1, dim=-1).values
            # an expert of a group left out (-inf) cannot come in
            margin = torch.minimum(margin, (top[:, -2] - top[:, -1]).nan_to_num(float("inf")))
        margins.append((margin / scale).cpu())

    hooks = [m.register_forward_pre_hook(keep) for m in model.modules() if isinstance(m, FusedMoE)]
    try:
        with torch.no_grad():
            prefill_logits(model, prompt)
    finally:
        for hook in hooks:
            hook.remove()
    return margins


def clear_routing_prompt(model: CausalLM, length: int, rel: float, vocab: int) -> list[int]:
    """A prompt of ``length`` tokens below ``vocab`` on which every MoE layer of ``model``
    routes every token with a relative margin (:func:`routing_margins`) above ``rel``, so that
    rounding that moves the routers' inputs by less than ``rel`` of their scale changes no
    expert: built token by token, each the first candidate whose margins at its position
    clear ``rel`` after the tokens before it (the candidates of position ``t`` are the
    vocabulary in the order ``(37 * (t + j) + 11) % vocab``, so the prompt varies). Raises
    ``AssertionError`` when no token clears it at some position."""
    prompt: list[int] = []
    for t in range(length):
        for j in range(vocab):
            token = (37 * (t + j) + 11) % vocab
            margins = routing_margins(model, [*prompt, token])
            if all(float(m[-1]) > rel for m in margins):
                prompt.append(token)
                break
        else:
            raise AssertionError(
                f"no token routes with margins above {rel:.0e} after {len(prompt)} tokens"
            )
    return prompt


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
