"""Acceptance of prompt lookup (the ``ngram`` speculator) on a code-editing workload.

The 20 requests of ``tallow_speculator_ngram.workload`` (a function and a change to make to
it) are answered greedily by the default model (Qwen2.5-Coder-0.5B-Instruct GGUF) on the CPU,
once per ``k``, and the engine's counters give:

- **acceptance rate**: proposed tokens the model kept, of all proposed;
- **mean accepted length**: tokens emitted per verified proposal (kept ones plus the model's
  own), between 1 and k + 1;
- **tokens per sequence step**: tokens emitted per step a sequence took part in, proposal or
  not (the first token, from the prompt's step, included) — the factor by which speculation
  cuts the steps of a decode, the upper bound of its speed-up when a verify step costs what a
  decode step does.

Acceptance does not depend on the batch, so all 20 run at once. Usage::

    python bench/spec_acceptance.py --ks 2,4,8 --max-tokens 128 --output OUT.json
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import time
from typing import Any

from tallow import LLM, SamplingParams
from tallow.engine.speculation import SpecDecoding
from tallow_speculator_ngram.ngram import NgramSpeculator
from tallow_speculator_ngram.workload import code_edit_conversations


def commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def measure(llm: LLM, prompts: list[list[int]], k: int, max_tokens: int) -> dict[str, Any]:
    core = llm.engine.core
    spec = SpecDecoding(NgramSpeculator(None), k)  # default settings
    core.enable_speculation(spec)
    started = time.perf_counter()
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=max_tokens))
    elapsed = time.perf_counter() - started
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    kept = spec.num_accepted_tokens
    seq_steps = tokens - kept  # each sequence step emits one token plus its kept ones
    return {
        "k": k,
        "output_tokens": tokens,
        "proposals": spec.num_proposals,
        "proposed_tokens": spec.num_proposed_tokens,
        "accepted_tokens": kept,
        "acceptance_rate": spec.acceptance_rate,
        "mean_accepted_length": spec.mean_accepted_length,
        "tokens_per_sequence_step": tokens / seq_steps,
        "engine_steps": core.steps,
        "elapsed_s": elapsed,
        "outputs": [o.outputs[0].token_ids for o in outs],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ks", default="2,4,8", help="comma-separated k values")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--output", required=True)
    args = ap.parse_args()
    ks = [int(k) for k in args.ks.split(",")]
    llm = LLM(dtype="float32", device="cpu", max_model_len=2048, num_blocks=1024)
    tok = llm.get_tokenizer()
    prompts = [
        tok.encode(tok.apply_chat_template(c, add_generation_prompt=True), add_special_tokens=False)
        for c in code_edit_conversations()
    ]
    results = []
    for k in ks:
        llm.engine.core.steps = 0
        r = measure(llm, prompts, k, args.max_tokens)
        print(
            f"k={k}: acceptance {r['acceptance_rate']:.3f}, mean accepted length "
            f"{r['mean_accepted_length']:.2f}, tokens per sequence step "
            f"{r['tokens_per_sequence_step']:.2f} ({r['proposals']} proposals, "
            f"{r['elapsed_s']:.0f} s)",
            flush=True,
        )
        results.append(r)
    # greedy outputs do not depend on k: a check that every run decoded the same text
    same = all(r["outputs"] == results[0]["outputs"] for r in results)
    for r in results:
        del r["outputs"]
    report = {
        "date": time.strftime("%Y-%m-%d"),
        "commit": commit(),
        "command": "python bench/spec_acceptance.py --ks "
        + args.ks
        + f" --max-tokens {args.max_tokens}",
        "model": "default (Qwen2.5-Coder-0.5B-Instruct GGUF), float32, CPU",
        "machine": platform.machine(),
        "prompts": len(prompts),
        "speculator": "ngram (prompt_lookup_max 4, min 2)",
        "outputs_identical_across_k": same,
        "results": results,
    }
    with open(args.output, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
