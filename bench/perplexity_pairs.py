"""Paired comparison of `tallow bench perplexity --token-nlls` runs on the same text.

    python bench/perplexity_pairs.py BASELINE.nlls.json NAME=OTHER.nlls.json ...

Prints a markdown table: each run's perplexity, and its change against the baseline with the
standard error of that change. The change is computed per token (the same tokens in the same
windows), so most of the text's own variance cancels: ``exp(mean(nll_run - nll_base)) - 1``,
standard error ``exp(mean d) * std(d) / sqrt(n)``.
"""

from __future__ import annotations

import json
import math
import statistics
import sys


def load(path: str) -> list[float]:
    with open(path) as f:
        return [float(v) for v in json.load(f)]


def row(name: str, nlls: list[float], base: list[float]) -> str:
    if len(nlls) != len(base):
        raise SystemExit(
            f"{name}: {len(nlls)} tokens, the baseline has {len(base)}; the runs "
            "must score the same text with the same windows"
        )
    ppl = math.exp(statistics.fmean(nlls))
    diffs = [a - b for a, b in zip(nlls, base)]
    mean = statistics.fmean(diffs)
    change = math.exp(mean) - 1
    stderr = math.exp(mean) * statistics.stdev(diffs) / math.sqrt(len(diffs))
    return f"| {name} | {ppl:.3f} | {100 * change:+.2f} % ± {100 * stderr:.2f} % |"


def main(argv: list[str]) -> None:
    if len(argv) < 2:
        raise SystemExit(__doc__)
    base = load(argv[0])
    print("| run | perplexity | change vs baseline (± s.e., paired) |")
    print("|---|---|---|")
    print(f"| baseline | {math.exp(statistics.fmean(base)):.3f} | — |")
    for item in argv[1:]:
        name, _, path = item.partition("=")
        print(row(name, load(path), base))


if __name__ == "__main__":
    main(sys.argv[1:])
