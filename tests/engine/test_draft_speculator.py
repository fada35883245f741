"""The draft-model speculator (``speculative.method: draft``) on CPU with tiny random models that
share a byte-level BPE tokenizer: greedy outputs equal those without speculation, with the
target itself as draft (every guess kept) and with a smaller draft of other weights; rolling back
to what the target kept gives the same guesses as computing from scratch; sampled guesses carry
the draft's distribution (checked against transformers on the draft's weights) into the verify
step; a full draft cache proposes nothing; aborts and preemption leave no block behind in
either cache; and a draft of another tokenizer, or bad settings, stop start-up with a clear
error."""

from __future__ import annotations

import json
import random
import shutil

import pytest
import torch

from tallow import LLM, SamplingParams, StructuredOutputsParams
from tallow.engine.kv_manager import KVCacheManager, PagedGroupSize
from tallow.plugin import SpeculationContext
from tallow.plugin.testing.seeds import seed_of as seed_of_case

from tiny_models import save_tiny

PROMPTS = [
    "The quick brown fox",
    "def add(a, b):\n    return",
    "Paged attention keeps the KV cache in blocks",
    "x",
]
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "age": {"type": "integer", "minimum": 0, "maximum": 99},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def small_draft(tmp_path_factory: pytest.TempPathFactory):
    """A draft of the tiny models' tokenizer with other weights (one narrower layer)."""
    return save_tiny(
        tmp_path_factory.mktemp("tiny-draft"),
        "llama",
        num_hidden_layers=1,
        hidden_size=32,
        intermediate_size=64,
    )


@pytest.fixture(scope="module")
def near_draft(tiny_llama, tmp_path_factory: pytest.TempPathFactory):
    """A draft close to the tiny target: its weights with a little noise added (it keeps about
    two guesses in three at temperature 0.5)."""
    from safetensors.torch import load_file, save_file

    path = tmp_path_factory.mktemp("near-draft") / "model"
    shutil.copytree(tiny_llama, path)
    weights = load_file(path / "model.safetensors")
    gen = torch.Generator().manual_seed(1)
    for name, w in weights.items():
        if w.dim() == 2:
            weights[name] = w + 0.02 * torch.randn(w.shape, generator=gen)
    save_file(weights, path / "model.safetensors", metadata={"format": "pt"})
    return path


def make(target, draft, k: int = 4, **kw) -> LLM:
    settings = dict(
        model=str(target),
        dtype="float32",
        device="cpu",
        num_blocks=256,
        block_size=4,
        max_model_len=256,
        speculative={
            "method": "draft",
            "draft_model": str(draft),
            "num_speculative_tokens": k,
            "draft_kv_cache_mb": 2,
        },
    )
    settings.update(kw)
    return LLM(**settings)


def encode(llm: LLM, texts: list[str]) -> list[list[int]]:
    tok = llm.get_tokenizer()
    return [tok.encode(t) for t in texts]


def token_ids(outs) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outs]


def plain_and_speculative(llm: LLM, prompts, params) -> tuple[list, list]:
    """Outputs of ``llm`` without its speculator, then with it (one engine, one load)."""
    core = llm.engine.core
    spec = core.spec
    core.enable_speculation(None)
    want = llm.generate(prompts, params)
    core.enable_speculation(spec)
    return want, llm.generate(prompts, params)


def draft_of(llm: LLM):
    return llm.engine.core.spec.speculator.draft


def assert_no_blocks_held(llm: LLM) -> None:
    bm = llm.engine.core.scheduler.block_manager
    assert bm.num_free_blocks == bm.num_total_blocks
    bm.check_invariants()
    draft = draft_of(llm)
    assert draft.num_sequences == 0
    assert draft.blocks.num_free_blocks == draft.blocks.num_total_blocks
    draft.blocks.check_invariants()


@pytest.mark.parametrize("which", ["self", "small"])
def test_greedy_outputs_equal_those_without_the_draft(tiny_llama, small_draft, which):
    draft = tiny_llama if which == "self" else small_draft
    # chunked prefill: the draft feeds long prompts in chunks of the same size
    llm = make(tiny_llama, draft, prefill_chunk_size=5)
    prompts = encode(llm, PROMPTS)
    plain = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    constrained = SamplingParams(
        temperature=0.0, max_tokens=40, structured_outputs=StructuredOutputsParams(json=SCHEMA)
    )
    speculator = llm.engine.core.spec.speculator
    batches: list[int] = []
    propose_batch = speculator.propose_batch

    def counting(requests):
        batches.append(len(requests))
        return propose_batch(requests)

    speculator.propose_batch = counting
    want, got = plain_and_speculative(llm, prompts, plain)
    assert token_ids(got) == token_ids(want)
    # every decoding sequence of a step is asked for in one batch
    assert max(batches) == len(prompts)
    spec = llm.engine.core.spec
    assert spec.num_proposals > 10
    if which == "self":  # the target guessing its own tokens: every guess is kept
        assert spec.acceptance_rate > 0.9
        assert spec.mean_accepted_length > 4.5
    else:
        assert spec.acceptance_rate < 0.5
    # a constrained output: the grammar refuses guesses the draft makes freely
    want, got = plain_and_speculative(llm, prompts[:2], constrained)
    assert token_ids(got) == token_ids(want)
    for out in got:
        json.loads(out.outputs[0].text)
    assert_no_blocks_held(llm)


def test_rollback_guesses_equal_a_fresh_computation(tiny_llama, small_draft):
    # k = 6 with chunks of 3: the prompt is fed in several chunks
    llm = make(tiny_llama, small_draft, k=6, max_num_batched_tokens=64, prefill_chunk_size=3)
    spec = llm.engine.core.spec.speculator
    fresh = make(tiny_llama, small_draft, k=6).engine.core.spec.speculator
    prompt = encode(llm, PROMPTS[2:3])[0]
    ctx = SpeculationContext("r", 0, len(prompt))
    first = spec.propose(prompt, 6, ctx).token_ids
    assert len(first) == 6
    seq = spec.draft.sequence("r", 0)
    assert seq.num_computed_tokens == len(prompt) + 5  # the last guess is never fed
    # the target kept two guesses and chose another third token
    other = (first[2] + 1) % 300
    kept = prompt + first[:2] + [other]
    blocks_before = spec.draft.blocks.num_free_blocks
    again = spec.propose(kept, 6, ctx).token_ids
    assert again == fresh.propose(kept, 6, SpeculationContext("f", 0, len(prompt))).token_ids
    assert seq.num_computed_tokens == len(kept) + 5
    assert seq.all_token_ids[: len(kept)] == kept
    assert spec.draft.blocks.num_free_blocks <= blocks_before + 1
    # a shorter sequence (the target was asked for less): rolled back further
    shorter = prompt + first[:1]
    assert (
        spec.propose(shorter, 2, ctx).token_ids
        == fresh.propose(shorter, 2, SpeculationContext("g", 0, len(prompt))).token_ids
    )
    spec.finished("r", 0)
    assert spec.draft.sequence("r", 0) is None
    assert spec.draft.blocks.num_free_blocks == spec.draft.blocks.num_total_blocks


def test_sampled_guesses_carry_the_drafts_distribution(tiny_llama, small_draft):
    from transformers import AutoModelForCausalLM

    llm = make(tiny_llama, small_draft, k=3)
    spec = llm.engine.core.spec.speculator
    prompt = encode(llm, PROMPTS[:1])[0]
    temperature = 0.7
    proposal = spec.propose(prompt, 3, SpeculationContext("s", 0, len(prompt), temperature))
    vocab = llm.engine.core.runner.vocab_size
    assert len(proposal.token_ids) == 3 and proposal.probs is not None
    assert tuple(proposal.probs.shape) == (3, vocab)
    # the oracle: transformers on the draft's weights, at each guessed prefix
    hf = AutoModelForCausalLM.from_pretrained(small_draft, dtype=torch.float32)
    ids = torch.tensor([prompt + proposal.token_ids])
    with torch.no_grad():
        logits = hf(ids).logits[0, len(prompt) - 1 : len(prompt) + 2].float()
    want = torch.softmax(logits / temperature, dim=-1)
    torch.testing.assert_close(proposal.probs.float(), want, atol=2e-5, rtol=1e-4)
    for j, t in enumerate(proposal.token_ids):
        assert proposal.probs[j, t] > 0
    spec.finished("s", 0)

    # through the engine: the probabilities reach the verify step
    core = llm.engine.core
    schedule = core.scheduler.schedule
    seen: list = []

    def recording():
        plan = schedule()
        seen.extend(item.draft_probs for item in plan.scheduled if item.draft_token_ids)
        return plan

    core.scheduler.schedule = recording
    params = SamplingParams(temperature=temperature, max_tokens=12, seed=3, ignore_eos=True)
    outs = llm.generate(encode(llm, PROMPTS), params)
    assert all(len(o.outputs[0].token_ids) == 12 for o in outs)
    assert seen and all(isinstance(p, torch.Tensor) and p.shape[1] == vocab for p in seen)
    assert_no_blocks_held(llm)


def test_a_full_draft_cache_proposes_nothing(tiny_llama, small_draft):
    llm = make(tiny_llama, small_draft, k=4)
    draft = draft_of(llm)
    # a pool of 12 blocks of 4 tokens: one sequence of the prompts below at a time
    draft.blocks = KVCacheManager([PagedGroupSize(12)], block_size=4, enable_prefix_caching=False)
    prompts = [p * 2 for p in encode(llm, PROMPTS[:3])]
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    want, got = plain_and_speculative(llm, prompts, params)
    assert token_ids(got) == token_ids(want)
    stats = llm.engine.core.stats()
    assert stats["spec_num_proposals"] > 0
    # some decode steps went without a proposal: fewer proposals than tokens past the first
    assert stats["spec_num_proposals"] < sum(len(o) - 1 for o in token_ids(got))
    assert_no_blocks_held(llm)


def test_preemption_and_aborts_mid_proposal_leave_no_blocks(tiny_llama, small_draft):
    base = make(tiny_llama, tiny_llama)
    base.engine.core.enable_speculation(None)
    prompts = [p * 3 for p in encode(base, PROMPTS)]
    params = SamplingParams(temperature=0.0, max_tokens=40)
    want = token_ids(base.generate(prompts, params))
    # a pool of about three sequences: proposals and preemption compete for blocks
    llm = make(tiny_llama, tiny_llama, k=5, num_blocks=24, max_model_len=96)
    core = llm.engine.core
    bm = core.scheduler.block_manager
    rng = random.Random(4)
    ids = [f"r{i}" for i in range(len(prompts))]
    for rid, prompt in zip(ids, prompts):
        core.add_request(rid, prompt, params)
    outputs: dict[str, list[int]] = {rid: [] for rid in ids}
    aborted: set[str] = set()
    planned: list = []
    schedule = core.scheduler.schedule

    def recording_schedule():
        plan = schedule()
        planned[:] = [item.seq.request_id for item in plan.scheduled if item.draft_token_ids]
        return plan

    core.scheduler.schedule = recording_schedule
    mid_proposal = 0

    def abort_one() -> None:  # runs while the step's verify forward is in flight
        nonlocal mid_proposal
        if planned and rng.random() < 0.1:
            rid = rng.choice(planned)
            core.abort(rid)
            aborted.add(rid)
            mid_proposal += 1

    while core.has_unfinished():
        out = core.step(between=abort_one)
        for update in out.updates:
            outputs[update.request_id].append(update.token.token_id)
        bm.check_invariants()
        draft_of(llm).blocks.check_invariants()
    assert mid_proposal > 0 and core.scheduler.num_preemptions > 0
    assert core.stats()["spec_num_accepted_tokens"] > 0
    for rid, prompt, w in zip(ids, prompts, want):
        w = w[: 96 - len(prompt)]  # this engine's max_model_len ends some outputs sooner
        got = outputs[rid]
        assert got == (w[: len(got)] if rid in aborted else w)
    assert_no_blocks_held(llm)


def test_a_draft_of_another_tokenizer_is_refused(tiny_llama):
    with pytest.raises(ValueError) as err:
        make(tiny_llama, "random:tiny-llama")
    msg = str(err.value)
    assert "speculative.draft_model 'random:tiny-llama'" in msg
    assert str(tiny_llama) in msg and "tokenizer differs" in msg


def test_bad_settings_are_refused(tiny_llama, tmp_path):
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        make(tiny_llama, tiny_llama, k=0)
    missing = tmp_path / "no-such-model"
    with pytest.raises(ValueError) as err:
        make(tiny_llama, missing)
    assert f"speculative.draft_model {str(missing)!r}" in str(err.value)
    with pytest.raises(ValueError, match="speculative.method draft needs speculative.draft_model"):
        LLM(model=str(tiny_llama), device="cpu", speculative={"method": "draft"})
    with pytest.raises(ValueError, match="speculative.draft_model is set but"):
        LLM(
            model=str(tiny_llama),
            device="cpu",
            speculative={"method": "ngram", "draft_model": str(tiny_llama)},
        )


# -- the output distribution under sampled guesses -------------------------------------------

SAMPLES = 800
TEMPERATURE = 0.5


def softmax_rows(hf, rows: list[list[int]]) -> torch.Tensor:
    """The target's next-token distribution after each row (rows of one length)."""
    with torch.no_grad():
        logits = hf(torch.tensor(rows)).logits[:, -1].float()
    return torch.softmax(logits / TEMPERATURE, dim=-1).double()


def likely_triples(hf, prompt: list[int], floor: float) -> dict[tuple[int, int, int], float]:
    """Every three-token continuation of ``prompt`` the target draws with probability at least
    ``floor``, with that probability (transformers on the target's weights: the oracle)."""
    p1 = softmax_rows(hf, [prompt])[0]
    firsts = [int(a) for a in torch.nonzero(p1 >= floor).flatten()]
    p2 = softmax_rows(hf, [prompt + [a] for a in firsts])
    pairs = [
        (a, int(b), float(p1[a] * p2[i, b]))
        for i, a in enumerate(firsts)
        for b in torch.nonzero(p1[a] * p2[i] >= floor).flatten()
    ]
    p3 = softmax_rows(hf, [prompt + [a, b] for a, b, _ in pairs])
    return {
        (a, b, int(c)): pab * float(p3[i, c])
        for i, (a, b, pab) in enumerate(pairs)
        for c in torch.nonzero(pab * p3[i] >= floor).flatten()
    }


def test_sampled_outputs_follow_the_target_distribution(tiny_llama, near_draft):
    """Chi-square of the first three sampled tokens (the second and third come from verify
    steps of the draft's sampled guesses) against the target's exact joint distribution;
    continuations too rare to expect 5 draws each are pooled into one cell."""
    from scipy.stats import chisquare
    from transformers import AutoModelForCausalLM

    seed = seed_of_case("draft-chi-square")
    llm = make(
        tiny_llama, near_draft, k=2, seed=seed % 2**20, max_num_seqs=256, max_waiting=SAMPLES
    )
    prompt = encode(llm, PROMPTS[:1])[0]
    torch.manual_seed(seed)  # the target's draws of unseeded requests
    params = SamplingParams(temperature=TEMPERATURE, max_tokens=3, ignore_eos=True)
    outs = token_ids(llm.generate([prompt] * SAMPLES, params))
    assert all(len(o) == 3 for o in outs)
    spec = llm.engine.core.spec
    assert spec.num_proposed_tokens > SAMPLES // 2
    # the draft's guesses are kept only in part: rejections and residual draws both happen
    assert 0.2 < spec.acceptance_rate < 0.95
    hf = AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32)
    exact = likely_triples(hf, prompt, floor=5 / SAMPLES)
    cells = sorted(exact)
    counts = {c: 0 for c in cells}
    rest = 0
    for o in outs:
        key = tuple(o)
        if key in counts:
            counts[key] += 1
        else:
            rest += 1
    observed = [counts[c] for c in cells] + [rest]
    expected = [exact[c] * SAMPLES for c in cells] + [(1 - sum(exact.values())) * SAMPLES]
    assert len(cells) >= 10 and expected[-1] >= 5
    assert float(chisquare(observed, expected).pvalue) > 1e-3
    assert_no_blocks_held(llm)


def test_the_default_propose_batch_asks_propose_for_each():
    from tallow.plugin import Speculator

    class Echo(Speculator):
        name = "echo"

        def propose(self, token_ids, k, context):
            return [token_ids[-1]] * k

    requests = [([1, 2], 2, SpeculationContext("a", 0, 1)), ([5], 3, SpeculationContext("b", 0, 1))]
    assert Echo().propose_batch(requests) == [[2, 2], [5, 5, 5]]


def test_a_random_draft_of_the_same_synthetic_vocabulary():
    """``random:`` models share their synthetic vocabulary when their sizes agree: a
    sliding-window draft (tiny-mistral: its cache group has a window) for a tiny-llama target."""
    llm = make("random:tiny-llama", "random:tiny-mistral", k=3)
    g = torch.Generator().manual_seed(seed_of_case("random-draft"))
    prompts = [torch.randint(3, 500, (n,), generator=g).tolist() for n in (5, 30, 60)]
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    want, got = plain_and_speculative(llm, prompts, params)
    assert token_ids(got) == token_ids(want)
    spec = llm.engine.core.spec
    # the same random weights but a window of 24 tokens: guesses past it go wrong
    assert spec.num_proposals > 10 and spec.acceptance_rate < 0.9
    assert draft_of(llm).blocks.primary.window == 24
    assert_no_blocks_held(llm)
