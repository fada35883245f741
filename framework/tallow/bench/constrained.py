"""`tallow bench throughput --json-schema FILE`: what constraining outputs to a JSON Schema costs.

One engine runs the same prompts twice. First constrained: greedy, up to ``--output-len``
tokens, each output ending where its grammar ends. Then unconstrained: each prompt asked for
exactly as many tokens as its constrained twin produced (``ignore_eos``), so both runs compute
the same tokens in batches of the same shapes and the ratio of their rates is the cost of the
grammars — filling masks on the host, copying them, masking on the device, and the sampling
that waits for the masks. The time spent filling masks per step (on the grammar thread) is
reported too, and how much of it the engine thread waited for.

A ``random:`` model gets a synthetic byte-level vocabulary of its size
(:mod:`tallow.bench.synthetic_vocab`): its own tokens have no bytes for a grammar to match.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .common import build_engine, input_prompts, last_step, now, quantization, sync
from .synthetic_vocab import write_tokenizer

if TYPE_CHECKING:
    from tallow.config import TallowConfig
    from tallow.engine.llm_engine import LLMEngine


def _timed(engine: LLMEngine, prompts: list[list[int]], params: list[Any]) -> dict[str, Any]:
    """Run ``prompts`` with ``params`` to the end: elapsed seconds, steps, outputs."""
    device = engine.parts.loaded.device
    sync(device)
    start = now()
    ids = []
    for prompt, p in zip(prompts, params):
        ids.append(engine.next_request_id())
        engine.add_request(ids[-1], prompt, p, stream=False)
    steps = 0
    done: dict[str, Any] = {}
    phases: dict[str, float] = {}
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out.outputs[0]
        steps += 1
        for key, value in last_step(engine).timings.items():
            phases[key] = phases.get(key, 0.0) + value
    sync(device)
    elapsed = now() - start
    outputs = [done[i] for i in ids]
    tokens = sum(len(o.token_ids) for o in outputs)
    return {
        "elapsed_s": elapsed,
        "steps": steps,
        "output_tokens": tokens,
        "output_tok_s": tokens / elapsed,
        "outputs": outputs,
        "phases_ms": {k: 1e3 * v / max(1, steps) for k, v in phases.items()},
    }


def _validate(outputs: list[Any], schema: object) -> tuple[int, list[str]]:
    """How many outputs parse and validate against ``schema``, and why each output that its
    grammar ended (finish reason "stop") does not: its text and the first problem found."""
    import jsonschema

    validator = jsonschema.Draft202012Validator(
        schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
    )
    count = 0
    problems = []
    for out in outputs:
        try:
            error = jsonschema.exceptions.best_match(validator.iter_errors(json.loads(out.text)))
            why = (
                None
                if error is None
                else (f"{error.message} at {error.json_path} ({error.validator})")
            )
        except ValueError as exc:
            why = f"not JSON: {exc}"
        count += why is None
        if why is not None and out.finish_reason == "stop":
            problems.append(f"{why}; text {out.text[:400]!r}")
    return count, problems


def run(args: argparse.Namespace, config: TallowConfig) -> dict[str, Any]:
    from tallow.engine.sampling.params import SamplingParams
    from tallow.plugin import GrammarSpec

    schema = json.loads(Path(args.json_schema).read_text())
    source = config.model.source or ""
    with tempfile.TemporaryDirectory() as scratch:
        if source.startswith("random:") and not config.model.tokenizer:
            from tallow.engine.random_model import shape_config

            vocab = int(shape_config(source)["vocab_size"])
            config.model.tokenizer = str(write_tokenizer(Path(scratch) / "tokenizer", vocab))
        engine = build_engine(config)
    structured = engine.structured
    if structured is None or not structured.available:
        raise SystemExit(
            "tallow bench throughput --json-schema: "
            + (
                structured.unavailable
                if structured is not None
                else "the engine cannot constrain outputs"
            )
        )
    n = args.num_prompts
    _, prompts = input_prompts(args, engine.parts.core.runner.vocab_size)
    max_tokens = args.output_len or args.max_output_len or 512
    constrained = SamplingParams(
        temperature=0.0, max_tokens=max_tokens, structured_outputs=GrammarSpec.json_schema(schema)
    )
    started = now()
    structured.compile(GrammarSpec.json_schema(schema))  # a server compiles before admitting
    compile_s = now() - started
    # warm-up: kernels of both kinds of step compile before the clock starts
    _timed(engine, prompts[:4], [constrained] * 4)
    _timed(
        engine, prompts[:4], [SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)] * 4
    )
    before = structured.stats()
    with_grammar = _timed(engine, prompts, [constrained] * n)
    after = structured.stats()
    lengths = [max(1, len(o.token_ids)) for o in with_grammar["outputs"]]
    free = _timed(
        engine,
        prompts,
        [SamplingParams(temperature=0.0, max_tokens=k, ignore_eos=True) for k in lengths],
    )
    mask_steps = after["grammar_mask_steps_total"] - before["grammar_mask_steps_total"]
    mask_s = after["grammar_mask_seconds_total"] - before["grammar_mask_seconds_total"]
    wait_s = after["grammar_mask_wait_seconds_total"] - before["grammar_mask_wait_seconds_total"]
    stopped = sum(o.finish_reason == "stop" for o in with_grammar["outputs"])
    valid, problems = _validate(with_grammar["outputs"], schema)
    parts = engine.parts
    assert structured.entry is not None  # available: a grammar backend was chosen
    return {
        "model": config.model.source,
        "quantization": quantization(parts),
        "attention_backend": parts.attention_backend,
        "cuda_graphs": parts.core.runner.graphs is not None,
        "num_prompts": n,
        "json_schema": str(args.json_schema),
        "grammar_backend": structured.entry.name,
        "compile_s": compile_s,
        "max_tokens": max_tokens,
        "output_tokens": with_grammar["output_tokens"],
        "constrained_tok_s": with_grammar["output_tok_s"],
        "unconstrained_tok_s": free["output_tok_s"],
        "constrained_vs_unconstrained": with_grammar["output_tok_s"] / free["output_tok_s"],
        "constrained_steps": with_grammar["steps"],
        "unconstrained_steps": free["steps"],
        "mask_ms_per_step": 1e3 * mask_s / max(1, mask_steps),
        # what of it the engine thread waited for (the rest ran beside its other work)
        "mask_wait_ms_per_step": 1e3 * wait_s / max(1, mask_steps),
        "mask_rows_per_step": (after["grammar_mask_rows_total"] - before["grammar_mask_rows_total"])
        / max(1, mask_steps),
        "outputs_ended_by_grammar": stopped,
        "outputs_valid": valid,
        # mean host milliseconds per engine step in each phase (tallow.engine.core): where a
        # constrained step's extra time goes
        "step_phases_ms": {
            "constrained": with_grammar["phases_ms"],
            "unconstrained": free["phases_ms"],
        },
        "invalid_ended_by_grammar": problems,
    }


def rows(r: dict[str, Any]) -> list[tuple[str, Any]]:
    return [
        ("model", r["model"]),
        ("quantization", r["quantization"]),
        ("attention backend", r["attention_backend"]),
        ("CUDA graphs", r["cuda_graphs"]),
        ("prompts", r["num_prompts"]),
        ("JSON Schema", r["json_schema"]),
        ("grammar backend", r["grammar_backend"]),
        ("compile (s)", r["compile_s"]),
        ("output tokens (each run)", r["output_tokens"]),
        ("constrained output tok/s", r["constrained_tok_s"]),
        ("unconstrained output tok/s", r["unconstrained_tok_s"]),
        ("constrained / unconstrained", r["constrained_vs_unconstrained"]),
        (
            "engine steps (constrained, unconstrained)",
            f"{r['constrained_steps']}, {r['unconstrained_steps']}",
        ),
        ("mask fill per step (ms)", r["mask_ms_per_step"]),
        ("engine thread's wait for the masks per step (ms)", r["mask_wait_ms_per_step"]),
        ("constrained rows per step", r["mask_rows_per_step"]),
        ("outputs ended by their grammar", r["outputs_ended_by_grammar"]),
        ("outputs valid against the schema", r["outputs_valid"]),
        *(
            (
                f"ms per step in {phase} (constrained, unconstrained)",
                f"{ms:.2f}, {r['step_phases_ms']['unconstrained'].get(phase, 0.0):.2f}",
            )
            for phase, ms in r.get("step_phases_ms", {}).get("constrained", {}).items()
        ),
        *(
            (f"ended by its grammar, invalid ({i + 1})", why)
            for i, why in enumerate(r.get("invalid_ended_by_grammar", [])[:5])
        ),
    ]
