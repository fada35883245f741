"""Micro-benchmark of each installed first-party grammar backend's ``fill_bitmasks`` for the
same rows: ``--rows`` matchers of ``bench/schemas/order.json`` on the bench's synthetic
151,936-token vocabulary, each walked into the schema as in ``bench/grammar_fill_micro.py``
(walks differ between backends only by which allowed token is drawn). Prints each backend's
set-up time (vocabulary and compile) and the median milliseconds of one step's fill, the
backend's own threads set to ``--threads``.

    .venv/bin/python bench/grammar_backends_fill.py --rows 187 --threads 8
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterator

import torch

sys.path.insert(0, str(Path(__file__).parent))
from grammar_fill_micro import (  # noqa: E402
    SCHEMA,
    _median_ms,
    _walked_matchers,
    add_row_arguments,
    synthetic_info,
)

#: distribution → the backend class, as "module:Class"
BACKENDS = {
    "tallow-grammar-xgrammar": "tallow_grammar_xgrammar.backend:XGrammarBackend",
    "tallow-grammar-llguidance": "tallow_grammar_llguidance.backend:LLGuidanceBackend",
}


def installed_backends(info, threads: int) -> Iterator[tuple[str, Any, float]]:
    """``(distribution, backend, seconds its construction took)`` for each installed backend
    of :data:`BACKENDS`, built for ``info`` with ``threads`` threads of its own; prints the
    ones that are not installed."""
    for distribution, where in BACKENDS.items():
        module, name = where.split(":")
        try:
            cls = getattr(importlib.import_module(module), name)
        except ImportError:
            print(f"{distribution}: not installed")
            continue
        started = time.perf_counter()
        config = SimpleNamespace(
            plugins=SimpleNamespace(settings={distribution: {"max_threads": threads}})
        )
        backend = cls(info, config)
        yield distribution, backend, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_row_arguments(parser, 187)
    args = parser.parse_args()

    from tallow.plugin import GrammarSpec

    info = synthetic_info(args.tokenizer)
    spec = GrammarSpec.json_schema(json.loads(SCHEMA.read_text()))
    host = torch.empty(args.rows, info.bitmask_words, dtype=torch.int32)
    for distribution, backend, built in installed_backends(info, args.threads[0]):
        started = time.perf_counter()
        compiled = backend.compile(spec)
        set_up = built + time.perf_counter() - started
        matchers = _walked_matchers(backend, compiled, args.rows, args.max_walk, seed=0)
        fill = _median_ms(
            lambda: backend.fill_bitmasks(matchers, host, range(args.rows)), args.repeat
        )
        print(
            f"{distribution}: set-up {set_up:.1f} s, fill of {args.rows} rows on "
            f"{args.threads[0]} threads {fill:.2f} ms"
        )


if __name__ == "__main__":
    main()
