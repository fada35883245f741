"""Each installed first-party grammar backend's mask fill along the walk a random-weight model
takes: ``--rows`` matchers of ``bench/schemas/order.json`` on the bench's synthetic vocabulary
advance together, one step at a time, each row by the allowed token of highest logit (a fixed
random bias per token plus fresh noise per step, as a random model's greedy choice under its
mask), until every row's grammar has ended or ``--steps`` steps. Prints, per backend, the
fill's milliseconds per row per step (median, 90th percentile, largest) and in all.

The uniform walks of ``bench/grammar_backends_fill.py`` leave rows early in the schema; this
walk reaches the states an engine's rows reach (long strings of the tokens the model favours),
where the backends' costs differ otherwise.

    .venv/bin/python bench/grammar_greedy_walk.py --rows 16 --steps 150 --threads 2
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from grammar_backends_fill import installed_backends  # noqa: E402
from grammar_fill_micro import SCHEMA, synthetic_info  # noqa: E402


def walk(backend, compiled, rows: int, steps: int, seed: int) -> list[tuple[float, int]]:
    """(seconds, rows filled) of each step's fill along the greedy walk."""
    from tallow.kernels.token_bitmask import apply_token_bitmask

    info = backend.tokenizer
    matchers = [backend.matcher(compiled) for _ in range(rows)]
    generator = torch.Generator().manual_seed(seed)
    bias = torch.randn(info.vocab_size, generator=generator)
    masks = torch.empty(rows, info.bitmask_words, dtype=torch.int32)
    fills = []
    for _ in range(steps):
        live = [m for m in matchers if not m.is_terminated()]
        if not live:
            break
        started = time.perf_counter()
        backend.fill_bitmasks(live, masks, range(len(live)))
        fills.append((time.perf_counter() - started, len(live)))
        logits = bias + torch.randn(len(live), info.vocab_size, generator=generator)
        apply_token_bitmask(logits, masks[: len(live)])
        accepted = backend.accept_tokens(live, logits.argmax(-1).tolist())
        if not all(accepted):
            raise AssertionError("a backend refused a token its own mask allowed")
    return fills


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    from tallow.plugin import GrammarSpec

    info = synthetic_info()
    spec = GrammarSpec.json_schema(json.loads(SCHEMA.read_text()))
    for distribution, backend, _ in installed_backends(info, args.threads):
        fills = walk(backend, backend.compile(spec), args.rows, args.steps, args.seed)
        per_row = sorted(1e3 * seconds / rows for seconds, rows in fills)
        print(
            f"{distribution}: {len(fills)} steps, fill ms per row per step: median "
            f"{per_row[len(per_row) // 2]:.3f}, p90 {per_row[int(0.9 * len(per_row))]:.3f}, "
            f"largest {per_row[-1]:.3f}; all fills {sum(s for s, _ in fills):.2f} s"
        )


if __name__ == "__main__":
    main()
