"""Micro-benchmark of the engine thread's per-step grammar work besides the mask fill, for
``--rows`` JSON-Schema-constrained rows (``bench/schemas/order.json`` on the bench's synthetic
151,936-token vocabulary, each matcher walked into the schema as in
``bench/grammar_fill_micro.py``): the step's batched accepts (``StructuredOutputs.advance``,
one token per row), the stop checks' termination test, and the Python around xgrammar's own
accept call (the lists handed to it), each the median of ``--repeat`` calls with the
matchers rolled back between calls.

    .venv/bin/python bench/grammar_step_micro.py --rows 187
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).parent))
from grammar_fill_micro import (  # noqa: E402
    SCHEMA,
    _walked_matchers,
    add_row_arguments,
    synthetic_info,
    xgrammar_backend,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_row_arguments(parser, 187)
    args = parser.parse_args()

    from tallow.engine.sampling.grammar import GrammarState, StructuredOutputs
    from tallow.plugin import GrammarSpec

    info = synthetic_info(args.tokenizer)
    backend = xgrammar_backend(info, args.threads[0])
    compiled = backend.compile(GrammarSpec.json_schema(json.loads(SCHEMA.read_text())))
    matchers = _walked_matchers(backend, compiled, args.rows, args.max_walk, seed=0)
    masks = torch.empty(args.rows, info.bitmask_words, dtype=torch.int32)
    backend.fill_bitmasks(matchers, masks, range(args.rows))
    shifts = torch.arange(32, dtype=torch.int32)
    eos = set(info.eos_token_ids)
    tokens = []
    for row in range(args.rows):  # an allowed token per row, not EOS
        bits = ((masks[row].unsqueeze(-1) >> shifts) & 1).flatten()[: info.vocab_size]
        allowed = [t for t in bits.nonzero().flatten().tolist() if t not in eos]
        tokens.append(allowed[len(allowed) // 2])
    states = [GrammarState(m) for m in matchers]
    structured = StructuredOutputs(SimpleNamespace(name="xgrammar"), lambda: info)
    structured._backend = backend  # built already (the entry is never loaded)
    steps = [(state, [token], 1) for state, token in zip(states, tokens)]

    def rollback() -> None:
        for state in states:
            if state.accepted:
                state.matcher.rollback(state.accepted)
                state.accepted = 0

    def timed(fn, before=rollback) -> float:
        times = []
        for _ in range(args.repeat):
            before()
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return 1e3 * sorted(times)[len(times) // 2]

    from tallow_grammar_xgrammar.backend import _batch_accept

    inner = [m.inner for m in matchers]

    def native_accepts() -> float:  # each call's accepts taken back after it, untimed
        rollback()
        times = []
        for _ in range(args.repeat):
            start = time.perf_counter()
            got = _batch_accept(matchers, tokens)
            times.append(time.perf_counter() - start)
            assert all(got)
            for m in inner:
                m.rollback(1)
        return 1e3 * sorted(times)[len(times) // 2]

    handles = lambda: [m.native for m in matchers]  # noqa: E731
    results = {
        "StructuredOutputs.advance (batched accepts)": timed(lambda: structured.advance(steps)),
        "termination test after the accepts": timed(
            lambda: [s.terminated for s in states],
            before=lambda: (rollback(), structured.advance(steps)),
        ),
        "xgrammar's batch accept alone": native_accepts(),
        "the lists handed to xgrammar": timed(lambda: (handles(), list(tokens))),
    }
    print(f"rows {args.rows}: " + ", ".join(f"{k} {v:.3f} ms" for k, v in results.items()))


if __name__ == "__main__":
    main()
