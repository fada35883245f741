"""Engines run through ``LLM`` for the tensor-parallel tests, in this process (TP=1, the
reference) or as a script (``python tp_cases.py SPEC.json``: the driver of a TP group, which
runs every case of SPEC on one group of spawned workers and prints one JSON line per case).

A case is ``{"name", "model", "settings", "waves"}`` (optionally ``"plugins"``, more plugins to
enable, and ``"plugin_settings"``): ``waves`` are lists of requests (``{"prompt", "params"}``)
given to ``LLM.generate`` one after the other, so a later wave finds the prefixes of an earlier
one in the prefix cache. A case whose engine cannot be built gives ``{"name", "error"}``.
"""

from __future__ import annotations

import contextlib
import json
import math
import sys
import time
from typing import Any, Iterator

#: plugins the cases need (loading every installed one costs each process seconds)
PLUGINS = {
    "autoload": False,
    "enable": [
        "tallow-model-llama",
        "tallow-format-safetensors",
        "tallow-format-gguf",
        "tallow-quant-gguf",
        "tallow-kvcache-fp8",
    ],
}

#: small blocks, a small step budget and a small cache: prompts are prefilled in chunks,
#: shared prefixes hit the prefix cache, and the running sequences outgrow the cache
#: (preemption by recompute)
TIGHT = dict(
    device="cpu",
    dtype="float32",
    block_size=4,
    num_blocks=40,
    max_model_len=128,
    max_num_batched_tokens=32,
    prefill_chunk_size=8,
    max_num_seqs=8,
)

_PREFIX = "The quick brown fox jumps over the lazy dog. Paged attention stores keys "


def standard_waves() -> list[list[dict[str, Any]]]:
    """Greedy prompts with a shared prefix (two waves), plus seeded sampling, penalties with
    logprobs and prompt logprobs, and an ``n = 2`` fork."""
    greedy = {"max_tokens": 24, "temperature": 0.0}
    first = [
        {"prompt": _PREFIX + tail, "params": greedy}
        for tail in ("and values.", "in blocks.", "def add(a, b):", "for i in range(10):")
    ]
    first += [
        {
            "prompt": "Continuous batching lets new requests join",
            "params": {"max_tokens": 16, "temperature": 0.8, "seed": 7},
        },
        {
            "prompt": "for i in range(10):\n\tprint(i * i)",
            "params": {
                "max_tokens": 10,
                "temperature": 0.0,
                "repetition_penalty": 1.3,
                "logprobs": 2,
                "prompt_logprobs": 1,
            },
        },
        {
            "prompt": "def add(a, b):\n    return",
            "params": {"max_tokens": 10, "temperature": 0.9, "seed": 3, "n": 2},
        },
    ]
    second = [
        {"prompt": _PREFIX + tail, "params": greedy} for tail in ("with emoji 🙂.", "and café.")
    ]
    return [first, second]


def token_waves(vocab: int = 320) -> list[list[dict[str, Any]]]:
    """Greedy prompts of token ids (for a model whose tokenizer is a stand-in) sharing a
    prefix, in two waves."""
    prefix = [(7 * j) % (vocab - 3) + 3 for j in range(24)]
    greedy = {"max_tokens": 16, "temperature": 0.0}
    return [
        [
            {
                "prompt": prefix + [(11 * i + j) % (vocab - 3) + 3 for j in range(5 + i)],
                "params": greedy,
            }
            for i in range(4)
        ],
        [{"prompt": prefix + [5, 6, 7], "params": greedy}],
    ]


def _summary(output: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"tokens": [c.token_ids for c in output.outputs]}
    first = output.outputs[0]
    if first.logprobs:
        out["logprobs"] = [
            {str(t): lp.logprob for t, lp in step.items()} for step in first.logprobs
        ]
    if output.prompt_logprobs:
        out["prompt_logprobs"] = [
            None if step is None else {str(t): lp.logprob for t, lp in step.items()}
            for step in output.prompt_logprobs
        ]
    return out


#: bfloat16 on CUDA, room for eight prompts of 16 greedy tokens (the GPU cases)
GPU = dict(device="cuda", dtype="bfloat16", max_model_len=512, num_blocks=256, max_num_seqs=16)
#: the decode kernels split keys the same way in a graph and eagerly: bit-identical steps
FIXED_SPLITS = {"tallow-attention-triton": {"num_splits": 4}}
GPU_PROMPTS = [
    "The quick brown fox jumps over the lazy dog.",
    "def add(a, b):\n    return",
    "Paged attention stores keys and values in fixed-size blocks.",
    "for i in range(10):\n\tprint(i * i)",
    "Continuous batching lets new requests",
    "日本語のテキストと emoji 🙂",
    "café, naïve, über.",
    "The lazy dog sleeps",
]


def gpu_case(
    model: str, name: str, plugins: list[str] | None = None, **settings: Any
) -> dict[str, Any]:
    """A GPU case: :data:`GPU_PROMPTS`, 16 greedy tokens each with logprobs and prompt
    logprobs, the Triton attention backend with :data:`FIXED_SPLITS`."""
    greedy = {
        "max_tokens": 16,
        "temperature": 0.0,
        "logprobs": 2,
        "prompt_logprobs": 1,
        "ignore_eos": True,
    }  # every step decodes all eight: one graph size throughout
    return {
        "name": name,
        "model": model,
        "settings": {**GPU, **settings},
        "plugins": ["tallow-attention-triton", *(plugins or [])],
        "plugin_settings": FIXED_SPLITS,
        "waves": [[{"prompt": p, "params": greedy} for p in GPU_PROMPTS]],
    }


def prompt_logprobs(result: dict[str, Any]) -> list[float]:
    """The logprob of every prompt token (after the first) of every request of a case."""
    assert "error" not in result, result["error"]
    return [
        next(iter(step.values()))
        for r in result["results"]
        for step in r["prompt_logprobs"]
        if step is not None
    ]


def assert_same(got: dict[str, Any], want: dict[str, Any], what: str, abs_tol: float = 1e-4) -> int:
    """The tokens of two runs of a case equal, their logprobs and prompt logprobs within
    ``abs_tol``; returns how many logprobs were compared."""
    assert "error" not in got, f"{what}: {got['error']}"
    assert "error" not in want, f"{what} (reference): {want['error']}"
    compared = 0
    for i, (g, w) in enumerate(zip(got["results"], want["results"], strict=True)):
        assert g["tokens"] == w["tokens"], f"{what}, request {i}"
        for key in ("logprobs", "prompt_logprobs"):
            assert (key in g) == (key in w), f"{what}, request {i}: {key}"
            for gs, ws in zip(g.get(key, []), w.get(key, []), strict=True):
                assert (gs is None) == (ws is None)
                if gs is not None:
                    assert gs.keys() == ws.keys(), f"{what}, request {i}: {key}"
                    for t in gs:
                        assert math.isclose(gs[t], ws[t], abs_tol=abs_tol), (
                            f"{what}, request {i}, {key} of token {t}: {gs[t]} vs {ws[t]}"
                        )
                        compared += 1
    return compared


def tokens_until_a_near_tie(
    result: dict[str, Any], reference: dict[str, Any], gap: float = 0.1
) -> tuple[int, int]:
    """(tokens equal, tokens compared): each completion is compared up to its first step
    whose two best reference logprobs are within ``gap`` (bfloat16 rounding may order a
    near-tie either way; the completions diverge from there)."""
    equal = compared = 0
    for got, want in zip(result["results"], reference["results"], strict=True):
        for step, (g, w) in enumerate(zip(got["tokens"][0], want["tokens"][0])):
            best = sorted(want["logprobs"][step].values(), reverse=True)
            if len(best) > 1 and best[0] - best[1] < gap:
                break
            compared += 1
            equal += g == w
            if g != w:
                break
    return equal, compared


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """torch on one thread (a TP=1 reference beside other busy processes: torch's spinning
    threads on a shared machine cost more than they give on these tiny models)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def run_case(case: dict[str, Any], tensor_parallel_size: int) -> dict[str, Any]:
    """Build the case's engine and run its waves; errors are results (``"error"``)."""
    from tallow import LLM, SamplingParams

    started = time.monotonic()
    try:
        plugins = {
            **PLUGINS,
            "enable": PLUGINS["enable"] + case.get("plugins", []),
            "settings": case.get("plugin_settings", {}),
        }
        llm = LLM(
            model=case["model"],
            tensor_parallel_size=tensor_parallel_size,
            plugins=plugins,
            **case.get("settings", TIGHT),
        )
    except Exception as exc:
        return {"name": case["name"], "error": f"{type(exc).__name__}: {exc}"}
    results = []
    for wave in case["waves"]:
        outputs = llm.generate(
            [r["prompt"] for r in wave], [SamplingParams(**r["params"]) for r in wave]
        )
        results.extend(_summary(o) for o in outputs)
    stats = llm.engine.stats()
    return {
        "name": case["name"],
        "results": results,
        "cuda_graphs": llm.engine.core.runner.graphs is not None,
        "stats": {k: stats[k] for k in ("num_preemptions", "prefix_cache_hit_rate", "steps")},
        "seconds": round(time.monotonic() - started, 2),
    }


def main(spec_path: str) -> None:
    with open(spec_path) as f:
        spec = json.load(f)
    for case in spec["cases"]:
        print(json.dumps(run_case(case, spec["tensor_parallel_size"])), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
