"""Does flashinfer run on this GPU machine? One short run that answers it with evidence.

Prints the versions (python, torch, CUDA, nvcc, flashinfer, tvm-ffi), compiles one decode and
one prefill module (FA2; FA3 too when time allows) for head size 128 and bf16 just in time,
with the wall time of each compiler job, runs them on a random paged KV cache laid out as
tallow lays it out ([2, blocks, block_size, kv heads, head size], K and V handed over as two
views) against tallow's torch reference, replays a decode captured in a CUDA graph after a
re-plan with other lengths and block tables, times the host cost of a plan and a run, and
copies the compiled modules to OUT/jit (as a tarball whose paths are flashinfer's AOT layout).

Usage (GPU machine, project root, after installing the .whl set): python3
bench/gpu/flashinfer_probe.py OUT [--budget SECONDS]
"""

from __future__ import annotations

import argparse
import os
import pathlib
import subprocess
import sys
import tarfile
import threading
import time
import traceback

T0 = time.time()
os.environ.setdefault("FLASHINFER_CUDA_ARCH_LIST", "9.0a")
os.environ.setdefault("FLASHINFER_WORKSPACE_BASE", "/tmp/fi-ws")
os.environ.setdefault("MAX_JOBS", str(os.cpu_count() or 8))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "framework"))

FAILURES: list[str] = []


def section(name: str) -> None:
    print(f"\n== {name} (t={time.time() - T0:.1f}s)", flush=True)


def guarded(name: str, fn, *args, **kwargs):
    """Run ``fn``; on an error print its whole traceback, remember it, and go on."""
    try:
        return fn(*args, **kwargs)
    except BaseException as exc:  # noqa: BLE001 - a probe reports everything
        FAILURES.append(f"{name}: {type(exc).__name__}: {exc}")
        print(f"!! {name} failed:", flush=True)
        traceback.print_exc()
        sys.stdout.flush()
        return None


def run_cmd(cmd: list[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout.strip()
    except Exception as exc:  # noqa: BLE001
        return f"({cmd[0]}: {exc})"


def versions() -> None:
    section("versions")
    import torch

    print(
        "python",
        sys.version.split()[0],
        "| torch",
        torch.__version__,
        "| torch CUDA",
        torch.version.cuda,
    )
    print("GPU", torch.cuda.get_device_name(), "capability", torch.cuda.get_device_capability())
    print("nvcc:", run_cmd(["nvcc", "--version"]).splitlines()[-1:])
    print("ninja", run_cmd(["ninja", "--version"]), "| cpus", os.cpu_count())
    print(
        "torch.Tensor has __dlpack_c_exchange_api__ before tvm_ffi:",
        hasattr(torch.Tensor, "__dlpack_c_exchange_api__"),
    )
    t = time.time()
    import tvm_ffi

    print(
        f"tvm_ffi {tvm_ffi.__version__} imported in {time.time() - t:.1f}s; fast torch "
        "exchange API:",
        hasattr(torch.Tensor, "__dlpack_c_exchange_api__"),
    )
    t = time.time()
    import flashinfer

    print(
        f"flashinfer {flashinfer.__version__} imported in {time.time() - t:.1f}s from "
        f"{pathlib.Path(flashinfer.__file__).parent}"
    )
    from flashinfer.jit import env

    print("JIT dir", env.FLASHINFER_JIT_DIR, "| AOT dir", env.FLASHINFER_AOT_DIR)


def make_specs():
    import torch
    from flashinfer.jit.attention.modules import gen_batch_decode_module, gen_batch_prefill_module

    bf16 = torch.bfloat16
    return {
        "decode": gen_batch_decode_module(bf16, bf16, bf16, torch.int32, 128, 128, 0, False, False),
        "fa2": gen_batch_prefill_module(
            "fa2", bf16, bf16, bf16, torch.int32, 128, 128, 0, False, False, False
        ),
        "fa3": gen_batch_prefill_module(
            "fa3", bf16, bf16, bf16, torch.int32, 128, 128, 0, False, False, False
        ),
    }


def build(spec) -> float:
    """Compile one module as flashinfer's own JIT would (its ninja file, in its own folder, so
    that loading it later finds it up to date)."""
    t = time.time()
    spec.build(verbose=False)
    took = time.time() - t
    so = spec.jit_library_path
    print(f"compiled {so.name} ({so.stat().st_size / 1e6:.1f} MB) in {took:.1f}s", flush=True)
    return took


def ninja_times() -> None:
    """Wall time of each compiler job, from ninja's own logs."""
    from flashinfer.jit import env

    rows = []
    for log in env.FLASHINFER_JIT_DIR.glob("*/.ninja_log"):
        for line in log.read_text().splitlines()[1:]:
            start, end, _, target, _ = line.split("\t")
            rows.append(((int(end) - int(start)) / 1000, pathlib.Path(target).name))
    for secs, target in sorted(rows, reverse=True):
        print(f"  {secs:7.1f}s  {target}")


# -- the checks ------------------------------------------------------------------------------
def random_batch(query_lens, seq_lens, *, hq=32, hkv=8, d=128, block_size=16, dtype=None, seed=0):
    """q, a cache filled with random K/V, block tables of shuffled blocks, and the flashinfer
    page arguments derived from them."""
    import torch

    dtype = dtype or torch.bfloat16
    g = torch.Generator(device="cuda").manual_seed(seed)
    pages = [-(-s // block_size) for s in seq_lens]
    num_blocks = sum(pages) + 8
    perm = torch.randperm(num_blocks, generator=g, device="cuda").to(torch.int32)
    width = max(pages)
    tables = torch.zeros(len(seq_lens), width, dtype=torch.int32, device="cuda")
    at = 0
    for i, n in enumerate(pages):
        tables[i, :n] = perm[at : at + n]
        at += n
    cache = torch.randn(
        2, num_blocks, block_size, hkv, d, generator=g, device="cuda", dtype=torch.float32
    ).to(dtype)
    q = torch.randn(sum(query_lens), hq, d, generator=g, device="cuda", dtype=torch.float32).to(
        dtype
    )
    qo_indptr = torch.tensor([0] + list(_cumsum(query_lens)), dtype=torch.int32)
    kv_indptr = torch.tensor([0] + list(_cumsum(pages)), dtype=torch.int32)
    indices = torch.cat([tables[i, :n] for i, n in enumerate(pages)])
    last = torch.tensor([(s - 1) % block_size + 1 for s in seq_lens], dtype=torch.int32)
    return dict(
        q=q,
        cache=cache,
        tables=tables,
        qo_indptr=qo_indptr,
        kv_indptr=kv_indptr,
        indices=indices,
        last=last,
        query_lens=query_lens,
        seq_lens=seq_lens,
        hq=hq,
        hkv=hkv,
        d=d,
        block_size=block_size,
    )


def _cumsum(xs):
    total = 0
    for x in xs:
        total += x
        yield total


def reference(b, **kw):
    from tallow.kernels.attention_ref import paged_attention_ref
    from tallow.kernels.kv_cache import LayerKVCache, layer_layout
    from tallow.kernels.kv_cast import CastKVCodec

    qsl = [0] + list(_cumsum(b["query_lens"]))
    # the probe's stacked cache seen as a cast codec's k and v pages
    codec = CastKVCodec(storage=b["cache"].dtype)
    shape = dict(num_kv_heads=b["hkv"], head_dim=b["d"], block_size=b["block_size"])
    layout = layer_layout(codec, model_dtype=b["q"].dtype, **shape)
    cache = LayerKVCache(
        codec,
        {"k": b["cache"][0], "v": b["cache"][1]},
        layout=layout,
        model_dtype=b["q"].dtype,
        **shape,
    )
    return paged_attention_ref(
        b["q"],
        cache,
        query_start_loc=qsl,
        seq_lens=b["seq_lens"],
        block_tables=b["tables"],
        scale=b["d"] ** -0.5,
        **kw,
    )


def report(name, out, ref, tol=2e-2):
    err = (out.float() - ref.float()).abs().max().item()
    ok = err <= tol
    print(f"{name}: max |out - ref| = {err:.2e} ({'ok' if ok else 'TOO LARGE'})", flush=True)
    if not ok:
        FAILURES.append(f"{name}: max error {err:.2e}")


def check_decode():
    import torch
    import flashinfer

    ws = torch.zeros(128 << 20, dtype=torch.uint8, device="cuda")
    b = random_batch([1] * 7, [1, 15, 16, 17, 300, 1000, 3000])
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD")
    w.plan(
        b["kv_indptr"],
        b["indices"],
        b["last"],
        b["hq"],
        b["hkv"],
        b["d"],
        b["block_size"],
        q_data_type=torch.bfloat16,
        kv_data_type=torch.bfloat16,
        sm_scale=b["d"] ** -0.5,
    )
    out = w.run(b["q"], (b["cache"][0], b["cache"][1]))
    report("decode (CUDA cores) bf16 hd128", out, reference(b))
    wt = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
        ws, "NHD", use_tensor_cores=True, backend="fa2"
    )
    guarded("tensor-core decode", _tensor_core_decode, wt, b)
    return ws


def _tensor_core_decode(w, b):
    import torch

    w.plan(
        b["kv_indptr"],
        b["indices"],
        b["last"],
        b["hq"],
        b["hkv"],
        b["d"],
        b["block_size"],
        q_data_type=torch.bfloat16,
        kv_data_type=torch.bfloat16,
        sm_scale=b["d"] ** -0.5,
    )
    out = w.run(b["q"], (b["cache"][0], b["cache"][1]))
    report("decode (tensor cores, FA2 prefill module) bf16 hd128", out, reference(b))


def check_prefill(backend: str, ws):
    import torch
    import flashinfer

    # chunked prefill beside decodes: queries are the last tokens of each context
    b = random_batch([1, 37, 200, 1, 513], [1, 100, 700, 2048, 513], seed=1)
    w = flashinfer.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD", backend=backend)
    w.plan(
        b["qo_indptr"],
        b["kv_indptr"],
        b["indices"],
        b["last"],
        b["hq"],
        b["hkv"],
        b["d"],
        b["block_size"],
        causal=True,
        q_data_type=torch.bfloat16,
        kv_data_type=torch.bfloat16,
        sm_scale=b["d"] ** -0.5,
    )
    out = w.run(b["q"], (b["cache"][0], b["cache"][1]))
    report(f"prefill {backend} causal bf16 hd128", out, reference(b))
    torch.cuda.synchronize()


def check_graph_decode(ws):
    """Capture decode for 8 rows, then re-plan with other lengths and tables and replay."""
    import torch
    import flashinfer

    bs, block_size, max_blocks = 8, 16, 256
    indptr_buf = torch.zeros(bs + 1, dtype=torch.int32, device="cuda")
    indices_buf = torch.zeros(bs * max_blocks, dtype=torch.int32, device="cuda")
    last_buf = torch.zeros(bs, dtype=torch.int32, device="cuda")
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
        ws,
        "NHD",
        use_cuda_graph=True,
        paged_kv_indptr_buffer=indptr_buf,
        paged_kv_indices_buffer=indices_buf,
        paged_kv_last_page_len_buffer=last_buf,
    )
    a = random_batch([1] * bs, [1] * bs, seed=2)
    q_buf = a["q"].clone()
    big = random_batch([1] * bs, [5, 17, 33, 64, 129, 600, 1500, 4000], seed=3)
    cache = big["cache"]  # one cache big enough for both batches

    def plan(b):
        w.plan(
            b["kv_indptr"],
            b["indices"],
            b["last"],
            b["hq"],
            b["hkv"],
            b["d"],
            block_size,
            q_data_type=torch.bfloat16,
            kv_data_type=torch.bfloat16,
            sm_scale=b["d"] ** -0.5,
        )

    plan(a)
    out_buf = torch.empty_like(q_buf)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        w.run(q_buf, (cache[0], cache[1]), out=out_buf)  # warm-up outside the graph
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        w.run(q_buf, (cache[0], cache[1]), out=out_buf)
    for b in (big, random_batch([1] * bs, [3000, 1, 2, 900, 16, 15, 300, 77], seed=4)):
        b["cache"] = cache  # lengths and tables of b, over the shared cache
        b["tables"] = b["tables"] % cache.shape[1]
        b["indices"] = b["indices"] % cache.shape[1]
        plan(b)
        q_buf.copy_(b["q"])
        graph.replay()
        torch.cuda.synchronize()
        report(f"decode replayed from a CUDA graph, lengths {b['seq_lens']}", out_buf, reference(b))


def time_host_cost(ws):
    """Host time of plan and of run (eager) for llama-3-8b's decode shape at batch 1 and 64."""
    import torch
    import flashinfer

    for bs in (1, 64):
        b = random_batch([1] * bs, [768] * bs, seed=5)
        w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD")
        kv = (b["cache"][0], b["cache"][1])
        out = torch.empty_like(b["q"])

        def plan():
            w.plan(
                b["kv_indptr"],
                b["indices"],
                b["last"],
                b["hq"],
                b["hkv"],
                b["d"],
                b["block_size"],
                q_data_type=torch.bfloat16,
                kv_data_type=torch.bfloat16,
                sm_scale=b["d"] ** -0.5,
            )

        plan()
        w.run(b["q"], kv, out=out)
        torch.cuda.synchronize()
        n = 200
        t = time.perf_counter()
        for _ in range(n):
            plan()
        plan_us = (time.perf_counter() - t) / n * 1e6
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(n):
            w.run(b["q"], kv, out=out)
        host_us = (time.perf_counter() - t) / n * 1e6
        torch.cuda.synchronize()
        dev_us = (time.perf_counter() - t) / n * 1e6
        print(
            f"batch {bs}, context 768: plan {plan_us:.0f} us host; run {host_us:.0f} us host, "
            f"{dev_us:.0f} us until done (eager, one layer)",
            flush=True,
        )


def save_modules(out: pathlib.Path, specs, names) -> None:
    """Compiled modules as flashinfer/data/aot/<name>/<name>.so in one tarball (extract it in
    the installed flashinfer package: modules found there load without compiling)."""
    jit = out / "jit"
    jit.mkdir(parents=True, exist_ok=True)
    tar_path = jit / "flashinfer-aot-sm90a.tar.gz"
    with tarfile.open(tar_path, "w:gz") as tar:
        for n in names:
            so = specs[n].jit_library_path
            if so.exists():
                tar.add(so, arcname=f"data/aot/{so.parent.name}/{so.name}")
    size = tar_path.stat().st_size
    print(f"{tar_path}: {size / 1e6:.1f} MB ({names})")
    if size > 15 * 2**20:
        tar_path.unlink()
        print("!! the tarball is over 15 MiB and would not come back; removed")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=pathlib.Path)
    ap.add_argument(
        "--budget",
        type=float,
        default=170.0,
        help="seconds from start after which nothing new begins",
    )
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    guarded("imports", versions)
    if FAILURES:
        return 1
    specs = guarded("JIT specs", make_specs)
    if specs is None:
        return 1
    section("compile the decode, FA2 and FA3 prefill modules, each its own ninja, at once")
    built: list[str] = []
    threads = {}
    for name in ("decode", "fa2", "fa3"):

        def job(name=name):
            if guarded(f"compile {name}", build, specs[name]) is not None:
                built.append(name)

        threads[name] = threading.Thread(target=job, daemon=True)
        threads[name].start()
    threads["decode"].join()
    threads["fa2"].join()
    ws = None
    if "decode" in built:
        section("decode against the torch reference")
        ws = guarded("decode", check_decode)
    if "fa2" in built and ws is not None:
        section("FA2 prefill against the torch reference")
        guarded("prefill fa2", check_prefill, "fa2", ws)
    if ws is not None:
        section("decode in a CUDA graph, re-planned between replays")
        guarded("graph decode", check_graph_decode, ws)
        section("host cost")
        guarded("timing", time_host_cost, ws)
    left = args.budget - (time.time() - T0)
    section(f"waiting up to {max(left, 0):.0f}s for the FA3 build")
    threads["fa3"].join(timeout=max(left, 0))
    if "fa3" in built and ws is not None:
        guarded("prefill fa3", check_prefill, "fa3", ws)
    elif threads["fa3"].is_alive():
        FAILURES.append("fa3: still compiling at the budget")
        print("!! FA3 still compiling at the budget; not checked")
    section("compiler jobs (wall seconds each)")
    guarded("ninja log", ninja_times)
    section("compiled modules")
    guarded("save modules", save_modules, args.out, specs, list(built))
    section("summary")
    print("failures:" if FAILURES else "no failures", *FAILURES, sep="\n  ")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
