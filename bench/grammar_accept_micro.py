"""Micro-benchmark of where a constrained step's accepts run: the engine thread's time per
step when it accepts each row's sampled token itself (one ``accept`` and one
``is_terminated`` per row, as the engine did before) while the grammar thread fills the next
masks, against the grammar thread doing both (one batched ``accept_tokens`` call, then the
fill; the grammar's end read off the masks), as ``tallow.engine.core`` arranges a step now.

Rows, vocabulary and the stand-in host work are those of ``bench/grammar_overlap_micro.py``
(JSON-Schema rows of ``bench/schemas/order.json`` on the synthetic 151,936-token vocabulary).
Each row gets a random continuation of allowed tokens; a timed step advances every row by its
next token, and each round starts from the same states (rolled back, untimed). Prints, per
arrangement, the median milliseconds per step of wall time and of the engine thread's own CPU
time (``time.thread_time``), the best of three interleaved rounds; and the accepts alone, on
one thread: a loop of ``accept`` + ``is_terminated`` against one ``accept_tokens`` call.

    .venv/bin/python bench/grammar_accept_micro.py --rows 187 --host-ms 4
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from grammar_fill_micro import (  # noqa: E402
    SCHEMA, _walked_matchers, add_row_arguments, allowed_but_eos, synthetic_info,
)
from grammar_overlap_micro import (  # noqa: E402
    _host_work, _rounds_for, best_of_rounds, engine_grammars, report,
)


def _continuations(backend, matchers: list, steps: int, seed: int) -> list[list[int]]:
    """For each matcher, ``steps`` random allowed tokens that keep it going (not EOS, not
    ending it), found by walking it and rolling it back; [] where no such walk was found."""
    rng = random.Random(seed)
    out = []
    for matcher in matchers:
        tokens: list[int] = []
        for _ in range(steps):
            allowed = allowed_but_eos(matcher, backend.tokenizer)
            if not len(allowed):
                break
            token = int(allowed[rng.randrange(len(allowed))])
            assert matcher.accept(token)
            tokens.append(token)
            if matcher.is_terminated():
                break
        matcher.rollback(len(tokens))
        out.append(tokens if len(tokens) == steps and not matcher.is_terminated() else [])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_row_arguments(parser, 187)
    parser.add_argument("--host-ms", type=float, default=4.0)
    parser.add_argument("--switch-interval-ms", type=float, default=None,
                        help="sys.setswitchinterval for the run (default: the interpreter's)")
    parser.set_defaults(max_walk=20)
    args = parser.parse_args()
    if args.switch_interval_ms is not None:
        sys.setswitchinterval(args.switch_interval_ms / 1e3)

    from tallow.engine.sampling.grammar import GrammarState

    info = synthetic_info()
    schema = json.loads(SCHEMA.read_text())
    rounds = _rounds_for(args.rows, args.host_ms)
    steps = args.repeat + 3  # _median_wall_and_cpu_ms: three warm-up calls, then the timed
    for threads in args.threads:
        backend, structured, compiled = engine_grammars(info, threads, schema)
        rows: list[tuple[GrammarState, list[int]]] = []
        seed = 0
        while len(rows) < args.rows:
            walked = _walked_matchers(backend, compiled, args.rows, args.max_walk, seed)
            for matcher, more in zip(walked, _continuations(backend, walked, steps, seed)):
                if more and len(rows) < args.rows:
                    state = GrammarState(matcher)
                    rows.append((state, more))
            seed += 1
        states = [state for state, _ in rows]
        step = {"k": 0}

        def reset() -> None:
            for state in states:
                state.matcher.rollback(state.accepted)
                state.accepted = 0
                state.ended = False
            step["k"] = 0

        def accepts_here() -> None:  # before: the engine thread's stop checks
            step["k"] += 1
            for state, more in rows:
                state.sync(more, step["k"])
                state.matcher.is_terminated()

        def before() -> None:
            accepts_here()
            job = structured.start_fill([(s, more, step["k"]) for s, more in rows])
            _host_work(args.rows, rounds)
            structured.take(job)

        def now() -> None:
            step["k"] += 1
            job = structured.start_fill([(s, more, step["k"]) for s, more in rows])
            _host_work(args.rows, rounds)
            structured.take(job)

        def batched_accepts() -> None:
            step["k"] += 1
            backend.accept_tokens([s.matcher for s in states],
                                  [more[step["k"] - 1] for _, more in rows])
            for state in states:
                state.accepted += 1

        cases = {"host work alone": lambda: _host_work(args.rows, rounds),
                 "accepts on the engine thread, fill on the grammar thread (before)": before,
                 "accepts and fill on the grammar thread (now)": now,
                 "accept + is_terminated per row, one thread": accepts_here,
                 "accept_tokens, one call, one thread": batched_accepts}
        best = best_of_rounds(cases, args.repeat, before_each=reset)
        reset()
        report(f"rows {len(rows)}, xgrammar threads {threads}, host work {args.host_ms} ms, "
               f"switch interval {1e3 * sys.getswitchinterval():g} ms", best)

if __name__ == "__main__":
    main()
