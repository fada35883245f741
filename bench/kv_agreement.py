"""Greedy agreement of KV codecs with the unquantized cache.

For each codec, eight prompts (code and prose) each get 256 greedy tokens, and two numbers
are counted against the run with ``--kv-codec auto``:

- **teacher-forced agreement**: the reference's 256 tokens are fed back after the prompt and
  the codec's argmax is compared with each of them (its top-1 from the prompt log-probs), so
  every position counts, not only those before a first divergence;
- **tokens before the first divergence** of the codec's own free-running greedy tokens.

Usage (CPU, the default model; a few minutes per codec)::

    python bench/kv_agreement.py --codecs fp8,turbo8,turbo4,turbo3,turbo4@plain.yaml \\
        --output OUT.json [--tokens 256]

``NAME@FILE`` runs codec ``NAME`` with the settings of the tallow YAML file ``FILE`` (its
plugin settings choose the codec's options); every codec is compared with one reference run.
``--reference FILE`` keeps that run's tokens in ``FILE``: written when the file does not
exist, read (and checked against the prompts and token count) when it does, so that codecs
can be measured in separate, shorter runs against the same reference.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

PROMPTS = [
    "def merge_sorted(a: list[int], b: list[int]) -> list[int]:\n",
    'import json\n\n\ndef load_config(path):\n    """Read a JSON config file and',
    'class LRUCache:\n    """A least-recently-used cache of fixed capacity."""\n\n'
    "    def __init__(self, capacity: int) -> None:\n",
    "SELECT customers.name, SUM(orders.total) AS spent\nFROM customers\n",
    "The three laws of thermodynamics can be stated simply. The first law says",
    "Once upon a time, in a village at the edge of a great forest, there lived",
    "To make bread at home you need flour, water, salt and yeast. First,",
    "Q: Why is the sky blue?\nA:",
]


def engine(codec: str, config_path: str | None) -> Any:
    """An engine on the CPU in float32 with ``codec``, plus the settings of ``config_path``
    (a tallow YAML file; its plugin settings choose a codec's options)."""
    import yaml

    from tallow.config import config_from_mapping
    from tallow.engine.llm_engine import LLMEngine

    mapping: dict[str, Any] = {}
    if config_path:
        with open(config_path) as f:
            mapping = yaml.safe_load(f) or {}
    mapping.setdefault("model", {}).update(dtype="float32", device="cpu", max_model_len=1024)
    mapping.setdefault("cache", {}).update(num_blocks=640, kv_codec=codec)
    return LLMEngine.from_config(config_from_mapping(mapping, origin="kv_agreement"))


def run(eng: Any, prompts: list[list[int]], params: Any) -> list[Any]:
    ids = []
    for prompt in prompts:
        ids.append(eng.next_request_id())
        eng.add_request(ids[-1], prompt, params, stream=False)
    done: dict[str, Any] = {}
    while eng.has_unfinished():
        for out in eng.step():
            if out.finished:
                done[out.request_id] = out
    return [done[i] for i in ids]


def greedy(eng: Any, prompts: list[list[int]], n: int) -> list[list[int]]:
    from tallow import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
    return [o.outputs[0].token_ids for o in run(eng, prompts, params)]


def forced_top1(eng: Any, prompt: list[int], continuation: list[int]) -> list[int]:
    """The codec's argmax at each position of ``continuation`` fed after ``prompt``."""
    from tallow import SamplingParams

    out = run(
        eng,
        [prompt + continuation],
        SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=1),
    )[0]
    picks = []
    for i in range(len(continuation)):
        entry = out.prompt_logprobs[len(prompt) + i]
        picks.append(max(entry.items(), key=lambda kv: kv[1].logprob)[0])
    return picks


def first_divergence(a: list[int], b: list[int]) -> int:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def reference_run(path: str | None, tokens: int) -> tuple[list[list[int]], list[list[int]]]:
    """(prompt ids, the unquantized cache's greedy tokens): from ``path`` when it holds them
    for these prompts and this many tokens, else computed (and written to ``path``)."""
    import os

    if path and os.path.exists(path):
        with open(path) as f:
            saved = json.load(f)
        if saved.get("texts") != PROMPTS or saved.get("tokens_per_prompt") != tokens:
            raise SystemExit(
                f"{path} holds the reference of other prompts or another token "
                f"count (expected {tokens} tokens per prompt)"
            )
        return saved["prompts"], saved["reference"]
    ref = engine("auto", None)
    prompts = [ref.tokenizer.encode(text) for text in PROMPTS]
    reference = greedy(ref, prompts, tokens)
    del ref
    if path:
        with open(path, "w") as f:
            json.dump(
                {
                    "texts": PROMPTS,
                    "tokens_per_prompt": tokens,
                    "prompts": prompts,
                    "reference": reference,
                },
                f,
            )
    return prompts, reference


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--codecs",
        default="fp8,turbo8,turbo4,turbo3",
        help="comma-separated codec names, each optionally NAME@CONFIG.yaml",
    )
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--output", help="write the results as JSON here")
    p.add_argument(
        "--reference", help="JSON file of the reference tokens: read if it exists, else written"
    )
    args = p.parse_args(argv)
    started = time.perf_counter()
    prompts, reference = reference_run(args.reference, args.tokens)
    results: dict[str, Any] = {
        "tokens_per_prompt": args.tokens,
        "prompts": len(prompts),
        "codecs": {},
    }
    for label in args.codecs.split(","):
        codec, _, config = label.partition("@")
        llm = engine(codec, config or None)
        own = greedy(llm, prompts, args.tokens)
        forced = [forced_top1(llm, prompt, cont) for prompt, cont in zip(prompts, reference)]
        agree = sum(a == b for picks, cont in zip(forced, reference) for a, b in zip(picks, cont))
        divergence = [first_divergence(a, b) for a, b in zip(own, reference)]
        total = len(prompts) * args.tokens
        results["codecs"][label] = {
            "teacher_forced_agreement": agree,
            "positions": total,
            "teacher_forced_agreement_rate": agree / total,
            "tokens_before_divergence": divergence,
            "identical_completions": sum(d == args.tokens for d in divergence),
        }
        print(
            f"{label}: teacher-forced {agree}/{total} ({agree / total:.1%}); tokens before "
            f"the first divergence {divergence}",
            flush=True,
        )
        del llm
    results["elapsed_s"] = time.perf_counter() - started
    if args.output:
        with open(args.output, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
