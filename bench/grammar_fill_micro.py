"""Micro-benchmark of a step's grammar masks on the host: ``XGrammarBackend.fill_bitmasks`` for
a batch of JSON-Schema-constrained rows, as the engine calls it once per step.

The vocabulary is the synthetic byte-level one the throughput bench gives ``random:`` models
(151,936 tokens, Qwen3's size); the schema is ``bench/schemas/order.json``. Each row's matcher is
first walked a random number of tokens into the schema (random allowed tokens, fixed seed) so
the rows sit in different grammar states. Prints the median milliseconds per call (the best of
three interleaved rounds) of the whole fill, of its two parts (xgrammar's batched fill;
clearing control-character tokens from JSON rows) and of that clear done by indexing the rows
with a list, as the backend did before. ``--threads`` sets the backend's ``max_threads``.

    .venv/bin/python bench/grammar_fill_micro.py --rows 256 --threads 1 2
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Callable

import torch

VOCAB = 151936
SCHEMA = Path(__file__).parent / "schemas" / "order.json"


def _median_ms(fn: Callable[[], object], repeat: int) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * sorted(times)[len(times) // 2]


def _walked_matchers(backend, compiled, rows: int, max_walk: int, seed: int) -> list:
    """``rows`` matchers, each advanced by up to ``max_walk`` random allowed tokens."""
    info = backend.tokenizer
    shifts = torch.arange(32, dtype=torch.int32)
    eos = torch.tensor(sorted(info.eos_token_ids), dtype=torch.int64)
    scratch = torch.empty(1, info.bitmask_words, dtype=torch.int32)
    rng = random.Random(seed)
    matchers = []
    for _ in range(rows):
        matcher = backend.matcher(compiled)
        for _ in range(rng.randrange(max_walk + 1)):
            matcher.fill_bitmask(scratch, 0)
            bits = ((scratch[0].unsqueeze(-1) >> shifts) & 1).flatten()[: info.vocab_size]
            bits[eos] = 0
            allowed = bits.nonzero().flatten()
            if not len(allowed):
                break
            assert matcher.accept(int(allowed[rng.randrange(len(allowed))]))
        matchers.append(matcher)
    return matchers


def synthetic_info(tokenizer_dir: str | None = None):
    """The TokenizerInfo of the bench's synthetic byte-level vocabulary (VOCAB tokens), or of
    the tokenizer in ``tokenizer_dir`` (a ``tokenizer.json`` directory; ``--tokenizer``)."""
    from tallow.bench.synthetic_vocab import write_tokenizer
    from tallow.engine.token_bytes import tokenizer_info
    from tallow.engine.tokenizer import Tokenizer

    if tokenizer_dir:
        return tokenizer_info(Tokenizer.from_directory(tokenizer_dir), VOCAB)
    with tempfile.TemporaryDirectory() as scratch:
        tokenizer = Tokenizer.from_directory(write_tokenizer(Path(scratch) / "tok", VOCAB))
    return tokenizer_info(tokenizer, VOCAB)


def xgrammar_backend(info, threads: int):
    """An XGrammarBackend for ``info`` whose batched fills run on ``threads`` threads."""
    from tallow_grammar_xgrammar.backend import XGrammarBackend

    config = SimpleNamespace(
        plugins=SimpleNamespace(settings={"tallow-grammar-xgrammar": {"max_threads": threads}})
    )
    return XGrammarBackend(info, config)


def add_row_arguments(parser: argparse.ArgumentParser, rows: int) -> None:
    """The options every grammar micro-benchmark takes: rows, xgrammar threads, how far each
    matcher is walked into the schema, calls per median."""
    parser.add_argument("--rows", type=int, default=rows)
    parser.add_argument("--threads", type=int, nargs="+", default=[1])
    parser.add_argument("--max-walk", type=int, default=40)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument(
        "--tokenizer",
        default=None,
        help="a tokenizer.json directory of VOCAB tokens at most instead of the "
        "synthetic vocabulary (say, Qwen's own)",
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_row_arguments(parser, 256)
    args = parser.parse_args()

    import xgrammar as xgr

    from tallow.plugin import GrammarSpec

    info = synthetic_info(args.tokenizer)
    schema = json.loads(SCHEMA.read_text())
    host = torch.empty(args.rows, info.bitmask_words, dtype=torch.int32)
    rows = range(args.rows)
    for threads in args.threads:
        backend = xgrammar_backend(info, threads)
        compiled = backend.compile(GrammarSpec.json_schema(schema))
        matchers = _walked_matchers(backend, compiled, args.rows, args.max_walk, seed=0)
        inner = [m.inner for m in matchers]
        batch = xgr.BatchGrammarMatcher(threads)
        listed = list(rows)

        def by_row_list() -> None:  # the clear as the backend did it before: copies the rows
            host[listed] &= backend.json_tokens

        cases = {
            "fill_bitmasks": lambda: backend.fill_bitmasks(matchers, host, rows),
            "xgrammar batched fill": lambda: batch.batch_fill_next_token_bitmask(
                inner, host, listed
            ),
            "control-character clear, in place": lambda: host.__iand__(backend.json_tokens),
            "control-character clear, by a row list": by_row_list,
        }
        best = {name: float("inf") for name in cases}
        for _ in range(3):  # rounds interleave the cases, so a busy moment hits them all
            for name, fn in cases.items():
                best[name] = min(best[name], _median_ms(fn, args.repeat))
        print(
            f"rows {args.rows}, threads {threads}: "
            + ", ".join(f"{name} {ms:.2f} ms" for name, ms in best.items())
        )


if __name__ == "__main__":
    main()
