"""Micro-benchmark of tallow's core Triton kernels against their torch references on a CUDA GPU.

Shapes are Llama-3-8B's (hidden 4096, 32 query / 8 KV heads of 128, MLP 14336, vocab 128256);
batches of 1 to 256 tokens. Prints one line per kernel and batch size: the median time of the
Triton kernel, of the torch reference, and the speed-up. ``--json PATH`` also writes the rows.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time

import torch

HIDDEN, N_Q, N_KV, HEAD, MLP, VOCAB = 4096, 32, 8, 128, 14336, 128256
MAX_POS = 8192
BATCHES = (1, 8, 32, 64, 128, 256)


def _cases(n: int, dtype: torch.dtype):
    """(name, triton callable, reference callable) for n tokens."""
    from tallow.kernels import activation, gumbel, norm, rotary
    from tallow.kernels._activation_triton import gated_act_triton
    from tallow.kernels._norm_triton import rms_norm_triton
    from tallow.kernels._rotary_triton import rotary_embedding_triton
    from tallow.kernels._sampling_triton import gumbel_argmax_triton

    dev = "cuda"
    x = torch.randn(n, HIDDEN, device=dev, dtype=dtype)
    res = torch.randn_like(x)
    w = torch.randn(HIDDEN, device=dev, dtype=dtype)
    yield (
        "rms_norm+residual",
        lambda: rms_norm_triton(x, w, 1e-5, res),
        lambda: norm.rms_norm_ref(x, w, 1e-5, res),
    )

    gate_up = torch.randn(n, 2 * MLP, device=dev, dtype=dtype)
    yield (
        "silu_and_mul",
        lambda: gated_act_triton(gate_up, "silu"),
        lambda: activation.silu_and_mul_ref(gate_up),
    )

    qkv = torch.randn(n, (N_Q + 2 * N_KV) * HEAD, device=dev, dtype=dtype)
    q, k = qkv[:, : N_Q * HEAD], qkv[:, N_Q * HEAD : (N_Q + N_KV) * HEAD]
    pos = torch.randint(0, MAX_POS, (n,), device=dev)
    inv_freq = 1.0 / (500000.0 ** (torch.arange(0, HEAD, 2, device=dev).float() / HEAD))
    freqs = torch.outer(torch.arange(MAX_POS, device=dev).float(), inv_freq)
    cache = torch.cat([freqs.cos(), freqs.sin()], dim=-1)
    yield (
        "rotary (q+k, in place)",
        lambda: rotary_embedding_triton(pos, q, k, cache, HEAD, True, True),
        lambda: rotary.rotary_embedding_ref(pos, q, k, cache, HEAD, True, True),
    )

    logits = torch.randn(n, VOCAB, device=dev)
    inv_t = torch.full((n,), 1.0 / 0.7, device=dev)
    greedy = torch.zeros(n, dtype=torch.bool, device=dev)
    k1 = torch.randint(0, 2**32, (n,), device=dev)
    k2 = torch.randint(0, 2**32, (n,), device=dev)
    yield (
        "gumbel sample (vocab 128256)",
        lambda: gumbel_argmax_triton(logits, inv_t, greedy, k1, k2),
        lambda: gumbel.gumbel_argmax_ref(logits, inv_t, greedy, k1, k2),
    )
    # What a plain torch sampler would do instead: softmax + multinomial.
    yield (
        "  vs softmax+multinomial",
        lambda: gumbel_argmax_triton(logits, inv_t, greedy, k1, k2),
        lambda: torch.multinomial(torch.softmax(logits * inv_t[:, None], -1), 1),
    )


@contextlib.contextmanager
def _torch_sampling():
    """Make the sampler take its torch reference path (as on CPU) for the duration."""
    from tallow.kernels import sampling

    saved = sampling.triton_enabled
    sampling.triton_enabled = lambda t: False
    try:
        yield
    finally:
        sampling.triton_enabled = saved


def _sampler_batch(n: int):
    """A decode step of n rows with penalties and seeds: (logits, batch, build seconds)."""
    from tallow import SamplingParams
    from tallow.engine.sampling import RowParams, SamplingBatch

    params = SamplingParams(
        temperature=0.8, repetition_penalty=1.1, frequency_penalty=0.2, presence_penalty=0.1
    )
    g = torch.Generator().manual_seed(0)
    rows = [
        RowParams(
            params,
            torch.randint(0, VOCAB, (128,), generator=g).tolist(),
            torch.randint(0, VOCAB, (512,), generator=g).tolist(),
            seed=i,
            step=128,
        )
        for i in range(n)
    ]
    start = time.perf_counter()
    batch = SamplingBatch.build(rows, VOCAB, "cuda")
    torch.cuda.synchronize()
    return torch.randn(n, VOCAB, device="cuda"), batch, time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    parser.add_argument("--batches", default=",".join(map(str, BATCHES)))
    parser.add_argument("--json", default=None, help="also write the rows to this file")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("kernels_micro: needs a CUDA GPU", file=sys.stderr)
        return 2
    from triton.testing import do_bench

    dtype = getattr(torch, args.dtype)
    rows = []
    print(f"{torch.cuda.get_device_name()}  dtype={args.dtype}  (median µs)")
    print(f"{'kernel':<30}{'tokens':>7}{'triton':>10}{'torch':>10}{'speed-up':>10}")
    for n in (int(b) for b in args.batches.split(",")):
        for name, fast, ref in _cases(n, dtype):
            t_fast = do_bench(fast, return_mode="median") * 1e3
            t_ref = do_bench(ref, return_mode="median") * 1e3
            rows.append({"kernel": name, "tokens": n, "triton_us": t_fast, "torch_us": t_ref})
            print(f"{name:<30}{n:>7}{t_fast:>10.1f}{t_ref:>10.1f}{t_ref / t_fast:>9.2f}x")
        from tallow.engine.sampling import Sampler

        logits, batch, build_s = _sampler_batch(n)
        sampler = Sampler()
        t_fast = do_bench(lambda: sampler(logits, batch), return_mode="median") * 1e3
        with _torch_sampling():
            t_ref = do_bench(lambda: sampler(logits, batch), return_mode="median") * 1e3
        rows.append(
            {
                "kernel": "Sampler (penalties, seeded)",
                "tokens": n,
                "triton_us": t_fast,
                "torch_us": t_ref,
                "build_us": build_s * 1e6,
            }
        )
        print(
            f"{'Sampler (penalties, seeded)':<30}{n:>7}{t_fast:>10.1f}{t_ref:>10.1f}"
            f"{t_ref / t_fast:>9.2f}x   build {build_s * 1e6:.0f} µs (host)"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"device": torch.cuda.get_device_name(), "dtype": args.dtype, "rows": rows},
                f,
                indent=1,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
