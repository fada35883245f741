"""The cost of speculative decoding's verify step, and the speed-up it buys, on random weights.

Real weights cannot reach the GPU machine, so proposals come from the ``replay`` speculator:
each batch is first decoded greedily without speculation (that run is the baseline, and its
outputs are the recorded continuations), then again with replay proposals of ``k`` tokens of
which a chosen share (``--alphas``) is right. For every (batch, k, alpha):

- **decode time**: T(N) - T(1), the time of a run generating N tokens per sequence minus that
  of a run generating one (the prompts' prefill cancels out);
- **step cost**: that decode time over the engine steps it took, against the baseline's
  decode step (``verify / decode``: what one verify step of k + 1 tokens per sequence costs
  in decode steps);
- **tokens per sequence step** and the **speed-up** over the baseline's decode time.

From the step cost and a workload's tokens per sequence step (the CPU acceptance run of
bench/spec_acceptance.py), the expected speed-up on that workload is
``tokens_per_sequence_step / (verify / decode)``.

Usage (GPU)::

    python bench/gpu/spec_verify.py --model random:llama-3-8b --batches 1,8,64 --ks 1,2,4,8 \\
        --alphas 0.5,0.8,1.0 --input-len 256 --output-len 128 --output OUT.json
"""

from __future__ import annotations

import argparse
import json
import time
from types import SimpleNamespace
from typing import Any

import torch

from tallow import LLM, SamplingParams
from tallow.engine.speculation import SpecDecoding
from tallow_speculator_ngram import DISTRIBUTION
from tallow_speculator_ngram.replay import ReplaySpeculator


def timed(
    llm: LLM, prompts: list[list[int]], max_tokens: int
) -> tuple[float, int, list[list[int]]]:
    """Seconds, engine steps and outputs of one greedy run."""
    core = llm.engine.core
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    if core.runner.device.type == "cuda":
        torch.cuda.synchronize()
    steps = core.steps
    started = time.perf_counter()
    outs = llm.generate(prompts, params)
    if core.runner.device.type == "cuda":
        torch.cuda.synchronize()
    return (
        time.perf_counter() - started,
        core.steps - steps,
        [o.outputs[0].token_ids for o in outs],
    )


def decode_run(
    llm: LLM, prompts: list[list[int]], n: int, spec: SpecDecoding | None = None
) -> dict[str, Any]:
    """Decode time and steps of N tokens per sequence, beyond the first (T(N) - T(1));
    ``spec``'s counters are those of the timed N-token run."""
    timed(llm, prompts, n)  # warm-up: kernels of this batch shape compiled
    t1, s1, _ = timed(llm, prompts, 1)
    if spec is not None:
        spec.reset_stats()
    tn, sn, outs = timed(llm, prompts, n)
    return {"decode_s": tn - t1, "decode_steps": sn - s1, "outputs": outs}


def replay(prompts: list[list[int]], outputs: list[list[int]], alpha: float) -> ReplaySpeculator:
    settings = {
        DISTRIBUTION: {
            "replay": {
                "acceptance_rate": alpha,
                "continuations": [{"prompt": p, "output": o} for p, o in zip(prompts, outputs)],
            }
        }
    }
    return ReplaySpeculator(SimpleNamespace(plugins=SimpleNamespace(settings=settings)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="random:llama-3-8b")
    ap.add_argument("--batches", default="1,8,64")
    ap.add_argument("--ks", default="1,2,4,8")
    ap.add_argument("--alphas", default="0.5,0.8,1.0")
    ap.add_argument("--input-len", type=int, default=256)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--output", required=True)
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    llm = LLM(
        model=args.model,
        device=args.device,
        dtype=args.dtype,
        max_model_len=args.input_len + args.output_len + 16,
        max_num_seqs=max(batches),
        enable_prefix_caching=False,
    )
    core = llm.engine.core
    plain_async = core.async_scheduling  # the baseline runs as the engine would by default
    vocab = core.runner.vocab_size
    g = torch.Generator().manual_seed(0)
    rows: list[dict[str, Any]] = []
    for batch in batches:
        prompts = torch.randint(10, vocab - 10, (batch, args.input_len), generator=g).tolist()
        core.enable_speculation(None)
        core.async_scheduling = plain_async
        base = decode_run(llm, prompts, args.output_len)
        base_step = base["decode_s"] / base["decode_steps"]
        recorded = base["outputs"]
        print(f"batch {batch}: decode step {base_step * 1e3:.2f} ms (no speculation)", flush=True)
        for k in [int(x) for x in args.ks.split(",")]:
            for alpha in [float(x) for x in args.alphas.split(",")]:
                spec = SpecDecoding(replay(prompts, recorded, alpha), k)
                core.enable_speculation(spec)
                run = decode_run(llm, prompts, args.output_len, spec)
                step = run["decode_s"] / run["decode_steps"]
                tokens = batch * (args.output_len - 1)
                row = {
                    "batch": batch,
                    "k": k,
                    "alpha": alpha,
                    "decode_step_ms": base_step * 1e3,
                    "verify_step_ms": step * 1e3,
                    "verify_over_decode": step / base_step,
                    "tokens_per_sequence_step": tokens / (batch * run["decode_steps"]),
                    "acceptance_rate": spec.acceptance_rate,
                    "mean_accepted_length": spec.mean_accepted_length,
                    "speedup": base["decode_s"] / run["decode_s"],
                    "outputs_equal_baseline": run["outputs"] == recorded,
                }
                rows.append(row)
                print(
                    f"  k={k} alpha={alpha}: verify step {row['verify_step_ms']:.2f} ms "
                    f"({row['verify_over_decode']:.2f} decode steps), "
                    f"{row['tokens_per_sequence_step']:.2f} tokens/step, speed-up "
                    f"{row['speedup']:.2f}x, same tokens: {row['outputs_equal_baseline']}",
                    flush=True,
                )
        core.enable_speculation(None)
    device = (
        torch.cuda.get_device_name()
        if args.device.startswith("cuda") and torch.cuda.is_available()
        else "cpu"
    )
    with open(args.output, "w") as f:
        json.dump(
            {
                "model": args.model,
                "device": device,
                "dtype": args.dtype,
                "input_len": args.input_len,
                "output_len": args.output_len,
                "cuda_graphs": core.runner.graphs is not None,
                "rows": rows,
            },
            f,
            indent=1,
        )


if __name__ == "__main__":
    main()
