"""All-reduce time per decode step under tensor parallelism, against NCCL's own benchmark.

Run under torchrun on the GPUs of one host (``torchrun --nproc-per-node 2
bench/gpu/tp_allreduce.py``). A decoder layer of a tensor-parallel step all-reduces its
``[tokens, hidden]`` activations twice, and the embedding once more: for llama-3-8b (32 layers,
hidden 4096) 65 all-reduces of ``tokens x 4096`` bfloat16 per step. For each batch size this
measures, with the same ``torch.distributed.all_reduce`` the sharded layers call:

- one all-reduce, eagerly (host launch included);
- the step's all-reduces replayed from a CUDA graph, as the engine's decode steps run them;

and, when ``all_reduce_perf`` of nccl-tests is on the PATH (or ``$NCCL_TESTS``), NCCL's own
time for the same message sizes on the same pair. Rank 0 prints a table and writes JSON with
``--output``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess

import torch
import torch.distributed as dist

from tallow.distributed.env import disable_nvlink_multicast


def _microseconds(fn, repeats: int) -> float:
    """Mean µs of ``fn()`` on the device over ``repeats`` calls (queued back to back)."""
    events = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
    events[0].record()
    for _ in range(repeats):
        fn()
    events[1].record()
    events[1].synchronize()
    return events[0].elapsed_time(events[1]) / repeats * 1e3


def _time_eager(x: torch.Tensor, repeats: int) -> float:
    for _ in range(5):
        dist.all_reduce(x)
    torch.cuda.synchronize()
    return _microseconds(lambda: dist.all_reduce(x), repeats)


def _time_graph(x: torch.Tensor, per_step: int, repeats: int) -> float:
    """µs per step of ``per_step`` all-reduces captured in one CUDA graph."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            dist.all_reduce(x)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(per_step):
            dist.all_reduce(x)
    graph.replay()  # the first replay uploads the graph
    torch.cuda.synchronize()
    return _microseconds(graph.replay, repeats)


def _nccl_tests(nbytes: list[int], gpus: int) -> dict[int, float]:
    """NCCL's out-of-place all-reduce time (µs) per size, from nccl-tests' all_reduce_perf."""
    exe = os.environ.get("NCCL_TESTS") or shutil.which("all_reduce_perf")
    if not exe:
        return {}
    out: dict[int, float] = {}
    for size in nbytes:
        run = subprocess.run(
            [
                exe,
                "-b",
                str(size),
                "-e",
                str(size),
                "-g",
                str(gpus),
                "-d",
                "bfloat16",
                "-w",
                "20",
                "-n",
                "200",
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        for line in run.stdout.splitlines():
            fields = line.split()
            if fields and fields[0] == str(size) and len(fields) > 6:
                out[size] = float(fields[5])  # out-of-place time, µs
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--batches", default="1,8,64,256")
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--output")
    args = parser.parse_args()
    disable_nvlink_multicast()
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dist.init_process_group("nccl")
    world = dist.get_world_size()
    per_step = 2 * args.layers + 1
    rows = []
    for batch in (int(b) for b in args.batches.split(",")):
        x = torch.randn(batch, args.hidden, dtype=torch.bfloat16, device="cuda")
        eager = _time_eager(x, args.repeats * 4)
        step = _time_graph(x, per_step, args.repeats)
        rows.append(
            {
                "batch": batch,
                "bytes": x.numel() * x.element_size(),
                "eager_us": eager,
                "graph_step_us": step,
                "graph_per_all_reduce_us": step / per_step,
            }
        )
    dist.barrier()
    dist.destroy_process_group()
    if local == 0:
        nccl = _nccl_tests([r["bytes"] for r in rows], world)
        print(
            f"all-reduce of [batch, {args.hidden}] bf16 over {world} GPUs; "
            f"{per_step} per decode step ({args.layers} layers)"
        )
        print(
            f"{'batch':>6} {'bytes':>9} {'eager us':>9} {'graph us/op':>12} "
            f"{'step us':>9} {'nccl-tests us':>14}"
        )
        for r in rows:
            r["nccl_tests_us"] = nccl.get(r["bytes"])
            ref = f"{r['nccl_tests_us']:.1f}" if r["nccl_tests_us"] else "n/a"
            print(
                f"{r['batch']:>6} {r['bytes']:>9} {r['eager_us']:>9.1f} "
                f"{r['graph_per_all_reduce_us']:>12.1f} {r['graph_step_us']:>9.0f} {ref:>14}"
            )
        if args.output:
            with open(args.output, "w") as f:
                json.dump(
                    {
                        "world_size": world,
                        "hidden": args.hidden,
                        "layers": args.layers,
                        "per_step": per_step,
                        "rows": rows,
                        "device": torch.cuda.get_device_name(0),
                    },
                    f,
                    indent=1,
                )


if __name__ == "__main__":
    main()
