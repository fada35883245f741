"""Speculative decoding through the whole engine on CPU (tiny random model with a byte-level
vocabulary): greedy outputs equal those without it, with proposals right, wrong and past the
end, in batches, with chunked prefill, prefix caching, logprobs, stop tokens, max_tokens and
structured outputs; preemption and aborts while a proposal is being verified leave no block
behind."""

from __future__ import annotations

import json
import random
from typing import Sequence

import pytest

from tallow import LLM, SamplingParams, StructuredOutputsParams
from tallow.engine.speculation import SpecDecoding
from tallow.plugin import SpeculationContext, Speculator

PROMPTS = [
    "The quick brown fox",
    "def add(a, b):\n    return",
    "日本語のテキスト",
    "Paged attention keeps the KV cache in blocks",
    "a a a a a a a a",
    "x",
]
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "age": {"type": "integer", "minimum": 0, "maximum": 99},
        "color": {"enum": ["red", "green", "blue"]},
    },
    "required": ["name", "age", "color"],
    "additionalProperties": False,
}


class ReferenceSpeculator(Speculator):
    """Proposes recorded outputs, a share of the tokens spoiled, random tokens past their end,
    and nothing for unrecorded prompts."""

    name = "reference"

    def __init__(
        self,
        recorded: dict[tuple[int, ...], list[int]],
        vocab: int,
        right: float = 0.7,
        seed: int = 0,
    ) -> None:
        super().__init__(None)
        self.recorded, self.vocab, self.right = recorded, vocab, right
        self.rng = random.Random(seed)
        self.finished_calls = 0

    def propose(self, token_ids: Sequence[int], k: int, context: SpeculationContext) -> list[int]:
        n = context.num_prompt_tokens
        ref = self.recorded.get(tuple(token_ids[:n]))
        if ref is None:
            return []
        done = len(token_ids) - n
        out = []
        for j in range(k):
            truth = ref[done + j] if done + j < len(ref) else self.rng.randrange(self.vocab)
            out.append(truth if self.rng.random() < self.right else (truth + 1) % self.vocab)
        return out

    def finished(self, request_id: str, index: int) -> None:
        self.finished_calls += 1


def make(tiny_llama, **kw) -> LLM:
    settings = dict(
        model=str(tiny_llama),
        dtype="float32",
        device="cpu",
        num_blocks=256,
        block_size=4,
        max_model_len=256,
    )
    settings.update(kw)
    return LLM(**settings)


def encode(llm: LLM, texts: list[str]) -> list[list[int]]:
    tok = llm.get_tokenizer()
    return [tok.encode(t) for t in texts]


def token_ids(outs) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outs]


def speculate(llm: LLM, recorded: dict, k: int, **kw) -> ReferenceSpeculator:
    spec = ReferenceSpeculator(recorded, llm.engine.core.runner.vocab_size, **kw)
    llm.engine.core.enable_speculation(SpecDecoding(spec, k))
    return spec


@pytest.fixture(scope="module")
def base(tiny_llama) -> LLM:
    return make(tiny_llama, async_scheduling=False)


@pytest.fixture(scope="module")
def reference(base) -> tuple[list[list[int]], list[list[int]]]:
    prompts = encode(base, PROMPTS)
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    return prompts, token_ids(base.generate(prompts, params))


@pytest.mark.parametrize("k,right", [(1, 0.7), (3, 0.7), (6, 0.9), (4, 0.0)])
def test_greedy_outputs_equal_those_without_speculation(tiny_llama, reference, k, right):
    prompts, want = reference
    llm = make(tiny_llama, prefill_chunk_size=5)  # chunked prefill beside verify steps
    speculate(llm, {tuple(p): w for p, w in zip(prompts, want)}, k, right=right)
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    assert token_ids(llm.generate(prompts, params)) == want
    # again: the prompts' blocks now come from the prefix cache
    assert token_ids(llm.generate(prompts, params)) == want
    stats = llm.engine.core.stats()
    assert stats["spec_num_proposals"] > 0
    if right > 0:
        assert stats["spec_num_accepted_tokens"] > 0
        assert stats["spec_mean_accepted_length"] > 1.0
    else:
        assert stats["spec_num_accepted_tokens"] == 0
    bm = llm.engine.core.scheduler.block_manager
    assert bm.num_free_blocks == bm.num_total_blocks
    bm.check_invariants()


def test_max_tokens_stop_tokens_and_logprobs(tiny_llama, base, reference):
    prompts, want = reference
    llm = make(tiny_llama)
    speculate(llm, {tuple(p): w for p, w in zip(prompts, want)}, 6, right=1.0)
    # every proposal right: a step could emit 7 tokens, max_tokens stops it exactly
    for n in (1, 2, 5, 9):
        got = token_ids(
            llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True))
        )
        assert got == [w[:n] for w in want]
    # a stop token inside a kept proposal ends the output there
    stop = want[0][4]
    params = SamplingParams(temperature=0.0, max_tokens=24, stop_token_ids=[stop], ignore_eos=True)
    got = llm.generate(prompts[:1], params)[0].outputs[0]
    assert got.token_ids == want[0][: want[0].index(stop) + 1]
    assert got.finish_reason == "stop"
    # logprobs of every emitted token are the target's, as without speculation
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=3)
    plain = base.generate(prompts, params)
    spec = llm.generate(prompts, params)
    for a, b in zip(plain, spec):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        for la, lb in zip(a.outputs[0].logprobs, b.outputs[0].logprobs):
            assert la.keys() == lb.keys()
            for t in la:
                assert lb[t].logprob == pytest.approx(la[t].logprob, abs=1e-4)
                assert lb[t].rank == la[t].rank


def test_structured_outputs_under_proposals(tiny_llama, base):
    prompts = encode(base, PROMPTS[:4])
    params = SamplingParams(
        temperature=0.0, max_tokens=60, structured_outputs=StructuredOutputsParams(json=SCHEMA)
    )
    want = token_ids(base.generate(prompts, params))
    llm = make(tiny_llama)
    # proposals of the constrained output with spoiled tokens (the grammar refuses many)
    speculate(llm, {tuple(p): w for p, w in zip(prompts, want)}, 5, right=0.6)
    outs = llm.generate(prompts, params)
    assert token_ids(outs) == want
    for o in outs:
        json.loads(o.outputs[0].text)
    assert llm.engine.core.stats()["spec_num_accepted_tokens"] > 0


def test_seeded_sampling_with_proposals_repeats(tiny_llama, reference):
    prompts, want = reference
    llm = make(tiny_llama)
    spec = speculate(llm, {tuple(p): w for p, w in zip(prompts, want)}, 4)
    params = SamplingParams(temperature=0.8, top_p=0.9, max_tokens=16, seed=5, ignore_eos=True)
    runs = []
    for _ in range(2):  # the same proposals: the same draws
        spec.rng = random.Random(9)
        runs.append(token_ids(llm.generate(prompts, params)))
    assert runs[0] == runs[1] and all(len(x) == 16 for x in runs[0])
    assert llm.engine.core.stats()["spec_num_proposals"] > 0


def test_preemption_and_aborts_mid_proposal_leave_no_blocks(tiny_llama, base):
    prompts = [p * 3 for p in encode(base, PROMPTS)]
    # not ignore_eos: sequences of known length reserve their blocks and are never preempted
    params = SamplingParams(temperature=0.0, max_tokens=40)
    want = token_ids(base.generate(prompts, params))
    # a pool of about three sequences: proposals and preemption compete for blocks
    llm = make(tiny_llama, num_blocks=24, max_model_len=96, block_size=4)
    spec = speculate(llm, {tuple(p): w for p, w in zip(prompts, want)}, 5, right=0.8)
    core = llm.engine.core
    bm = core.scheduler.block_manager
    rng = random.Random(4)
    ids = [f"r{i}" for i in range(len(prompts))]
    for rid, prompt in zip(ids, prompts):
        core.add_request(rid, prompt, params)
    outputs: dict[str, list[int]] = {rid: [] for rid in ids}
    aborted: set[str] = set()
    mid_proposal = 0
    planned: list = []
    schedule = core.scheduler.schedule

    def recording_schedule():
        plan = schedule()
        planned[:] = [item.seq.request_id for item in plan.scheduled if item.draft_token_ids]
        return plan

    core.scheduler.schedule = recording_schedule

    def abort_one() -> None:  # runs while the step's verify forward is in flight
        nonlocal mid_proposal
        if planned and rng.random() < 0.08:
            rid = rng.choice(planned)
            core.abort(rid)
            aborted.add(rid)
            mid_proposal += 1

    while core.has_unfinished():
        out = core.step(between=abort_one)
        for update in out.updates:
            outputs[update.request_id].append(update.token.token_id)
        bm.check_invariants()
    assert mid_proposal > 0 and core.scheduler.num_preemptions > 0
    assert bm.num_free_blocks == bm.num_total_blocks
    assert core.stats()["spec_num_accepted_tokens"] > 0
    for rid, prompt, w in zip(ids, prompts, want):
        w = w[: 96 - len(prompt)]  # this engine's max_model_len ends some outputs sooner
        if rid in aborted:
            assert outputs[rid] == w[: len(outputs[rid])]
        else:
            assert outputs[rid] == w
    assert spec.finished_calls >= len(ids)


class HiddenRecorder(Speculator):
    """Reads the target's hidden states (as an MTP head does) and proposes nothing; records
    each context's rows: (first position, rows, the sequence's token count)."""

    name = "hidden-recorder"
    needs_hidden_states = True

    def __init__(self) -> None:
        super().__init__(None)
        self.seen: list[tuple[int, int | None, int]] = []

    def propose(self, token_ids: Sequence[int], k: int, context: SpeculationContext) -> list[int]:
        rows = None if context.hidden is None else int(context.hidden.shape[0])
        self.seen.append((context.hidden_start, rows, len(token_ids)))
        return []


@pytest.mark.parametrize("constrained", [False, True])
def test_hidden_states_reach_the_speculator_every_step(tiny_llama, constrained):
    """Each proposal is handed the target's rows of every position computed since the last
    one, plain or grammar-constrained (whose rows are sampled after the step is launched)."""
    llm = make(tiny_llama, prefill_chunk_size=5)
    spec = HiddenRecorder()
    llm.engine.core.enable_speculation(SpecDecoding(spec, 3))
    structured = StructuredOutputsParams(json=SCHEMA) if constrained else None
    params = SamplingParams(
        temperature=0.0, max_tokens=12, ignore_eos=not constrained, structured_outputs=structured
    )
    llm.generate(encode(llm, PROMPTS[:1]), params)
    assert len(spec.seen) > 3
    computed = 0
    for start, rows, num_tokens in spec.seen:
        # the positions computed so far, all of them: every one but the last token's
        assert rows is not None and start == computed and start + rows == num_tokens - 1
        computed = start + rows
