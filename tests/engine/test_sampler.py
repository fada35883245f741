"""The sampler against independent oracles: argmax, Hugging Face's logits processors/warpers,
hand-checked penalty semantics, and the distribution it should sample from."""

from __future__ import annotations

import math

import pytest
import torch
from transformers.generation.logits_process import (
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from tallow.engine.errors import InvalidParameter
from tallow import SamplingParams
from tallow.engine.sampling import (
    RowParams,
    Sampler,
    SamplingBatch,
    apply_min_p,
    apply_top_k,
    apply_top_p,
)
from tallow.kernels.gumbel import gumbel_noise_ref, log_f32, row_keys
from tallow.kernels.sampling import apply_logit_edits_ref


def params(**kw) -> SamplingParams:
    return SamplingParams(**kw)


def row(p=None, out=(), prompt=(), step=None) -> RowParams:
    """A row whose effective seed is its params' seed (as for the first completion)."""
    p = p or params()
    out = list(out)
    return RowParams(
        params=p,
        output_token_ids=out,
        prompt_token_ids=list(prompt),
        seed=p.seed,
        step=len(out) if step is None else step,
    )


def sample(logits: torch.Tensor, rows: list[RowParams], eos=None, generator=None):
    batch = SamplingBatch.build(
        rows, logits.shape[1], logits.device, eos_token_ids=eos, generator=generator
    )
    return Sampler()(logits, batch), batch


def processed_logits(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    out = logits.clone()
    apply_logit_edits_ref(out, batch.edits)
    return out


# --- greedy ------------------------------------------------------------------------------


def test_greedy_is_argmax():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 300, generator=g)
    out, _ = sample(logits, [row(params(temperature=0.0)) for _ in range(6)])
    assert torch.equal(out.token_ids, logits.argmax(dim=-1))
    assert out.logprobs is None and out.top_ids is None and out.ranks is None


def test_greedy_ignores_filters_and_follows_bias():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 50, generator=g)
    target = int(logits[0].argmin())
    rows = [
        row(params(temperature=0.0, top_k=3, top_p=0.5, logit_bias={target: 100.0})),
        row(params(temperature=0.0, min_p=0.9)),
    ]
    out, _ = sample(logits, rows)
    assert out.token_ids.tolist() == [target, int(logits[1].argmax())]


# --- filters against Hugging Face's warpers --------------------------------------------------


@pytest.mark.parametrize("vocab", [40, 3000])
def test_top_k_matches_hf(vocab):
    g = torch.Generator().manual_seed(2)
    scores = torch.randn(5, vocab, generator=g) * 3
    ks = torch.tensor([1, 2, 7, 33, vocab])
    ours = apply_top_k(scores, ks)
    for i, k in enumerate(ks.tolist()):
        ref = TopKLogitsWarper(top_k=k)(None, scores[i : i + 1].clone())[0]
        assert torch.equal(torch.isinf(ours[i]), torch.isinf(ref)), f"row {i} k={k}"
        assert torch.equal(ours[i][torch.isfinite(ours[i])], scores[i][torch.isfinite(ref)])


@pytest.mark.parametrize("vocab,scale", [(40, 3.0), (5000, 3.0), (5000, 0.05)])
def test_top_p_matches_hf(vocab, scale):
    # scale 0.05 makes the distribution nearly flat, so the best 1024 tokens hold less than p
    # and the full-sort path runs.
    g = torch.Generator().manual_seed(3)
    scores = torch.randn(4, vocab, generator=g) * scale
    ps = torch.tensor([0.05, 0.5, 0.9, 0.99])
    ours = apply_top_p(scores, ps)
    for i, p in enumerate(ps.tolist()):
        ref = TopPLogitsWarper(top_p=p)(None, scores[i : i + 1].clone())[0]
        kept_ours, kept_ref = torch.isfinite(ours[i]), torch.isfinite(ref)
        assert kept_ours.sum() >= 1
        assert torch.equal(kept_ours, kept_ref), (
            f"row {i} p={p}: kept {int(kept_ours.sum())} vs {int(kept_ref.sum())}"
        )


def test_min_p_matches_hf():
    g = torch.Generator().manual_seed(4)
    scores = torch.randn(4, 500, generator=g) * 2
    mps = torch.tensor([0.01, 0.1, 0.5, 1.0])
    ours = apply_min_p(scores, mps)
    for i, mp in enumerate(mps.tolist()):
        ref = MinPLogitsWarper(min_p=mp)(None, scores[i : i + 1].clone())[0]
        assert torch.equal(torch.isfinite(ours[i]), torch.isfinite(ref)), f"row {i} min_p={mp}"


# --- penalties, bias, min_tokens ----------------------------------------------------------


@pytest.mark.parametrize("penalty", [1.3, 0.7])
def test_repetition_penalty_matches_hf(penalty):
    g = torch.Generator().manual_seed(5)
    vocab = 64
    logits = torch.randn(3, vocab, generator=g) * 4
    prompts = [[1, 2, 3, 3, 9], [10, 11], []]
    outs = [[4, 4, 50], [], [7, 8, 7]]
    rows = [row(params(repetition_penalty=penalty), out=o, prompt=p) for p, o in zip(prompts, outs)]
    batch = SamplingBatch.build(rows, vocab, "cpu")
    ours = processed_logits(logits, batch)
    hf = RepetitionPenaltyLogitsProcessor(penalty=penalty)
    for i in range(3):
        ids = torch.tensor([prompts[i] + outs[i]], dtype=torch.long)
        ref = hf(ids, logits[i : i + 1].clone())[0] if ids.numel() else logits[i]
        torch.testing.assert_close(ours[i], ref, rtol=1e-6, atol=0)
    # A penalty of 1 changes nothing and produces no edits.
    assert SamplingBatch.build([row(out=[1, 2], prompt=[3])], vocab, "cpu").edits.num_entries == 0


def test_frequency_and_presence_penalties():
    vocab = 20
    logits = torch.linspace(-3, 3, vocab).repeat(2, 1)
    rows = [
        row(
            params(frequency_penalty=0.5, presence_penalty=0.25), out=[2, 2, 2, 5], prompt=[7, 7, 2]
        ),
        row(params(frequency_penalty=-1.0), out=[3]),
    ]
    batch = SamplingBatch.build(rows, vocab, "cpu")
    ours = processed_logits(logits, batch)
    expected = logits.clone()
    expected[0, 2] -= 3 * 0.5 + 0.25  # three occurrences in the output
    expected[0, 5] -= 1 * 0.5 + 0.25
    expected[1, 3] += 1.0  # negative penalty rewards repetition
    # prompt-only tokens (7) are untouched by frequency/presence penalties
    torch.testing.assert_close(ours, expected, rtol=0, atol=1e-6)


def test_logit_bias_and_order_with_repetition():
    vocab = 10
    logits = torch.tensor([[1.0, -1.0, 2.0, 0.5, 0, 0, 0, 0, 0, 0]])
    # bias is applied before the repetition penalty: token 1 becomes -1 + 3 = 2 > 0 → 2 / 2
    rows = [row(params(logit_bias={1: 3.0, 2: -5.0}, repetition_penalty=2.0), out=[1, 2])]
    ours = processed_logits(logits, SamplingBatch.build(rows, vocab, "cpu"))
    assert ours[0, 1].item() == pytest.approx(1.0)
    assert ours[0, 2].item() == pytest.approx((2.0 - 5.0) * 2.0)
    assert ours[0, 3].item() == 0.5


def test_min_tokens_masks_eos_and_stop_ids():
    vocab = 30
    logits = torch.zeros(4, vocab)
    logits[:, 0] = 50.0  # EOS would win
    logits[:, 5] = 40.0  # a stop token, next best
    stop = [5]
    rows = [
        row(params(temperature=0.0, min_tokens=3, stop_token_ids=stop), out=[1]),
        row(params(temperature=0.0, min_tokens=3, stop_token_ids=stop), out=[1, 2, 3]),
        row(params(temperature=0.0, min_tokens=3, stop_token_ids=stop, ignore_eos=True), out=[1]),
        row(params(temperature=0.8, min_tokens=2, seed=1), out=[]),
    ]
    out, _ = sample(logits, rows, eos={0})
    tokens = out.token_ids.tolist()
    assert tokens[0] not in (0, 5)
    assert tokens[1] == 0  # min_tokens reached: EOS allowed again
    assert tokens[2] == 0  # ignore_eos: EOS is not a stop token, so it is not masked
    assert tokens[3] == 5  # only EOS is masked for this row; 5 is then overwhelmingly likely


# --- seeded sampling ----------------------------------------------------------------------


def test_seeded_rows_independent_of_batch():
    g = torch.Generator().manual_seed(6)
    vocab = 1000
    base = torch.randn(vocab, generator=g)
    p = params(temperature=1.5, seed=1234)
    alone, _ = sample(base[None].clone(), [row(p, out=[1, 2, 3])])
    others = torch.randn(4, vocab, generator=g)
    logits = torch.cat([others[:2], base[None], others[2:]])
    rows = [
        row(params(temperature=1.0)),
        row(params(temperature=0.0)),
        row(p, out=[1, 2, 3]),
        row(params(top_k=5, seed=9)),
        row(params(top_p=0.5)),
    ]
    mixed, _ = sample(logits, rows)
    assert mixed.token_ids[2] == alone.token_ids[0]
    # A filter that keeps everything takes the filtered path and still agrees.
    same, _ = sample(
        base[None].clone(), [row(params(temperature=1.5, seed=1234, top_k=vocab), out=[1, 2, 3])]
    )
    assert same.token_ids[0] == alone.token_ids[0]


def test_seeded_rows_reproducible_and_vary_with_step():
    g = torch.Generator().manual_seed(7)
    logits = torch.randn(1, 64, generator=g)
    p = params(temperature=2.0, seed=42)
    firsts = [int(sample(logits, [row(p, step=s)])[0].token_ids[0]) for s in range(40)]
    again = [int(sample(logits, [row(p, step=s)])[0].token_ids[0]) for s in range(40)]
    assert firsts == again
    assert len(set(firsts)) > 5  # different steps draw different noise
    other_seed = [
        int(sample(logits, [row(params(temperature=2.0, seed=43), step=s)])[0].token_ids[0])
        for s in range(40)
    ]
    assert other_seed != firsts


def test_unseeded_rows_follow_the_generator():
    logits = torch.zeros(8, 1000)
    rows = [row(params(temperature=1.0)) for _ in range(8)]
    a, _ = sample(logits, rows, generator=torch.Generator().manual_seed(1))
    b, _ = sample(logits, rows, generator=torch.Generator().manual_seed(1))
    c, _ = sample(logits, rows, generator=torch.Generator().manual_seed(2))
    assert torch.equal(a.token_ids, b.token_ids)
    assert not torch.equal(a.token_ids, c.token_ids)
    assert len(set(a.token_ids.tolist())) > 1  # rows do not share noise


# --- distribution -------------------------------------------------------------------------


def _expected_probs(logits: torch.Tensor, t: float, k: int, p: float, mp: float) -> torch.Tensor:
    s = logits[None] / t
    if k:
        s = TopKLogitsWarper(top_k=k)(None, s)
    if p < 1:
        s = TopPLogitsWarper(top_p=p)(None, s)
    if mp > 0:
        s = MinPLogitsWarper(min_p=mp)(None, s)
    return torch.softmax(s[0].double(), dim=-1)


def _chi_square_ok(counts: torch.Tensor, probs: torch.Tensor, draws: int) -> tuple[bool, str]:
    """Pearson's chi-square over the tokens with positive probability, against a critical value
    far in the tail (p ~ 1e-4, Wilson–Hilferty), plus no draws of zero-probability tokens."""
    support = probs > 0
    if counts[~support].sum() > 0:
        return False, f"sampled removed tokens: {counts[~support].nonzero().flatten().tolist()}"
    expected = probs[support] * draws
    chi2 = float(((counts[support].double() - expected) ** 2 / expected).sum())
    dof = int(support.sum()) - 1
    z = 3.72  # one-sided 1e-4
    crit = dof * (1 - 2 / (9 * dof) + z * math.sqrt(2 / (9 * dof))) ** 3
    return chi2 < crit, f"chi2={chi2:.1f} crit={crit:.1f} dof={dof}"


@pytest.mark.parametrize(
    "t,k,p,mp",
    [
        (1.0, 0, 1.0, 0.0),
        (0.7, 6, 1.0, 0.0),
        (1.3, 0, 0.8, 0.0),
        (1.0, 0, 1.0, 0.1),
        (0.9, 8, 0.9, 0.05),
    ],
)
def test_sampled_frequencies_match_distribution(t, k, p, mp):
    g = torch.Generator().manual_seed(8)
    vocab, draws = 12, 20000
    logits = torch.randn(vocab, generator=g) * 1.5
    probs = _expected_probs(logits, t, k, p, mp)
    rows = [
        row(params(temperature=t, top_k=k, top_p=p, min_p=mp, seed=1000 + i)) for i in range(draws)
    ]
    out, _ = sample(logits.repeat(draws, 1), rows)
    counts = torch.bincount(out.token_ids, minlength=vocab)
    ok, msg = _chi_square_ok(counts, probs, draws)
    assert ok, msg


def test_one_seeded_row_over_steps_matches_distribution():
    # The per-step noise of one seeded stream is as good as independent draws.
    g = torch.Generator().manual_seed(9)
    vocab, draws = 10, 8000
    logits = torch.randn(vocab, generator=g)
    p = params(temperature=1.0, seed=77)
    rows = [row(p, step=s) for s in range(draws)]
    out, _ = sample(logits.repeat(draws, 1), rows)
    counts = torch.bincount(out.token_ids, minlength=vocab)
    ok, msg = _chi_square_ok(counts, torch.softmax(logits.double(), -1), draws)
    assert ok, msg


# --- logprobs -----------------------------------------------------------------------------


def test_logprobs_ranks_and_top_alternatives():
    g = torch.Generator().manual_seed(10)
    logits = torch.randn(3, 200, generator=g)
    rows = [
        row(
            params(temperature=1.0, seed=3, logprobs=5, repetition_penalty=1.5),
            out=[int(logits[0].argmax())],
        ),
        row(params(temperature=0.0, logprobs=0)),
        row(params(temperature=1.0, seed=4)),
    ]
    out, _ = sample(logits, rows)
    raw = torch.log_softmax(logits, dim=-1)  # of the unprocessed logits
    tok = out.token_ids
    torch.testing.assert_close(out.logprobs, raw[torch.arange(3), tok])
    for i in range(3):
        order = torch.argsort(raw[i], descending=True).tolist()
        assert out.ranks[i].item() == order.index(int(tok[i])) + 1
    assert out.top_ids.shape == (3, 5)
    top = torch.topk(raw, 5, dim=-1)
    assert torch.equal(out.top_ids, top.indices)
    torch.testing.assert_close(out.top_logprobs, top.values)
    assert out.ranks[1].item() == 1  # greedy picks the top token


# --- noise --------------------------------------------------------------------------------


def test_log_f32_accuracy():
    g = torch.Generator().manual_seed(11)
    x = torch.cat(
        [
            torch.rand(10000, generator=g) * 50 + 1e-3,
            1 - torch.rand(1000, generator=g) * 1e-5,
            torch.rand(1000, generator=g) * 1e-7 + 1e-8,
        ]
    )
    torch.testing.assert_close(log_f32(x), torch.log(x), rtol=2e-6, atol=2e-6)


def test_gumbel_noise_moments_and_keys():
    k1, k2 = zip(*[row_keys(s, 3) for s in (0, 1, 2**40 + 5, -7)])
    noise = gumbel_noise_ref(torch.tensor(k1), torch.tensor(k2), 100000)
    assert torch.allclose(noise.mean(dim=1), torch.full((4,), 0.5772), atol=0.02)
    assert torch.allclose(noise.var(dim=1), torch.full((4,), math.pi**2 / 6), atol=0.05)
    assert row_keys(5, 0) != row_keys(5, 1) != row_keys(6, 1)


# --- bad input ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kw,field_name",
    [
        (dict(top_p=0.0), "top_p"),
        (dict(min_p=1.5), "min_p"),
        (dict(top_k=-3), "top_k"),
        (dict(repetition_penalty=0.0), "repetition_penalty"),
    ],
)
def test_bad_params_are_refused_where_they_are_built(kw, field_name):
    """Parameters are checked once, by SamplingParams; no sampler ever sees a bad one."""
    with pytest.raises(InvalidParameter, match=field_name) as info:
        SamplingParams(**kw)
    assert info.value.field == field_name


@pytest.mark.parametrize(
    "kw,field_name",
    [
        (dict(logit_bias={99: 1.0}), "logit_bias"),
        (dict(min_tokens=1, stop_token_ids=[1000]), "stop_token_ids"),
    ],
)
def test_token_ids_outside_the_vocabulary_are_refused_at_the_door(kw, field_name):
    with pytest.raises(InvalidParameter, match=field_name):
        SamplingParams(**kw).validate_vocab(50)


def test_logits_shape_checked():
    batch = SamplingBatch.build([row()], 50, "cpu")
    with pytest.raises(ValueError, match="logits"):
        Sampler()(torch.zeros(2, 50), batch)


@pytest.mark.parametrize(
    "out,prompt,field_name",
    [([5, 70], [1], "output_token_ids"), ([5], [1, -2], "prompt_token_ids")],
)
def test_bad_token_ids_name_the_field(out, prompt, field_name):
    p = params(frequency_penalty=0.5, repetition_penalty=1.2)
    with pytest.raises(ValueError, match=field_name):
        SamplingBatch.build([row(p, out=out, prompt=prompt)], 50, "cpu")


def test_edits_are_unique_and_merged():
    """A token named by several sources gets one entry carrying all of them."""
    p = params(
        logit_bias={4: 1.5},
        min_tokens=5,
        stop_token_ids=[4, 9],
        repetition_penalty=1.3,
        frequency_penalty=0.5,
    )
    batch = SamplingBatch.build(
        [row(p, out=[4, 4, 7], prompt=[4, 8]), row(params(), out=[4])], 20, "cpu", eos_token_ids={9}
    )
    e = batch.edits
    pairs = list(zip(e.rows.tolist(), e.tokens.tolist()))
    assert pairs == [(0, 4), (0, 7), (0, 8), (0, 9)]  # the plain second row needs none
    assert e.bias.tolist() == [1.5, 0.0, 0.0, 0.0]
    assert e.masked.tolist() == [True, False, False, True]
    assert e.counts.tolist() == [2.0, 1.0, 0.0, 0.0]
    assert e.in_rep.tolist() == [True, True, True, False]
