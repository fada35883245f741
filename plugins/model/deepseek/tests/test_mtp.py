"""The DeepSeek-V3 multi-token prediction layer as ``speculative.method: mtp`` runs it, on a tiny
checkpoint that ships the layer under its real names (:mod:`tallow.plugin.testing.mtp`): one MTP
step equals the formula (transformers' decoder layer as the block's oracle), with the head's own
cache across a prefill and guesses; greedy outputs are those without speculation (several
sequences, chunked prefill, n = 2, a full head cache, preemption and aborts mid-proposal leaving
no block in either cache); a head that echoes the target has every guess kept; the hidden rows
the speculator receives are the target's, by transformers' independent forward; sampled guesses
carry the head's distribution and three sampled tokens follow the target's exact distribution
(chi-square); a model without MTP layers is refused by name."""

from __future__ import annotations

import random

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is the parity oracle")

from tallow import SamplingParams  # noqa: E402
from tallow.plugin import SpeculationContext  # noqa: E402
from tallow.plugin.testing.engine import offline_llm  # noqa: E402
from tallow.plugin.testing.mtp import (  # noqa: E402
    reference_mtp_logits,
    reference_mtp_step,
    save_mtp_checkpoint,
)
from tallow.plugin.testing.seeds import seed_of  # noqa: E402

from deepseek_configs import PROMPT, SMALL  # noqa: E402

LAYERS = int(SMALL["num_hidden_layers"])


def save(path, seed: int):
    """The tiny V3 checkpoint with its MTP layer (:mod:`tallow.plugin.testing.mtp`)."""
    config = dict(SMALL, q_lora_rank=24, n_group=2, topk_group=1)
    return save_mtp_checkpoint(
        path, transformers.DeepseekV3Config, transformers.DeepseekV3ForCausalLM, config, seed
    )


PLUGINS = ["tallow-model-deepseek", "tallow-format-safetensors"]
EPS = float(SMALL["rms_norm_eps"])
# float32 throughout: the engine's kernels against transformers' differ by rounding only
ATOL = 2e-4


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory):
    pytest.importorskip("tallow_format_safetensors", reason="the checkpoint is safetensors")
    path = tmp_path_factory.mktemp("deepseek-mtp")
    hf, own = save(path, seed_of("deepseek-mtp"))
    return path, hf, own


def make(path, k: int = 3, num_blocks: int = 48, **scheduler):
    return offline_llm(
        str(path),
        plugins=PLUGINS,
        config={
            "model": {"dtype": "float32", "max_model_len": 64},
            "cache": {"block_size": 4, "num_blocks": num_blocks},
            "scheduler": {
                "max_num_batched_tokens": 32,
                "prefill_chunk_size": 8,
                "max_num_seqs": 4,
                **scheduler,
            },
            "speculative": {"method": "mtp", "num_speculative_tokens": k},
        },
    )


def test_one_mtp_step_equals_the_formula(checkpoint):
    """The head's output and logits after a 12-position prefill (in chunks of 8) and after
    two guesses fed on its own output equal the formula's over the whole prefix."""
    path, hf, own = checkpoint
    llm = make(path)
    mtp = llm.engine.core.spec.speculator.mtp
    gen = torch.Generator().manual_seed(seed_of("deepseek-mtp", "step"))
    tokens = PROMPT[:13]
    hidden = torch.randn(12, int(SMALL["hidden_size"]), generator=gen)
    ((logits, out),) = mtp.sync([(("r", 0), tokens, hidden, 0, 2)])
    want = reference_mtp_step(hf, own, tokens[1:], hidden, EPS)
    torch.testing.assert_close(out, want[-1], atol=ATOL, rtol=0)
    torch.testing.assert_close(logits, reference_mtp_logits(own, want[-1], EPS), atol=ATOL, rtol=0)
    rows, seen = hidden, list(tokens[1:])
    for guess in (5, 77):
        logits2, out2 = mtp.extend([(("r", 0), guess, out)])
        rows = torch.cat([rows, out[None]])
        seen.append(guess)
        want = reference_mtp_step(hf, own, seen, rows, EPS)
        torch.testing.assert_close(out2[0], want[-1], atol=ATOL, rtol=0)
        torch.testing.assert_close(
            logits2[0], reference_mtp_logits(own, want[-1], EPS), atol=ATOL, rtol=0
        )
        out = out2[0]
    mtp.free("r", 0)
    assert mtp.blocks.num_free_blocks == mtp.blocks.num_total_blocks


def prompts() -> list[list[int]]:
    return [PROMPT[:11], PROMPT[5:9], PROMPT[2:24], PROMPT[:3] * 3]


def test_greedy_outputs_equal_those_without_mtp(checkpoint):
    path, _, _ = checkpoint
    llm = make(path)
    core = llm.engine.core
    spec = core.spec
    params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    core.enable_speculation(None)
    want = [o.outputs[0].token_ids for o in llm.generate(prompts(), params)]
    core.enable_speculation(spec)
    got = [o.outputs[0].token_ids for o in llm.generate(prompts(), params)]
    assert got == want
    stats = core.stats()
    assert stats["spec_num_proposed_tokens"] > 0
    mtp = spec.speculator.mtp
    assert mtp.num_sequences == 0
    assert mtp.blocks.num_free_blocks == mtp.blocks.num_total_blocks
    # n = 2: the forked completion starts from its parent's rows and proposes too
    sync = mtp.sync
    asked: set[tuple[str, int]] = set()

    def checking(requests):
        got = sync(requests)
        for (key, *_), out in zip(requests, got):
            assert out is not None and not mtp.state(*key).broken
            asked.add(key)
        return got

    mtp.sync = checking
    twice = SamplingParams(n=2, temperature=0.0, max_tokens=20, ignore_eos=True)
    outs = llm.generate(prompts()[:2], twice)
    assert [[c.token_ids for c in o.outputs] for o in outs] == [[w, w] for w in want[:2]]
    assert {index for _, index in asked} == {0, 1}
    assert mtp.num_sequences == 0


def test_a_full_head_cache_proposes_nothing_until_it_has_room(checkpoint):
    """A head pool of 10 blocks of 4 tokens (the sequences below need up to 11 each): steps
    go without proposals while it is full, the rows wait, and proposals resume once finished
    sequences give their blocks back; outputs stay the plain ones and no block is left."""
    from tallow.engine.kv_manager import KVCacheManager, PagedGroupSize

    path, _, _ = checkpoint
    llm = make(path, k=4)
    core = llm.engine.core
    spec = core.spec
    mtp = spec.speculator.mtp
    mtp.blocks = KVCacheManager([PagedGroupSize(10)], block_size=4, enable_prefix_caching=False)
    params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    core.enable_speculation(None)
    want = [o.outputs[0].token_ids for o in llm.generate(prompts(), params)]
    core.enable_speculation(spec)
    waited = 0
    sync = mtp.sync

    def counting(requests):
        nonlocal waited
        got = sync(requests)
        assert not any(mtp.state(*key).broken for key, *_ in requests)
        waited += sum(
            1
            for (key, *_), out in zip(requests, got)
            if out is None and mtp.state(*key).waiting is not None
        )
        return got

    mtp.sync = counting
    got = [o.outputs[0].token_ids for o in llm.generate(prompts(), params)]
    assert got == want
    stats = core.stats()
    assert waited > 0 and stats["spec_num_proposals"] > 0
    assert stats["spec_num_proposals"] < sum(len(o) - 1 for o in got)
    assert mtp.num_sequences == 0
    assert mtp.blocks.num_free_blocks == mtp.blocks.num_total_blocks


def test_preemption_and_aborts_mid_proposal_leave_no_blocks(checkpoint):
    """A target pool of 24 blocks of 4 tokens (the four sequences need about 36): sequences
    are preempted and computed again while others are aborted during their verify steps;
    outputs stay the plain ones (cut where aborted) and neither cache keeps a block."""
    path, _, _ = checkpoint
    base = make(path)
    base.engine.core.enable_speculation(None)
    # without ignore_eos a sequence's final length is unknown: it reserves no blocks ahead,
    # so the pool runs out and running sequences are preempted
    params = SamplingParams(temperature=0.0, max_tokens=24)
    want = [o.outputs[0].token_ids for o in base.generate(prompts(), params)]
    llm = make(path, k=4, num_blocks=24)
    core = llm.engine.core
    mtp = core.spec.speculator.mtp
    ids = [f"r{i}" for i in range(len(prompts()))]
    for rid, prompt in zip(ids, prompts()):
        core.add_request(rid, prompt, params)
    planned: list[str] = []
    schedule = core.scheduler.schedule

    def recording_schedule():
        plan = schedule()
        planned[:] = [item.seq.request_id for item in plan.scheduled if item.draft_token_ids]
        return plan

    core.scheduler.schedule = recording_schedule
    rng = random.Random(seed_of("deepseek-mtp", "abort"))
    aborted: set[str] = set()

    def abort_one() -> None:  # runs while the verify step is in flight
        # two aborts at most, once the pool has preempted: both kinds of release are seen
        live = [r for r in planned if r not in aborted]
        if live and core.scheduler.num_preemptions and len(aborted) < 2:
            rid = rng.choice(live)
            core.abort(rid)
            aborted.add(rid)

    outputs: dict[str, list[int]] = {rid: [] for rid in ids}
    while core.has_unfinished():
        for update in core.step(between=abort_one).updates:
            outputs[update.request_id].append(update.token.token_id)
        mtp.blocks.check_invariants()
    assert aborted and core.scheduler.num_preemptions > 0
    assert core.stats()["spec_num_proposed_tokens"] > 0
    for rid, w in zip(ids, want):
        got = outputs[rid]
        assert got == (w[: len(got)] if rid in aborted else w)
    assert mtp.num_sequences == 0
    assert mtp.blocks.num_free_blocks == mtp.blocks.num_total_blocks
    bm = core.scheduler.block_manager
    assert bm.num_free_blocks == bm.num_total_blocks


def test_the_speculator_receives_the_targets_hidden_states(checkpoint):
    """Every row handed to the speculator is the target's hidden state (after the final
    norm, what its head reads) at that position, by transformers' forward of the sequence,
    and the rows of each proposal end at the last accepted token."""
    path, hf, _ = checkpoint
    llm = make(path)
    spec = llm.engine.core.spec.speculator
    seen: list[tuple[list[int], int, torch.Tensor]] = []
    propose = spec.propose_batch

    def recording(requests):
        for token_ids, _, ctx in requests:
            if ctx.hidden is not None:
                seen.append((list(token_ids), ctx.hidden_start, ctx.hidden.clone()))
        return propose(requests)

    spec.propose_batch = recording
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    llm.generate(prompts()[:2], params)
    assert len(seen) > 4
    target = transformers.DeepseekV3ForCausalLM(
        transformers.DeepseekV3Config(**hf.config.to_dict())
    )
    target.load_state_dict(hf.state_dict())
    target.model.layers = target.model.layers[:LAYERS]
    for token_ids, start, rows in seen:
        assert start + rows.shape[0] == len(token_ids) - 1  # up to the last accepted token
        with torch.no_grad():
            want = target.model(torch.tensor([token_ids[:-1]])).last_hidden_state[0]
        torch.testing.assert_close(rows, want[start:], atol=ATOL, rtol=0)


def test_sampled_guesses_carry_the_heads_distribution(checkpoint):
    path, _, _ = checkpoint
    llm = make(path)
    spec = llm.engine.core.spec.speculator
    gen = torch.Generator().manual_seed(seed_of("deepseek-mtp", "sampled"))
    tokens = PROMPT[:9]
    hidden = torch.randn(8, int(SMALL["hidden_size"]), generator=gen)
    ctx = SpeculationContext("s", 0, len(tokens), temperature=0.8, hidden=hidden)
    (proposal,) = spec.propose_batch([(tokens, 3, ctx)])
    assert len(proposal.token_ids) == 3
    assert proposal.probs is not None and proposal.probs.shape == (3, int(SMALL["vocab_size"]))
    torch.testing.assert_close(proposal.probs.sum(-1), torch.ones(3))
    # each guess was drawn where its distribution has mass
    assert all(proposal.probs[j, t] > 0 for j, t in enumerate(proposal.token_ids))


def test_a_model_without_mtp_layers_is_refused():
    with pytest.raises(ValueError) as err:
        offline_llm(
            "random:tiny-deepseek-v3",
            plugins=["tallow-model-deepseek"],
            config={
                "model": {"dtype": "float32", "max_model_len": 64},
                "cache": {"block_size": 4, "num_blocks": 16},
                "speculative": {"method": "mtp"},
            },
        )
    msg = str(err.value)
    assert "speculative.method mtp" in msg and "random:tiny-deepseek-v3" in msg
    assert "no multi-token prediction layers" in msg


@pytest.fixture(scope="module")
def echo_checkpoint(checkpoint, tmp_path_factory: pytest.TempPathFactory):
    """The checkpoint with every attention output and MLP down projection zeroed (the
    residual stream keeps the token's embedding: the target's next token is a function ``f``
    of its last token) and an MTP layer that computes the same ``f`` of the token it is given
    (``eh_proj`` keeps the embedding half, the norms are ones, its embedding and head are the
    model's): every guess is the target's own choice."""
    import shutil

    from safetensors.torch import load_file, save_file

    source, _, _ = checkpoint
    path = tmp_path_factory.mktemp("deepseek-mtp-echo")
    for f in source.iterdir():
        shutil.copy(f, path / f.name)
    weights = load_file(str(path / "model.safetensors"))
    hidden = int(SMALL["hidden_size"])
    for name, t in weights.items():
        if "o_proj" in name or "down_proj" in name:
            weights[name] = torch.zeros_like(t)
    mtp = f"model.layers.{LAYERS}"
    weights["model.norm.weight"] = torch.ones(hidden)
    weights[f"{mtp}.enorm.weight"] = torch.ones(hidden)
    weights[f"{mtp}.shared_head.norm.weight"] = torch.ones(hidden)
    weights[f"{mtp}.eh_proj.weight"] = torch.cat(
        [torch.eye(hidden), torch.zeros(hidden, hidden)], 1
    )
    weights[f"{mtp}.embed_tokens.weight"] = weights["model.embed_tokens.weight"].clone()
    weights[f"{mtp}.shared_head.head.weight"] = weights["lm_head.weight"].clone()
    save_file(weights, str(path / "model.safetensors"), metadata={"format": "pt"})
    return path


def test_a_head_that_echoes_the_target_has_every_guess_kept(echo_checkpoint):
    """Every proposed token is kept (the head and the target choose alike, so the tokens and
    positions the head is fed line up with the target's), over several sequences, chunked
    prefill, prefix-cache hits and k guesses chained on the head's own output; outputs equal
    the plain ones."""
    llm = make(echo_checkpoint, k=4)
    core = llm.engine.core
    spec = core.spec
    params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    core.enable_speculation(None)
    want = [o.outputs[0].token_ids for o in llm.generate(prompts(), params)]
    core.enable_speculation(spec)
    got = [o.outputs[0].token_ids for o in llm.generate(prompts(), params)]
    assert got == want
    stats = core.stats()
    assert stats["spec_num_proposed_tokens"] > 20
    assert stats["spec_acceptance_rate"] == 1.0, stats
    assert stats["spec_mean_accepted_length"] > 3.0, stats
    # the second run's prompts began with prefix-cache hits: the head's cache took zero hidden
    # states at those positions (this head reads only the tokens)
    assert stats["prefix_cache_hit_rate"] > 0, stats


SAMPLES = 400
TEMPERATURE = 0.7


@pytest.fixture(scope="module")
def sharp_checkpoint(checkpoint, echo_checkpoint, tmp_path_factory: pytest.TempPathFactory):
    """The echo checkpoint (the next token's distribution depends on the last token only)
    with the model's head 20 times larger (random weights give nearly uniform logits, too
    flat to test a distribution with) and the MTP layer's head that one plus noise of its own
    size: the head's guesses are the target's in part. Returns the path and transformers'
    model of its decoder (the oracle)."""
    import shutil

    from safetensors.torch import load_file, save_file

    _, hf, _ = checkpoint
    path = tmp_path_factory.mktemp("deepseek-mtp-sharp")
    for f in echo_checkpoint.iterdir():
        shutil.copy(f, path / f.name)
    weights = load_file(str(path / "model.safetensors"))
    gen = torch.Generator().manual_seed(seed_of("deepseek-mtp", "sharp"))
    head = weights["lm_head.weight"] * 20.0
    weights["lm_head.weight"] = head
    noise = head.std() * torch.randn(head.shape, generator=gen)
    weights[f"model.layers.{LAYERS}.shared_head.head.weight"] = head + noise
    save_file(weights, str(path / "model.safetensors"), metadata={"format": "pt"})
    # the oracle: transformers' model of the same weights, changed as the echo's were
    target = transformers.DeepseekV3ForCausalLM(
        transformers.DeepseekV3Config(**hf.config.to_dict())
    )
    target.load_state_dict(hf.state_dict())
    target.model.layers = target.model.layers[:LAYERS]
    with torch.no_grad():
        for name, param in target.named_parameters():
            if "o_proj" in name or "down_proj" in name:
                param.zero_()
        target.model.norm.weight.fill_(1.0)
        target.lm_head.weight.copy_(head)
    return path, target.eval()


def test_sampled_outputs_follow_the_target_distribution(sharp_checkpoint):
    """Chi-square of the first three sampled tokens (the second and third come from verify
    steps of the head's sampled guesses: kept ones and residual draws) against the target's
    exact joint distribution (transformers' forward of the model's layers); continuations
    too rare to expect 5 draws each are pooled into one cell."""
    scipy_stats = pytest.importorskip("scipy.stats", reason="scipy computes the chi-square")
    path, target = sharp_checkpoint
    seed = seed_of("deepseek-mtp", "chi-square")
    llm = make(path, k=2, max_num_seqs=256, max_num_batched_tokens=2048, prefill_chunk_size=None)
    torch.manual_seed(seed)  # the target's draws of unseeded requests
    prompt = PROMPT[:6]
    params = SamplingParams(temperature=TEMPERATURE, max_tokens=3, ignore_eos=True)
    outs = [o.outputs[0].token_ids for o in llm.generate([prompt] * SAMPLES, params)]
    assert all(len(o) == 3 for o in outs)
    spec = llm.engine.core.spec
    assert spec.num_proposed_tokens > SAMPLES // 2
    # the kept guesses and the residual draws both happen
    assert 0.05 < spec.acceptance_rate < 0.95, spec.stats()

    def dist(rows: list[list[int]]) -> torch.Tensor:
        with torch.no_grad():
            logits = target(torch.tensor(rows)).logits[:, -1].double()
        return torch.softmax(logits / TEMPERATURE, dim=-1)

    floor = 5 / SAMPLES
    p1 = dist([prompt])[0]
    firsts = [int(a) for a in torch.nonzero(p1 >= floor).flatten()]
    p2 = dist([prompt + [a] for a in firsts])
    pairs = [
        (a, int(b), float(p1[a] * p2[i, b]))
        for i, a in enumerate(firsts)
        for b in torch.nonzero(p1[a] * p2[i] >= floor).flatten()
    ]
    p3 = dist([prompt + [a, b] for a, b, _ in pairs])
    exact = {
        (a, b, int(c)): pab * float(p3[i, c])
        for i, (a, b, pab) in enumerate(pairs)
        for c in torch.nonzero(pab * p3[i] >= floor).flatten()
    }
    cells = sorted(exact)
    counts = {c: 0 for c in cells}
    rest = 0
    for o in outs:
        if tuple(o) in counts:
            counts[tuple(o)] += 1
        else:
            rest += 1
    observed = [counts[c] for c in cells] + [rest]
    expected = [exact[c] * SAMPLES for c in cells] + [(1 - sum(exact.values())) * SAMPLES]
    assert len(cells) >= 5 and expected[-1] >= 5, (len(cells), expected[-1])
    assert float(scipy_stats.chisquare(observed, expected).pvalue) > 1e-3
    mtp = spec.speculator.mtp
    assert mtp.num_sequences == 0
    assert mtp.blocks.num_free_blocks == mtp.blocks.num_total_blocks
