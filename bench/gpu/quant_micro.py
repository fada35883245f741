"""Quantized matmul kernels on llama-3-8b shapes, against bf16, and the tuning sweep (GPU only).

  python bench/gpu/quant_micro.py [--types Q4_K,Q8_0] [--rows 1,4,16,64,256,512,4096]
                                  [--shapes qkv,o,gate_up,down,head] [--output FILE.json]
  python bench/gpu/quant_micro.py --sweep --table TUNED.json [--budget 170] [--jobs 16]
                                  [--rows 16,64,256,512,4096 --merge SHIPPED.json]

For every projection of llama-3-8b (qkv 4096->6144, o 4096->4096, gate_up 4096->28672,
down 14336->4096, head 4096->128256), weight type and row count M it times, each inside a CUDA
graph with the weights rotated through more copies than the L2 holds (every read comes from
HBM), the quantized matmul the engine runs (``auto``: the tuned table, else the defaults of
``tallow_quant_gguf.tuning``) and the dense baseline (``bf16``: tallow's bf16 GEMV at one row,
cuBLAS otherwise), and prints microseconds and effective GB/s (weight bytes read / time).

``--sweep`` times every candidate configuration of every path (``tuning.candidates``: the
one-row GEMV's row blocks, warps, K slices and prefetch; the tensor-core kernel's tiles,
stages, K slices and fp16 decoding; the workspace + cuBLAS path), checks each one's result
against the bf16 product of the decoded weight (a wrong candidate is reported and never
chosen), prints per (shape, type, M) the best, the default's time and bf16's, and writes the
best of every cell as a tuned table (``--table``) that the plugin reads:
copy it to ``plugins/quant/gguf/tallow_quant_gguf/tuned/`` (the table names its GPU) or point
``plugins.settings.tallow-quant-gguf.tuned_table`` at it. Before timing, the kernel variants
are compiled by ``--jobs`` processes at once (into Triton's cache), each run once; a variant
that fails to compile or launch is reported and left out of the timing (a process whose CUDA
context it broke hands its remaining variants to a fresh one). The cells run in order of
importance (one to 16 rows first); the table and ``--output`` are rewritten after every shape,
and the sweep stops before the next shape once ``--budget`` seconds (compilation included) have
passed, or when an error has left the CUDA context unusable. A candidate whose one timed run
takes over ``SLOW_FACTOR`` times the cell's best so far (and over ``SLOW_FLOOR``) is not timed
further.

``--merge TABLE`` (with ``--sweep``) starts the table from an existing one of the same GPU: the
cells this sweep times replace that table's entries for their (type, N, K, row bucket), the
others are kept, so a sweep restricted with ``--rows`` re-tunes some buckets of the shipped
table without dropping the rest.

``--device cpu`` with ``TRITON_INTERPRET=1`` and small shapes (``--shapes tiny=64:512``) runs the
script's logic on a CPU, timed by the wall clock: a dry run, not a measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context

import torch
import torch.nn.functional as F

from tallow.bench.kernel_timing import L2_ROTATION_BYTES, graph_seconds
from tallow.bench.kernel_timing import LLAMA3_8B_SHAPES as SHAPES

#: the rows of the decode and prefill steps the sweep covers, by pass (most important first)
PASSES = ((1, 4, 16), (64, 256, 512), (4096,))
#: the head only ever multiplies the last position of each sequence
HEAD_MAX_ROWS = 512
#: a candidate whose one timed run takes this many times the cell's best is not graph-timed
SLOW_FACTOR = 3.0
#: ... and at least this many seconds (a short kernel's single run is timed roughly)
SLOW_FLOOR = 50e-6


DEVICE = "cuda"


def seconds(fn, copies: int, iters: int = 10) -> float:
    return graph_seconds(fn, copies, iters, DEVICE)


def packed_weights(qtype: str, n: int, k: int, copies: int) -> list:
    from tallow_quant_gguf.packing import pack
    from tallow_quant_gguf.qtypes import quant_type

    qt = quant_type(qtype)
    out = []
    for _ in range(copies):
        raw = torch.randint(0, 256, (n, qt.row_bytes(k)), dtype=torch.uint8, device=DEVICE)
        _ordinary_scales(raw.view(n, -1, qt.block_bytes), qtype)
        out.append(pack(raw, qt))
        del raw
    return out


def _ordinary_scales(blocks: torch.Tensor, qtype: str) -> None:
    """Random fp16 scale fields of magnitude 1e-3..1e-2 (random bytes would give inf and nan)."""
    fields = {
        "Q4_0": (0,),
        "Q4_1": (0, 2),
        "Q5_0": (0,),
        "Q5_1": (0, 2),
        "Q8_0": (0,),
        "Q2_K": (80, 82),
        "Q3_K": (108,),
        "Q4_K": (0, 2),
        "Q5_K": (0, 2),
        "Q6_K": (208,),
        "IQ4_NL": (0,),
        "IQ4_XS": (0,),
    }[qtype]
    for at in fields:
        scale = torch.empty(blocks.shape[:2], device=blocks.device).uniform_(1e-3, 1e-2)
        blocks[..., at : at + 2] = scale.half().view(torch.uint8).view(*blocks.shape[:2], 2)


def _run(x, p, choice):
    from tallow_quant_gguf import ops

    if choice.path == "dequant":
        return F.linear(x, ops._workspace([p], p.rows, x.dtype))
    return ops._fused(x, p, None, choice, None)


def _error(got: torch.Tensor, ref: torch.Tensor, scale: torch.Tensor) -> float:
    return ((got.float() - ref).abs() / scale).max().item()


# -- compiling in parallel --------------------------------------------------------------------
def _variant_key(qtype: str, k: int, choice) -> tuple:
    """What makes a compiled kernel variant different (the runtime values aside)."""
    if choice.path == "gemv":
        rows, warps, splits, prefetch = choice.config
        return (qtype, k, "gemv", rows, warps, prefetch, splits > 1)
    if choice.path == "mma":
        bm, bn, q, warps, stages, splits, fast = choice.config
        return (qtype, k, "mma", bm, bn, q, warps, stages, splits > 1, fast)
    return (qtype, k, "dequant")


def context_usable() -> bool:
    """Whether the CUDA context still runs work (an illegal address or a failed launch leaves
    it unusable for the rest of the process)."""
    if DEVICE != "cuda":
        return True
    try:
        torch.cuda.synchronize()
        return torch.ones(1, device=DEVICE).add_(1).item() == 2.0
    except Exception:
        return False


def _compile_variants(tasks: list[tuple], device: str = "cuda") -> tuple[dict, list[tuple]]:
    """Run each ``(qtype, k, choice)`` once on a 512-row weight (the real shapes' row counts
    and this one share their specialisation): Triton compiles and caches each variant.
    Returns the failures (variant key -> message) and the tasks left untried because a failure
    broke this process's CUDA context."""
    global DEVICE
    DEVICE = device
    failures = {}
    for i, (qtype, k, choice) in enumerate(tasks):
        try:
            p = packed_weights(qtype, 512, k, 1)[0]
            m = 1 if choice.path == "gemv" else 16
            _run(torch.randn(m, k, device=DEVICE, dtype=_dtype()), p, choice)
            if DEVICE == "cuda":
                torch.cuda.synchronize()
        except Exception as exc:  # reported by the parent, the variant is left out of timing
            failures[_variant_key(qtype, k, choice)] = (
                f"{qtype} K={k} {choice}: {type(exc).__name__}: {exc}"[:300]
            )
            if not context_usable():
                return failures, tasks[i + 1 :]
    return failures, []


def precompile(cells: list[tuple], jobs: int) -> dict:
    """Compile every variant the cells' candidates need, ``jobs`` processes at once. Returns
    the variants that failed (key -> message)."""
    from tallow_quant_gguf.tuning import candidates

    variants = {}
    for qtype, (n, k), m in cells:
        for choice in candidates(qtype, n, k, m, _sm_count()):
            variants.setdefault(_variant_key(qtype, k, choice), (qtype, k, choice))
    tasks = list(variants.values())
    started = time.perf_counter()
    failures: dict = {}
    pending = tasks
    # one process per shard: a shard whose CUDA context broke comes back with its untried
    # variants, which go to fresh processes
    with ProcessPoolExecutor(
        max_workers=jobs, mp_context=get_context("spawn"), max_tasks_per_child=1
    ) as pool:
        while pending:
            shards = [pending[i::jobs] for i in range(min(jobs, len(pending)))]
            pending = []
            for failed, untried in pool.map(_compile_variants, shards, [DEVICE] * len(shards)):
                failures.update(failed)
                pending += untried
    print(
        f"compiled {len(tasks)} kernel variants with {jobs} processes in "
        f"{time.perf_counter() - started:.0f} s ({len(failures)} failed)",
        flush=True,
    )
    for failure in failures.values():
        print(f"    !! {failure}", flush=True)
    return failures


def _sm_count() -> int:
    return torch.cuda.get_device_properties(0).multi_processor_count if DEVICE == "cuda" else 132


def _dtype() -> torch.dtype:
    return torch.bfloat16 if DEVICE == "cuda" else torch.float16  # the interpreter: fp16


# -- timing -----------------------------------------------------------------------------------
def once(fn) -> float:
    """Seconds of one call of ``fn`` on the device (the wall clock in a dry run)."""
    if DEVICE != "cuda":
        started = time.perf_counter()
        fn()
        return time.perf_counter() - started
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    # the GPU waits ~0.5 ms before the start event, so the launch from Python is queued by
    # the time it is recorded: the time is the kernel's, not the launch's
    torch.cuda._sleep(1_000_000)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3


class BrokenContext(RuntimeError):
    """An error left the CUDA context unusable: nothing more can run in this process."""


def time_cell(
    qtype: str,
    name: str,
    n: int,
    k: int,
    m: int,
    qws: list,
    q_copies: int,
    dense_ws: list,
    dense_copies: int,
    sweep: bool,
    failed: dict | None = None,
) -> dict:
    from tallow.kernels.linear import linear as bf16_linear
    from tallow_quant_gguf import ops
    from tallow_quant_gguf.scheme import KernelPolicy
    from tallow_quant_gguf.tuning import candidates, default_choice

    q_bytes = qws[0].nbytes
    x = torch.randn(m, k, device=DEVICE, dtype=_dtype())
    dense = seconds(lambda i: bf16_linear(x, dense_ws[i]), dense_copies)
    auto_policy = KernelPolicy()
    auto = seconds(lambda i: ops.linear(x, [qws[i]], policy=auto_policy), q_copies)
    default = default_choice(qtype, n, k, m, _sm_count())
    row = dict(
        shape=name,
        n=n,
        k=k,
        type=qtype,
        m=m,
        weight_bytes=q_bytes,
        bf16_s=dense,
        auto_s=auto,
        auto=str(auto_policy.choice(qtype, n, k, m, x.device)),
        default=str(default),
    )
    if sweep:
        w = ops.dequantize(qws[0], x.dtype)
        ref = F.linear(x, w).float()
        scale = F.linear(x.abs(), w.abs()).float() + 1e-6
        timed, wrong, slow = [], [], []
        for choice in candidates(qtype, n, k, m, _sm_count()):
            if failed and _variant_key(qtype, k, choice) in failed:
                wrong.append((str(choice), "failed when compiled"))
                continue
            try:
                err = _error(_run(x, qws[0], choice), ref, scale)
                if not err <= 2e-2:
                    wrong.append((str(choice), err))
                    continue
                rough = once(lambda: _run(x, qws[1 % q_copies], choice))
                if timed and rough > max(SLOW_FACTOR * min(t for t, _ in timed), SLOW_FLOOR):
                    slow.append((rough, choice))
                    continue
                timed.append((seconds(lambda i: _run(x, qws[i], choice), q_copies), choice))
            except Exception as exc:  # e.g. a tile that needs more shared memory than exists
                wrong.append((str(choice), f"{type(exc).__name__}: {exc}"[:200]))
                if not context_usable():
                    for what, err in wrong:
                        print(f"    !! {what}: {err}", flush=True)
                    raise BrokenContext(f"{qtype} {name} m={m} {choice}") from exc
        timed.sort(key=lambda t: t[0])
        row["candidates"] = [(t, c.path, list(c.config)) for t, c in timed]
        row["slow"] = [(t, c.path, list(c.config)) for t, c in slow]
        row["wrong"] = wrong
        if timed:
            row["best_s"], best = timed[0]
            row["best"] = dict(path=best.path, config=list(best.config))
            row["default_s"] = next((t for t, c in timed + slow if c == default), None)
        for what, err in wrong:
            print(f"    !! {what}: {err}", flush=True)
        del w, ref, scale
    return row


def _print_row(row: dict) -> None:
    gbps = row["weight_bytes"] / 1e9
    dense_gbps = row["n"] * row["k"] * 2 / 1e9 / row["bf16_s"]
    text = (
        f"{row['shape']:8s} {row['type']:5s} {row['m']:5d}  auto {row['auto_s'] * 1e6:9.1f} us "
        f"{gbps / row['auto_s']:6.0f} GB/s"
    )
    if "best_s" in row:
        best = row["best"]
        default = row.get("default_s")
        text += (
            f" | best {row['best_s'] * 1e6:9.1f} us {gbps / row['best_s']:6.0f} GB/s "
            f"{best['path']} {tuple(best['config'])}"
            f" | default {default * 1e6 if default else float('nan'):8.1f}"
        )
    text += (
        f" | bf16 {row['bf16_s'] * 1e6:9.1f} us {dense_gbps:6.0f} GB/s"
        f" | x{min(row['auto_s'], row.get('best_s', 1e9)) / row['bf16_s']:.2f} of bf16"
    )
    print(text, flush=True)


def run(args: argparse.Namespace, save=lambda results: None) -> list[dict]:
    """Time the cells (and with ``--sweep`` every candidate); ``save(results)`` after every
    shape, so a run cut short keeps what it measured."""
    started = time.perf_counter()
    types = args.types.split(",")
    shapes = {}
    for spec in args.shapes.split(","):
        name, _, size = spec.partition("=")
        shapes[name] = tuple(int(v) for v in size.split(":")) if size else SHAPES[name]
    wanted = {int(r) for r in args.rows.split(",")}
    passes = [[m for m in p if m in wanted] for p in PASSES]
    cells = [
        (t, shape, m)
        for p in passes
        for t in types
        for shape in shapes.values()
        for m in p
        if not (shape == SHAPES["head"] and m > HEAD_MAX_ROWS)
    ]
    failed = precompile(cells, args.jobs) if args.sweep else {}
    results: list[dict] = []
    for rows in passes:
        for qtype in types:
            for name, (n, k) in shapes.items():
                ms = [m for m in rows if not (name == "head" and m > HEAD_MAX_ROWS)]
                if not ms:
                    continue
                if time.perf_counter() - started > args.budget:
                    print(
                        f"budget of {args.budget} s spent: stopping before {qtype} {name} {ms}",
                        flush=True,
                    )
                    return results
                # a dry run rotates through two copies: it times nothing
                rotation = L2_ROTATION_BYTES if DEVICE == "cuda" else 0
                dense_bytes = n * k * 2
                dense_copies = max(2, -(-rotation // dense_bytes))
                dense_ws = [
                    torch.randn(n, k, device=DEVICE, dtype=_dtype()) * k**-0.5
                    for _ in range(dense_copies)
                ]
                probe = packed_weights(qtype, n, k, 1)[0]
                q_copies = max(2, -(-rotation // probe.nbytes))
                qws = [probe] + packed_weights(qtype, n, k, q_copies - 1)
                for m in ms:
                    try:
                        row = time_cell(
                            qtype,
                            name,
                            n,
                            k,
                            m,
                            qws,
                            q_copies,
                            dense_ws,
                            dense_copies,
                            args.sweep,
                            failed,
                        )
                    except BrokenContext as exc:
                        print(
                            f"!! the CUDA context broke at {exc} ({exc.__cause__!r}): "
                            f"stopping; the table keeps the cells before it",
                            flush=True,
                        )
                        return results
                    results.append(row)
                    _print_row(row)
                save(results)
                del dense_ws, qws, probe
                if DEVICE == "cuda":
                    torch.cuda.empty_cache()
    print(f"timed in {time.perf_counter() - started:.0f} s (compilation included)", flush=True)
    return results


def tuned_table(results: list[dict], merge: str | None = None) -> dict:
    """The table of the best choice per timed cell; with ``merge`` (a table file of this GPU),
    that table's entries for the cells not timed here are kept."""
    import triton

    from tallow_quant_gguf.tuning import bucket, table_json

    best = [
        dict(
            type=r["type"],
            n=r["n"],
            k=r["k"],
            m=r["m"],
            path=r["best"]["path"],
            config=r["best"]["config"],
            us=round(r["best_s"] * 1e6, 2),
            bf16_us=round(r["bf16_s"] * 1e6, 2),
        )
        for r in results
        if "best" in r
    ]
    if merge:

        def cell(e: dict) -> tuple:
            return e["type"].upper(), e["n"], e["k"], bucket(e["m"])

        timed = {cell(e) for e in best}
        best = [e for e in base_entries(merge) if cell(e) not in timed] + best
    return table_json(best, _device_name(), torch=torch.__version__, triton=triton.__version__)


def base_entries(path: str) -> list[dict]:
    """The entries of the table ``path`` (checked as the plugin checks it), which must have been
    measured on this GPU."""
    from tallow_quant_gguf.tuning import TunedTable

    TunedTable.load(path)
    data = json.loads(open(path).read())
    if data.get("device") != _device_name():
        raise SystemExit(
            f"--merge {path}: a table of {data.get('device')!r}, this GPU is {_device_name()!r}"
        )
    return data["entries"]


def _device_name() -> str:
    return torch.cuda.get_device_name() if DEVICE == "cuda" else DEVICE


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--types", default="Q4_K,Q8_0")
    parser.add_argument("--rows", default="1,4,16,64,256,512,4096")
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--sweep", action="store_true")
    parser.add_argument("--table", help="write the tuned table here (with --sweep)")
    parser.add_argument(
        "--merge",
        help="keep this table's entries for the cells not timed (with --sweep and --table)",
    )
    parser.add_argument(
        "--budget",
        type=float,
        default=170.0,
        help="seconds from the start (compilation included) after which no further shape is begun",
    )
    parser.add_argument("--jobs", type=int, default=min(16, os.cpu_count() or 1))
    parser.add_argument("--output")
    parser.add_argument("--device", default="cuda", help="cpu: a dry run (TRITON_INTERPRET=1)")
    args = parser.parse_args()
    global DEVICE
    DEVICE = args.device
    if DEVICE == "cuda" and not torch.cuda.is_available():
        sys.exit("needs a CUDA GPU")
    if args.merge:
        if not (args.sweep and args.table):
            sys.exit("--merge needs --sweep and --table")
        base_entries(args.merge)  # a table of another GPU is refused before any timing
    results = run(args, lambda results: save(args, results))
    save(args, results)
    if args.sweep and args.table:
        print(
            f"tuned table: {len(tuned_table(results, args.merge)['entries'])} entries in "
            f"{args.table}"
        )


def save(args: argparse.Namespace, results: list[dict]) -> None:
    """Write ``--output`` and (with ``--sweep``) the tuned table ``--table``, whole files
    replaced at once (a run killed while writing leaves the previous ones)."""
    if args.output:
        _write_json(args.output, {"device": _device_name(), "results": results})
    if args.sweep and args.table:
        _write_json(args.table, tuned_table(results, getattr(args, "merge", None)))


def _write_json(path: str, data: dict) -> None:
    with open(path + ".part", "w") as f:
        json.dump(data, f, indent=1)
    os.replace(path + ".part", path)


if __name__ == "__main__":
    main()
