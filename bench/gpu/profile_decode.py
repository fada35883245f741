"""Where a decode step's time goes, and how fast the GEMV streams weights (GPU only).

  python bench/gpu/profile_decode.py gemv                 # GEMV vs cuBLAS on llama-3-8b shapes
  python bench/gpu/profile_decode.py step [--gemv-rows N] [--model random:llama-3-8b]
                                          [--batch B] [--input-len L]

``step`` builds the engine, decodes, profiles a few steps with torch.profiler and prints the
kernels per step (µs) against the wall time of a step.
"""

from __future__ import annotations

import argparse
import collections
import sys
import time

import torch


def _bandwidth(fn, nbytes: int, iters: int = 40) -> float:
    for _ in range(3):
        fn(0)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for i in range(iters):
        fn(i)
    end.record()
    torch.cuda.synchronize()
    return nbytes / (start.elapsed_time(end) / 1e3 / iters) / 1e9


def gemv_sweep() -> None:
    import torch.nn.functional as F

    from tallow.kernels.gemv_triton import gemv_config, gemv_triton

    shapes = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096),
              "down": (4096, 14336), "lm_head": (128256, 4096),
              "q3_qkv": (4096, 1024), "q3_down": (1024, 3072), "q3_lm": (151936, 1024)}
    configs = [(1, bn, bk, w) for bn in (4, 8, 16, 32) for bk in (256, 512, 1024) for w in (4, 8)]
    print(f"{'shape':10s} {'M':>3s} {'cuBLAS GB/s':>12s} {'default GB/s':>13s}  best config")
    for name, (n, k) in shapes.items():
        nbytes = n * k * 2
        copies = max(2, -(-400_000_000 // nbytes))  # rotate > L2 (50 MB) so every read is HBM
        ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k ** -0.5
              for _ in range(copies)]
        for m in (1, 2, 4, 8, 16):
            if m > 1 and name not in ("gate_up", "down", "qkv"):
                continue
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            ref = F.linear(x, ws[0]).float()
            got = gemv_triton(x, ws[0]).float()
            err = ((got - ref).abs().max() / ref.abs().max()).item()
            cublas = _bandwidth(lambda i: F.linear(x, ws[i % copies]), nbytes)
            default = _bandwidth(lambda i: gemv_triton(x, ws[i % copies]), nbytes)
            best = (0.0, None)
            if m == 1:
                for cfg in configs:
                    bw = _bandwidth(lambda i: gemv_triton(x, ws[i % copies], config=cfg), nbytes)
                    best = max(best, (bw, cfg))
            else:
                for cfg in [(16, bn, bk, w) for bn in (16, 32, 64) for bk in (128, 256)
                            for w in (4, 8)]:
                    bw = _bandwidth(lambda i: gemv_triton(x, ws[i % copies], config=cfg), nbytes)
                    best = max(best, (bw, cfg))
            print(f"{name:10s} {m:3d} {cublas:12.0f} {default:13.0f}  {best[0]:6.0f} {best[1]} "
                  f"(default {gemv_config(m, n, k)}, rel err {err:.1e})", flush=True)
        del ws
        torch.cuda.empty_cache()


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def profile_step(args: argparse.Namespace) -> None:
    from tallow.config import load_config
    from tallow.engine.llm_engine import LLMEngine
    from tallow.engine.sampling_params import SamplingParams
    from tallow.kernels import linear as linear_mod

    linear_mod.GEMV_MAX_ROWS = args.gemv_rows
    config = load_config(["--model", args.model, "--dtype", "bfloat16", "--max-model-len",
                          "4096", "--max-num-seqs", str(max(8, args.batch))]
                         + (["--disable-cuda-graph"] if args.eager else []))
    engine = LLMEngine.from_config(config)
    params = SamplingParams(max_tokens=10_000, ignore_eos=True, temperature=0.0)
    vocab = engine.parts.core.runner.vocab_size
    for i in range(args.batch):
        engine.add_request(f"r{i}", [10 + (i * 7 + j) % (vocab - 10) for j in range(args.input_len)],
                           params, stream=False)
    for _ in range(30):
        engine.step()
    sync()
    n = 20
    t0 = time.perf_counter()
    phases: dict[str, float] = collections.Counter()
    for _ in range(n):
        engine.step()
        for k, v in engine.last_step.timings.items():
            phases[k] += v / n
    sync()
    wall = (time.perf_counter() - t0) / n
    steps = 10
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            engine.step()
        sync()
    kernels: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0])
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            k = kernels[ev.name[:90]]
            k[0] += 1
            k[1] += ev.device_time_total if hasattr(ev, "device_time_total") else ev.cuda_time_total
    total = sum(v[1] for v in kernels.values()) / steps
    mode = " eager" if args.eager else ""
    print(f"\n== {args.model} batch {args.batch} input {args.input_len} gemv_rows "
          f"{args.gemv_rows}{mode}: wall {wall * 1e3:.3f} ms/step, kernels "
          f"{total / 1e3:.3f} ms/step, phases " + ", ".join(f"{k} {v * 1e3:.3f}" for k, v in phases.items()))
    print(f"{'us/step':>9s} {'calls/step':>10s}  kernel")
    for name, (calls, us) in sorted(kernels.items(), key=lambda kv: -kv[1][1])[:30]:
        print(f"{us / steps:9.1f} {calls / steps:10.1f}  {name}")
    sys.stdout.flush()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("what", choices=["gemv", "step"])
    p.add_argument("--gemv-rows", type=int, default=1)
    p.add_argument("--model", default="random:llama-3-8b")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--input-len", type=int, default=512)
    p.add_argument("--eager", action="store_true", help="no CUDA graphs")
    args = p.parse_args()
    if args.what == "gemv":
        gemv_sweep()
    else:
        profile_step(args)


if __name__ == "__main__":
    main()
