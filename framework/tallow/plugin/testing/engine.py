"""Run the offline engine (:class:`tallow.LLM`) in-process with an explicit set of plugins."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from tallow.engine.sampling.params import SamplingParams

from ..manager import load_plugins
from . import make_config


def offline_llm(
    model: str, *, plugins: Sequence[str], config: Mapping[str, Any] | None = None
) -> Any:
    """A :class:`tallow.LLM` over ``model`` whose plugins are exactly the core and the installed
    distributions ``plugins``, each loaded through its entry point as ``tallow serve`` loads
    it (a failure stops here, naming the plugin). ``config`` holds further settings as nested
    mappings (``{"cache": {"num_blocks": 64}}``); the model runs on the CPU unless it names
    another device."""
    from tallow.engine.llm import LLM

    data: dict[str, Any] = {key: dict(value) for key, value in (config or {}).items()}
    data.setdefault("model", {}).setdefault("device", "cpu")
    data["model"]["source"] = model
    data["plugins"] = {**data.get("plugins", {}), "autoload": False, "enable": list(plugins)}
    settings = make_config(data)
    pm = load_plugins(settings.plugins, env={})
    pm.hook.tallow_configure(config=settings)
    # An explicit manager: LLM() would also read TALLOW_* and TALLOW_CONFIG from the caller.
    return LLM.from_config(settings, pm)


def forced_logprobs(
    llm: Any, prompt: Sequence[int], tokens: Sequence[int]
) -> Any:  # Any: an LLM or an LLMEngine; the kit sits above both
    """``llm``'s log-probabilities of ``tokens`` following ``prompt``, teacher-forced (one
    prompt step over ``prompt + tokens``), as a float tensor: what two engines on the same
    weights (two attention backends, say) are compared by."""
    import torch

    out = llm.generate(
        [list(prompt) + list(tokens)],
        SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=1),
    )[0]
    return torch.tensor(
        [out.prompt_logprobs[len(prompt) + i][t].logprob for i, t in enumerate(tokens)]
    )


def assert_greedy_agrees(
    ours: Sequence[Any], reference: Sequence[Any], *, tol: float, what: str = ""
) -> int:  # Any: CompletionOutputs; the kit sits above the engine's types
    """Greedy completions ``ours`` agree with ``reference`` (both ``CompletionOutput`` lists,
    generated with ``logprobs`` >= 2) up to near-ties: position by position, every token both
    report has log-probabilities within ``tol / 2`` of each other, and the chosen tokens are
    equal, except where the reference's two best tokens are less than ``tol`` apart (rounding
    within the bound on each side can reorder them). After such a flip the completions' inputs
    differ, so that completion is compared no further. Returns the number of positions
    compared (callers assert it is most of them, so that the check is not vacuous)."""
    compared = 0
    for n, (mine, ref) in enumerate(zip(ours, reference, strict=True)):
        if mine.logprobs is None or ref.logprobs is None:
            raise ValueError(f"{what}: completion {n} has no logprobs (generate with logprobs=2)")
        for i, (a, b) in enumerate(zip(mine.token_ids, ref.token_ids, strict=True)):
            lp_a, lp_b = mine.logprobs[i], ref.logprobs[i]
            for token in lp_a.keys() & lp_b.keys():
                drift = abs(lp_a[token].logprob - lp_b[token].logprob)
                assert drift <= tol / 2, (
                    f"{what}: completion {n}, position {i}: log-prob of token {token} "
                    f"{lp_a[token].logprob:.6f} != {lp_b[token].logprob:.6f} (more than {tol / 2})"
                )
            best = sorted((lp.logprob for lp in lp_b.values()), reverse=True)
            if len(best) < 2:
                raise ValueError(f"{what}: position {i} reports one token (logprobs=2 needed)")
            margin = best[0] - best[1]
            if a != b:
                assert margin < tol, (
                    f"{what}: completion {n}, position {i}: token {a} != {b} although the "
                    f"reference's two best are {margin:.6f} apart (a flip needs less than {tol})"
                )
                break
            compared += 1
    return compared


def replay_own_graph_sizes(engine: Any) -> None:  # Any: an LLM or an LLMEngine
    """Make every decode batch of ``engine`` (a :class:`tallow.LLM` or an ``LLMEngine``) whose
    size was captured replay the CUDA graph of that size. By default a batch may replay a
    larger captured graph that timed faster (its rows padded), whose matrix products can pick
    other kernels than the unpadded batch — and round differently. Comparisons of graphs with
    eager call this first, so both run the same kernels."""
    core = engine.engine.core if hasattr(engine, "engine") else engine.core
    graphs = core.runner.graphs
    if graphs is None:
        raise ValueError("this engine runs without CUDA graphs")
    graphs.replay_size = {size: size for size in graphs.sizes}
