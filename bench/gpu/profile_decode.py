"""Where a decode step's time goes, and how fast the GEMV streams weights (GPU only).

  python bench/gpu/profile_decode.py gemv                 # GEMV vs cuBLAS on llama-3-8b shapes
  python bench/gpu/profile_decode.py step [--gemv-rows N] [--model random:llama-3-8b]
                                          [--batch B] [--input-len L]

  python bench/gpu/profile_decode.py gemm                 # cuBLAS decode GEMMs by row count
  python bench/gpu/profile_decode.py throughput [--model M] [--batch N] [--fixed-len L]
                                          [--kernel-steps 4,5,300] [-- ENGINE ARGS]
  python bench/gpu/profile_decode.py ttft [--input-len L] [--output-len N]

``step`` builds the engine, decodes, profiles a few steps with torch.profiler and prints the
kernels per step (µs) against the wall time of a step. ``throughput`` runs a throughput
workload and splits its host time by step kind; ``ttft`` profiles the steps up to a request's
first token (compare ``TALLOW_PDL=0``).
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import time
import warnings

import torch

from tallow.bench.kernel_timing import graph_bandwidth


def gemv_sweep() -> None:
    import torch.nn.functional as F

    from tallow.kernels.gemv_triton import gemv_config, gemv_triton

    shapes = {
        "qkv": (6144, 4096),
        "o": (4096, 4096),
        "gate_up": (28672, 4096),
        "down": (4096, 14336),
        "lm_head": (128256, 4096),
        "q3_qkv": (4096, 1024),
        "q3_o": (1024, 2048),
        "q3_gate_up": (6144, 1024),
        "q3_down": (1024, 3072),
        "q3_lm": (151936, 1024),
    }
    configs = [
        (1, bn, bk, w)
        for bn in (2, 4, 8, 16, 32)
        for bk in (256, 512, 1024, 2048)
        for w in (2, 4, 8)
    ]
    print(f"{'shape':10s} {'cuBLAS GB/s':>12s} {'default GB/s':>13s}  top configs (GB/s)")
    for name, (n, k) in shapes.items():
        nbytes = n * k * 2
        copies = max(2, -(-400_000_000 // nbytes))  # rotate > L2 (50 MB) so every read is HBM
        ws = [
            torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k**-0.5 for _ in range(copies)
        ]
        x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
        ref = F.linear(x, ws[0]).float()
        got = gemv_triton(x, ws[0]).float()
        err = ((got - ref).abs().max() / ref.abs().max()).item()
        cublas = graph_bandwidth(lambda i: F.linear(x, ws[i % copies]), nbytes)
        default = graph_bandwidth(lambda i: gemv_triton(x, ws[i % copies]), nbytes)
        results = []
        for cfg in configs:
            if cfg[2] > max(256, k):
                continue
            bw = graph_bandwidth(lambda i: gemv_triton(x, ws[i % copies], config=cfg), nbytes)
            results.append((bw, cfg))
        results.sort(reverse=True)
        top = " ".join(f"{c[1]}x{c[2]}w{c[3]}:{b:.0f}" for b, c in results[:5])
        print(
            f"{name:10s} {cublas:12.0f} {default:13.0f}  {top} (default "
            f"{gemv_config(1, n, k)}, rel err {err:.1e})",
            flush=True,
        )
        ws = None
        torch.cuda.empty_cache()


def gemm_sweep() -> None:
    """cuBLAS time of the llama-3-8b decode GEMMs against the number of rows (the padded
    decode batch): µs per step (4 GEMMs x 32 layers) and TFLOP/s."""
    import torch.nn.functional as F

    shapes = {
        "qkv": (6144, 4096),
        "o": (4096, 4096),
        "gate_up": (28672, 4096),
        "down": (4096, 14336),
    }
    ws = {
        name: torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k**-0.5
        for name, (n, k) in shapes.items()
    }
    print(
        f"{'rows':>5s} " + " ".join(f"{n:>9s}" for n in shapes) + f" {'step us':>9s} "
        f"{'us/row':>7s} {'TFLOP/s':>8s}"
    )
    for m in (256, 320, 384, 400, 416, 432, 443, 448, 464, 480, 496, 512):
        times = {}
        for name, w in ws.items():
            x = torch.randn(m, w.shape[1], device="cuda", dtype=torch.bfloat16)
            flops = 2 * m * w.numel()
            times[name] = flops / (graph_bandwidth(lambda i: F.linear(x, w), flops) * 1e9)
        step = 32 * sum(times.values())
        flops = 2 * m * (32 * sum(w.numel() for w in ws.values()))
        print(
            f"{m:5d} "
            + " ".join(f"{t * 1e6:9.1f}" for t in times.values())
            + f" {step * 1e6:9.0f} {step * 1e6 / m:7.2f} {flops / step / 1e12:8.0f}",
            flush=True,
        )


def profile_ttft(args: argparse.Namespace) -> None:
    """The steps up to a request's first token, as ``tallow bench latency`` runs them (a
    warm-up request of 8 tokens first): wall time and host phases of each step, then the
    kernels of those steps. Run it with ``TALLOW_PDL=0`` and without to compare."""
    from tallow.bench.common import build_engine, random_prompts
    from tallow.bench.latency import measure
    from tallow.config import load_config
    from tallow import SamplingParams

    config = load_config(
        ["--model", args.model, "--dtype", "bfloat16", "--max-model-len", "4096"] + args.extra
    )
    engine = build_engine(config)
    measure(engine, batch=1, input_len=args.input_len, output_len=8, seed=1)
    vocab = engine.parts.core.runner.vocab_size
    prompt = random_prompts(1, [args.input_len], vocab, seed=2)[0]
    rid = engine.next_request_id()
    sync()
    with kernel_profile() as prof:
        start = time.perf_counter()
        engine.add_request(
            rid,
            prompt,
            SamplingParams(max_tokens=args.output_len, ignore_eos=True, temperature=0.0),
            stream=False,
        )
        steps = []
        while True:
            t0 = time.perf_counter()
            engine.step()
            t = engine.last_step.timings
            steps.append((time.perf_counter() - t0, dict(t)))
            if any(u.request_id == rid for u in engine.last_step.updates):
                break
        ttft = time.perf_counter() - start
        sync()
    print(
        f"\n== first token of a {args.input_len}-token prompt: {ttft * 1e3:.2f} ms after "
        f"{len(steps)} steps (TALLOW_PDL={os.environ.get('TALLOW_PDL', 'default')})"
    )
    for i, (wall, t) in enumerate(steps, 1):
        print(
            f"step {i}: {wall * 1e3:.2f} ms; "
            + ", ".join(f"{k} {v * 1e3:.2f}" for k, v in t.items())
        )
    print_kernels(prof, 1, top=20)
    while engine.has_unfinished():
        engine.step()


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def profile_step(args: argparse.Namespace) -> None:
    from tallow.config import load_config
    from tallow.engine.llm_engine import LLMEngine
    from tallow import SamplingParams
    from tallow.kernels import linear as linear_mod

    linear_mod.GEMV_MAX_ROWS = args.gemv_rows
    config = load_config(
        [
            "--model",
            args.model,
            "--dtype",
            "bfloat16",
            "--max-model-len",
            "4096",
            "--max-num-seqs",
            str(max(8, args.batch)),
            "--max-cuda-graph-batch",
            str(max(8, args.batch)),
        ]
        + (["--disable-cuda-graph"] if args.eager else [])
    )
    engine = LLMEngine.from_config(config)
    engine.core.trace_steps()  # the phases below read engine.last_step.timings
    params = SamplingParams(max_tokens=10_000, ignore_eos=True, temperature=0.0)
    vocab = engine.parts.core.runner.vocab_size
    for i in range(args.batch):
        prompt = [10 + (i * 7 + j) % (vocab - 10) for j in range(args.input_len)]
        engine.add_request(f"r{i}", prompt, params, stream=False)
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
    with kernel_profile() as prof:
        for _ in range(steps):
            engine.step()
        sync()
    mode = " eager" if args.eager else ""
    print(
        f"\n== {args.model} batch {args.batch} input {args.input_len} gemv_rows "
        f"{args.gemv_rows}{mode}: wall {wall * 1e3:.3f} ms/step, phases "
        + ", ".join(f"{k} {v * 1e3:.3f}" for k, v in phases.items())
    )
    print_kernels(prof, steps)


def kernel_profile():
    from torch.profiler import ProfilerActivity, profile

    return profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU])


def print_device_idle(prof, steps: int) -> None:
    """How long the device sat without a kernel or copy between the window's first and last:
    the span, the busy union of all device activity, and the longest gaps."""
    spans = sorted(
        (ev.time_range.start, ev.time_range.end)
        for ev in prof.events()
        if ev.device_type == torch.autograd.DeviceType.CUDA
    )
    if not spans:
        return
    busy, gaps = 0.0, []
    cur_start, cur_end = spans[0]
    for start, end in spans[1:]:
        if start > cur_end:
            busy += cur_end - cur_start
            gaps.append(start - cur_end)
            cur_start = start
        cur_end = max(cur_end, end)
    busy += cur_end - cur_start
    span = cur_end - spans[0][0]
    gaps.sort(reverse=True)
    print(
        f"device span {span / 1e3:.3f} ms, busy {busy / 1e3:.3f} ms, idle "
        f"{(span - busy) / 1e3:.3f} ms over {steps} steps ({len(gaps)} gaps; longest "
        + ", ".join(f"{g / 1e3:.2f}" for g in gaps[:6])
        + " ms)"
    )


def print_kernels(prof, steps: int, top: int = 30) -> None:
    """The CUDA kernels of a finished torch.profiler run, µs per step, longest first."""
    kernels: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0])
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            k = kernels[ev.name[:90]]
            k[0] += 1
            k[1] += ev.device_time_total if hasattr(ev, "device_time_total") else ev.cuda_time_total
    total = sum(v[1] for v in kernels.values()) / steps
    print(f"kernels {total / 1e3:.3f} ms/step")
    print_device_idle(prof, steps)
    print(f"{'us/step':>9s} {'calls/step':>10s}  kernel")
    for name, (calls, us) in sorted(kernels.items(), key=lambda kv: -kv[1][1])[:top]:
        print(f"{us / steps:9.1f} {calls / steps:10.1f}  {name}")
    sys.stdout.flush()


def profile_throughput(args: argparse.Namespace) -> None:
    """The workload of ``tallow bench throughput`` (random lengths 100–1024), each step's host
    phases recorded by kind: decode-only steps replayed from a graph, decode-only steps run
    eagerly, steps with prompt tokens; and the garbage collector's pauses."""
    import gc

    from tallow.bench.common import lengths, random_prompts
    from tallow.bench.throughput import warm_up
    from tallow.config import load_config
    from tallow.engine.llm_engine import LLMEngine
    from tallow import SamplingParams

    config = load_config(
        ["--model", args.model, "--dtype", "bfloat16", "--max-model-len", "4096"] + args.extra
    )
    engine = LLMEngine.from_config(config)
    engine.core.trace_steps()  # the phases below read engine.last_step.timings
    from tallow.engine.builder import freeze_startup_heap

    freeze_startup_heap()  # as tallow bench does
    runner = engine.parts.core.runner
    vocab = runner.vocab_size
    n = args.batch
    fixed = args.fixed_len
    lo, hi = (None, None) if fixed else (100, 1024)
    in_lens = lengths(n, fixed, lo, hi, seed=10)
    out_lens = lengths(n, fixed, lo, hi, seed=11)
    windows = [int(x) for x in args.kernel_steps.split(",")] if args.kernel_steps else []
    prompts = random_prompts(n, in_lens, vocab, seed=12)
    kinds: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0, 0.0, 0.0, 0.0])
    gc_pause = [0.0, 0, 0.0]

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            gc_pause[2] = time.perf_counter()
        else:
            gc_pause[0] += time.perf_counter() - gc_pause[2]
            gc_pause[1] += 1

    gc.callbacks.append(on_gc)
    orig_launch = runner.launch
    last: dict[str, object] = {}

    def launch(plan, **kwargs):  # noqa: ANN001, ANN003
        t0 = time.perf_counter()
        pending = orig_launch(plan, **kwargs)
        last["launch"] = time.perf_counter() - t0
        items = plan.scheduled
        decode = all(item.num_tokens == 1 for item in items)
        graph = runner.graphs is not None and decode and len(items) <= runner.graphs.max_batch
        last["tokens"] = sum(item.num_tokens for item in items)
        last["seqs"] = len(items)
        last["kind"] = ("decode/graph" if graph else "decode/eager") if decode else "with prompt"
        return pending

    runner.launch = launch
    warm_up(engine)  # as `tallow bench throughput` does
    kinds.clear()
    prompt_steps: list[float] = []
    import cProfile
    import pstats

    profiler = cProfile.Profile()
    sync_warnings: collections.Counter[str] = collections.Counter()
    for prompt, out_len in zip(prompts, out_lens):
        engine.add_request(
            engine.next_request_id(),
            prompt,
            SamplingParams(max_tokens=out_len, ignore_eos=True, temperature=0.0),
            stream=False,
        )
    start = time.perf_counter()
    step_no = 0
    kernel_prof = None
    window_kinds: list[str] = []
    while engine.has_unfinished():
        step_no += 1
        if step_no in windows and kernel_prof is None:
            sync()
            kernel_prof = kernel_profile()
            kernel_prof.__enter__()
            window_kinds = []
        t0 = time.perf_counter()
        profiled = len(prompt_steps) in (10, 11, 12)  # steady steps, past compiles
        if profiled:
            profiler.enable()
            # torch warns on each operation that makes the host wait for the device
            torch.cuda.set_sync_debug_mode("warn")
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                engine.step()
            torch.cuda.set_sync_debug_mode("default")
            profiler.disable()
            for w in caught:
                sync_warnings[f"{w.filename}:{w.lineno}: {str(w.message)[:80]}"] += 1
        else:
            engine.step()
        wall = time.perf_counter() - t0
        if kernel_prof is not None:
            window_kinds.append(
                f"{last.get('kind', '?')} ({last.get('tokens', 0)} tokens, "
                f"{last.get('seqs', 0)} seqs, {wall * 1e3:.1f} ms)"
            )
            if step_no + 1 not in windows:
                sync()
                kernel_prof.__exit__(None, None, None)
                print(
                    f"\n== kernels of steps {step_no - len(window_kinds) + 1}..{step_no}: "
                    + "; ".join(window_kinds)
                )
                print_kernels(kernel_prof, len(window_kinds), top=18)
                kernel_prof = None
        if "kind" not in last:
            continue
        kind = last.pop("kind")
        if kind == "with prompt":
            prompt_steps.append(wall)
        k = kinds[kind]
        t = engine.last_step.timings
        k[0] += 1
        k[1] += wall
        k[2] += last["launch"]
        k[3] += t.get("wait", 0.0)
        k[4] += t.get("schedule", 0.0) + t.get("post", 0.0) + t.get("overlapped", 0.0)
    sync()
    elapsed = time.perf_counter() - start
    gc.callbacks.remove(on_gc)
    out_tokens = sum(out_lens)
    print(
        f"\n== throughput workload {args.model} n={n}: {elapsed:.2f} s "
        f"({out_tokens / elapsed:.0f} output tok/s), {step_no} steps, "
        f"{engine.parts.core.scheduler.num_preemptions} preemptions; gc {gc_pause[1]} "
        f"collections, {gc_pause[0] * 1e3:.0f} ms"
    )
    print(f"{'kind':14s} {'steps':>6s} {'wall ms':>8s} {'launch':>7s} {'wait':>7s} {'other':>7s}")
    for name, (cnt, wall, lau, wait, other) in kinds.items():
        print(
            f"{name:14s} {cnt:6d} {wall / cnt * 1e3:8.2f} {lau / cnt * 1e3:7.2f} "
            f"{wait / cnt * 1e3:7.2f} {other / cnt * 1e3:7.2f}   (total {wall:.2f} s)"
        )
    print("prompt steps (ms):", " ".join(f"{t * 1e3:.0f}" for t in prompt_steps))
    print(
        "host-device synchronisations in prompt steps 11-13 (torch sync debug mode):",
        dict(sync_warnings) or "none",
    )
    if len(prompt_steps) > 12:
        print("cProfile of prompt steps 11-13, top 14 by cumulative time:")
        pstats.Stats(profiler, stream=sys.stdout).sort_stats("cumulative").print_stats(14)
        print("... top 25 by own time:")
        pstats.Stats(profiler, stream=sys.stdout).sort_stats("tottime").print_stats(25)
    sys.stdout.flush()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("what", choices=["gemv", "gemm", "step", "throughput", "ttft"])
    p.add_argument("--gemv-rows", type=int, default=1)
    p.add_argument("--model", default="random:llama-3-8b")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--input-len", type=int, default=512)
    p.add_argument("--output-len", type=int, default=256, help="ttft: the request's max_tokens")
    p.add_argument("--eager", action="store_true", help="no CUDA graphs")
    p.add_argument(
        "--fixed-len",
        type=int,
        default=None,
        help="throughput: every prompt and output this long (default uniform 100-1024)",
    )
    p.add_argument(
        "--kernel-steps",
        default="",
        help="throughput: step numbers (1-based, comma-separated) whose kernels are "
        "profiled; each run of consecutive numbers is one table",
    )
    p.add_argument("extra", nargs="*", help="throughput: more engine arguments (after --)")
    # engine arguments after `--` (argparse leaves a trailing nargs='*' positional empty)
    args, unknown = p.parse_known_args()
    args.extra = [a for a in args.extra + unknown if a != "--"]
    if args.what == "gemv":
        gemv_sweep()
    elif args.what == "gemm":
        gemm_sweep()
    elif args.what == "throughput":
        profile_throughput(args)
    elif args.what == "ttft":
        profile_ttft(args)
    else:
        profile_step(args)


if __name__ == "__main__":
    main()
