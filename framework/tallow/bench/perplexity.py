"""`tallow bench perplexity`: perplexity of a text under the served model, strided windows.

The text is tokenized once and cut into windows of ``--ctx`` tokens that advance by
``--stride`` tokens. Each window goes through the engine as one prompt with
``prompt_logprobs`` — the path a served ``echo``/``prompt_logprobs`` request takes, weights
and KV codec included — and only the tokens that the previous window did not score are scored
here, so every token after the first is scored exactly once, with up to ``ctx - stride``
tokens of context before the window's scored part (the standard strided perplexity).

Perplexity is ``exp(mean NLL)`` over the scored tokens; its standard error comes from the
spread of the per-token NLLs (delta method: ``ppl * std(nll) / sqrt(n)``).
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tallow.config import TallowConfig
    from tallow.engine.llm_engine import LLMEngine
    from tallow.engine.outputs import RequestOutput

from tallow.engine.corpora import CorpusError, corpus_text
from tallow.engine.sampling.params import SamplingParams


class BenchInputError(ValueError):
    """The text or the window settings cannot be used (reported without a traceback)."""


# ---------------------------------------------------------------------------------------------
# Windows
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Window:
    """Tokens ``[begin, end)`` go in as one prompt; tokens ``[score_from, end)`` are scored."""

    begin: int
    end: int
    score_from: int


def windows(num_tokens: int, ctx: int, stride: int) -> list[Window]:
    """Windows of up to ``ctx`` tokens over ``num_tokens`` tokens. The first scores its tokens
    1 .. ctx-1; each later one starts ``ctx - stride`` tokens (at least one) before the first
    token not yet scored, keeps those as context and scores the rest. So token ``i >= 1`` is
    scored in exactly one window, with at least ``min(i, ctx - stride)`` tokens before it, and
    token 0, which has no context, in none."""
    if ctx < 2:
        raise BenchInputError(f"--ctx must be at least 2 tokens, got {ctx}")
    if not 1 <= stride <= ctx:
        raise BenchInputError(f"--stride must be between 1 and --ctx ({ctx}), got {stride}")
    overlap = max(1, ctx - stride)
    out: list[Window] = []
    scored_to = 1
    while scored_to < num_tokens:
        begin = scored_to - overlap if out else 0
        end = min(begin + ctx, num_tokens)
        out.append(Window(begin, end, scored_to))
        scored_to = end
    return out


def window_nlls(engine: LLMEngine, tokens: list[int], window: Window) -> list[float]:
    """NLL of each token of ``window``'s scored part, from the engine's prompt logprobs."""
    return score_windows(engine, tokens, [window])


def _scored_nlls(out: RequestOutput, prompt: list[int], window: Window) -> list[float]:
    if out.prompt_logprobs is None:
        raise RuntimeError("the engine returned no prompt logprobs for a perplexity window")
    nlls = []
    for pos in range(window.score_from - window.begin, len(prompt)):
        entry = out.prompt_logprobs[pos]
        if entry is None or prompt[pos] not in entry:
            raise RuntimeError(f"no logprob for prompt position {pos} of a window")
        nlls.append(-float(entry[prompt[pos]].logprob))
    return nlls


def score_windows(
    engine: LLMEngine, tokens: list[int], plan: list[Window], batch: int = 1
) -> list[float]:
    """NLLs of the scored tokens of every window of ``plan``, in text order, with up to
    ``batch`` windows in the engine at once (they share its steps as any requests do)."""
    if batch < 1:
        raise BenchInputError(f"--batch must be at least 1, got {batch}")
    params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0)
    results: dict[int, list[float]] = {}
    pending: dict[str, int] = {}
    next_window = 0
    while next_window < len(plan) or pending:
        while next_window < len(plan) and len(pending) < batch:
            w = plan[next_window]
            rid = engine.next_request_id()
            engine.add_request(rid, tokens[w.begin : w.end], params, stream=False)
            pending[rid] = next_window
            next_window += 1
        if not engine.has_unfinished():
            raise RuntimeError("the engine finished without returning every perplexity window")
        for out in engine.step():
            if out.finished and out.request_id in pending:
                k = pending.pop(out.request_id)
                w = plan[k]
                results[k] = _scored_nlls(out, tokens[w.begin : w.end], w)
    return [nll for k in range(len(plan)) for nll in results[k]]


def summarize(nlls: list[float]) -> dict[str, float]:
    """Mean NLL, perplexity and their standard errors over per-token NLLs."""
    n = len(nlls)
    mean = statistics.fmean(nlls)
    se = statistics.stdev(nlls) / math.sqrt(n) if n > 1 else float("nan")
    ppl = math.exp(mean)
    return {"nll_mean": mean, "nll_stderr": se, "perplexity": ppl, "perplexity_stderr": ppl * se}


# ---------------------------------------------------------------------------------------------
# The benchmark
# ---------------------------------------------------------------------------------------------
def read_text(args: argparse.Namespace) -> tuple[str, str]:
    """(the text, a label of where it came from) from ``--text`` or ``--corpus``."""
    if args.text and args.corpus:
        raise BenchInputError("give either --text FILE or --corpus NAME, not both")
    if args.text:
        path = pathlib.Path(args.text)
        if not path.is_file():
            raise BenchInputError(f"--text {args.text!r}: no such file")
        return path.read_text(encoding="utf-8"), str(path)
    name = args.corpus or "shakespeare"
    try:
        return corpus_text(name), f"corpus:{name}"
    except CorpusError as exc:
        raise BenchInputError(f"--corpus {name}: {exc} (or pass --text FILE)") from None


def run(args: argparse.Namespace, config: TallowConfig) -> dict[str, Any]:
    import time

    import torch

    from .common import build_engine

    if args.max_tokens is not None and args.max_tokens < 2:
        raise BenchInputError(f"--max-tokens must be at least 2, got {args.max_tokens}")
    text, source = read_text(args)
    engine = build_engine(config)
    tokens = engine.tokenizer.encode(text)
    if args.max_tokens is not None:
        tokens = tokens[: args.max_tokens]
    stride = args.stride or max(1, args.ctx // 2)
    plan = windows(len(tokens), args.ctx, stride)
    if not plan:
        raise BenchInputError(f"the text has {len(tokens)} token(s): nothing to score")
    started = time.perf_counter()
    nlls = score_windows(engine, tokens, plan, getattr(args, "batch", 1) or 1)
    elapsed = time.perf_counter() - started
    if getattr(args, "token_nlls", None):
        pathlib.Path(args.token_nlls).write_text(json.dumps(nlls))
    parts = engine.parts
    return {
        "model": parts.loaded.checkpoint.source,
        "text": source,
        "dtype": str(parts.loaded.dtype).replace("torch.", ""),
        "device": (
            torch.cuda.get_device_name(parts.loaded.device)
            if parts.loaded.device.type == "cuda"
            else "cpu"
        ),
        "kv_codec": config.cache.kv_codec,
        "ctx": args.ctx,
        "stride": stride,
        "batch": getattr(args, "batch", 1) or 1,
        "text_tokens": len(tokens),
        "windows": len(plan),
        "tokens_scored": len(nlls),
        **summarize(nlls),
        "elapsed_s": elapsed,
        "tokens_per_s": len(nlls) / elapsed,
    }


def rows(r: dict[str, Any]) -> list[tuple[str, Any]]:
    return [
        ("model", r["model"]),
        ("text", r["text"]),
        ("device", r["device"]),
        ("dtype", r["dtype"]),
        ("KV codec", r["kv_codec"]),
        ("context / stride", f"{r['ctx']} / {r['stride']}"),
        ("windows (in flight)", f"{r['windows']} ({r['batch']})"),
        ("tokens scored", r["tokens_scored"]),
        ("perplexity", f"{r['perplexity']:.4f} ± {r['perplexity_stderr']:.4f}"),
        ("mean NLL (nats)", f"{r['nll_mean']:.5f} ± {r['nll_stderr']:.5f}"),
        ("time (s)", r["elapsed_s"]),
        ("tokens scored / s", r["tokens_per_s"]),
    ]
