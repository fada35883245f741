"""Micro-benchmark of the engine thread's time per constrained step with and without the
grammar thread: ``StructuredOutputs.fill`` (the masks filled on the engine thread, then the
host work of the step) against ``start_fill`` / host work / ``take`` (the grammar thread fills
them while the engine thread does the host work), as ``tallow.engine.core`` arranges a step.

The rows are JSON-Schema-constrained (``bench/schemas/order.json``) on the synthetic 151,936-
token byte-level vocabulary of the throughput bench, each walked a random number of tokens
into the schema (``bench/grammar_fill_micro.py``). The host work stands in for a step's
scheduling, batch building and bookkeeping: plain Python over per-row lists and dicts, held
under the GIL the whole time, sized by ``--host-ms``. Prints, for each arrangement and for
its parts alone, the median milliseconds per step of wall time and of the engine thread's own
CPU time (``time.thread_time``: what the engine thread spends, whatever else the machine
runs), the best of three interleaved rounds each. On a machine with no idle core the wall
times cannot show the overlap; the CPU times still show what left the engine thread.

    .venv/bin/python bench/grammar_overlap_micro.py --rows 187 --host-ms 4 --threads 1 2
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Callable
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).parent))
from grammar_fill_micro import (  # noqa: E402
    SCHEMA,
    _median_ms,
    _walked_matchers,
    add_row_arguments,
    synthetic_info,
    xgrammar_backend,
)


def _host_work(rows: int, rounds: int) -> int:
    """Python work of the kind a step's host phases do: per-row lists and dicts."""
    total = 0
    for r in range(rounds):
        table = {i: [i, i + r, i * 2] for i in range(rows)}
        flat: list[int] = []
        for i, entry in table.items():
            flat.extend(entry)
            total += entry[1] - i
        total += sum(flat[::7])
    return total


def _rounds_for(rows: int, ms: float) -> int:
    """How many rounds of :func:`_host_work` take about ``ms`` milliseconds here."""
    probe = 20
    took = _median_ms(lambda: _host_work(rows, probe), 5)
    return max(1, round(probe * ms / took))


def _median_wall_and_cpu_ms(fn: Callable[[], object], repeat: int) -> tuple[float, float]:
    for _ in range(3):
        fn()
    walls, cpus = [], []
    for _ in range(repeat):
        wall, cpu = time.perf_counter(), time.thread_time()
        fn()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.thread_time() - cpu)
    return 1e3 * sorted(walls)[repeat // 2], 1e3 * sorted(cpus)[repeat // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_row_arguments(parser, 187)
    parser.add_argument("--host-ms", type=float, default=4.0)
    args = parser.parse_args()

    from tallow.engine.sampling.grammar import GrammarState, StructuredOutputs
    from tallow.plugin import GrammarSpec

    info = synthetic_info(args.tokenizer)
    schema = json.loads(SCHEMA.read_text())
    rounds = _rounds_for(args.rows, args.host_ms)
    for threads in args.threads:
        backend = xgrammar_backend(info, threads)
        entry = SimpleNamespace(
            name="xgrammar",
            distribution="tallow-grammar-xgrammar",
            load=lambda: lambda _info, _config: backend,
        )
        structured = StructuredOutputs(entry, lambda: info, config=backend.config)
        compiled = structured.compile(GrammarSpec.json_schema(schema))
        states = [
            GrammarState(m)
            for m in _walked_matchers(backend, compiled, args.rows, args.max_walk, seed=0)
        ]

        matchers = [s.matcher for s in states]
        host = torch.empty(len(states), info.bitmask_words, dtype=torch.int32)

        def fill_here() -> None:  # what the engine thread did before the grammar thread
            backend.fill_bitmasks(matchers, host, range(len(matchers)))

        def serial() -> None:
            fill_here()
            _host_work(args.rows, rounds)

        def overlapped() -> None:
            job = structured.start_fill(states)
            _host_work(args.rows, rounds)
            structured.take(job)

        cases = {
            "host work alone": lambda: _host_work(args.rows, rounds),
            "fill alone, on the engine thread": fill_here,
            "fill then host work (one thread)": serial,
            "host work while the grammar thread fills": overlapped,
        }
        best = {name: (float("inf"), float("inf")) for name in cases}
        with torch.inference_mode():
            for _ in range(3):  # rounds interleave the cases, so a busy moment hits them all
                for name, fn in cases.items():
                    wall, cpu = _median_wall_and_cpu_ms(fn, args.repeat)
                    best[name] = (min(best[name][0], wall), min(best[name][1], cpu))
        print(
            f"rows {args.rows}, xgrammar threads {threads} (ms per step, wall / engine-thread CPU):"
        )
        for name, (wall, cpu) in best.items():
            print(f"  {name}: {wall:.2f} / {cpu:.2f}")


if __name__ == "__main__":
    main()
