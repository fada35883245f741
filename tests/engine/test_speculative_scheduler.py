"""Speculative decoding through the scheduler and the block manager, over the simulated KV cache
of test_scheduler_property: proposals (some right, some wrong, some past the end) get KV slots,
the fake model writes and reads them like attention does, greedy acceptance keeps a prefix, and
the rejected slots are taken back. Outputs must equal each completion computed alone, whatever
the preemptions, prefix-cache hits, forks and aborts (also of a sequence whose proposal is in
the step being run), and every block must come back.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tallow import SamplingParams
from tallow.engine.block_manager import BlockManager
from tallow.engine.errors import AdmissionError
from tallow.engine.sampling.speculative import accept_greedy
from tallow.engine.scheduler import NewToken, Scheduler, SchedulerOutput
from tallow.engine.sequence import Request, Sequence, SequenceStatus

sys.path.insert(0, str(Path(__file__).parent))
from test_scheduler_property import (  # noqa: E402
    VOCAB,
    Job,
    check_scheduler_state,
    expected_outputs,
    heavy_jobs,
    kv_chain,
    mix,
    next_token,
    workloads,
)


class OracleProposer:
    """Proposes each completion's true continuation, spoiled at random positions, sometimes
    past its end; records what it was asked and told."""

    def __init__(
        self, truth: dict[tuple[str, int], list[int]], rng: random.Random, max_k: int
    ) -> None:
        self.truth, self.rng, self.max_k = truth, rng, max_k
        self.asked: set[int] = set()
        self.forgotten: list[int] = []

    def propose(self, seq: Sequence, limit: int) -> tuple[list[int], object]:
        assert limit >= 1
        self.asked.add(seq.seq_id)
        k = min(limit, self.rng.randint(0, self.max_k))
        truth = self.truth[(seq.request_id, seq.index)][seq.num_output_tokens :]
        out = []
        for j in range(k):
            right = truth[j] if j < len(truth) else self.rng.randrange(VOCAB)
            out.append(right if self.rng.random() < 0.75 else (right + 1) % VOCAB)
        return out, None

    def forget(self, seq: Sequence) -> None:
        self.forgotten.append(seq.seq_id)


class SpecFakeRunner:
    """The fake model of test_scheduler_property, verifying proposals: row j of a proposing
    sequence reads the K/V of its last token and the proposals before row j."""

    def __init__(self, bm: BlockManager) -> None:
        self.bm = bm
        self.kv: list[list[int | None]] = [
            [None] * bm.block_size for _ in range(bm.num_total_blocks)
        ]

    def _slot(self, seq: Sequence, pos: int) -> tuple[int, int]:
        bs = self.bm.block_size
        return seq.block_ids[pos // bs], pos % bs

    def run(
        self, out: SchedulerOutput, seeds: dict[str, int]
    ) -> tuple[dict[int, int], dict[int, list[int]]]:
        for src, dst in out.blocks_to_copy:
            self.kv[dst] = list(self.kv[src])
        sampled: dict[int, int] = {}
        accepted: dict[int, list[int]] = {}
        for item in out.scheduled:
            seq = item.seq
            assert seq.status is SequenceStatus.RUNNING
            assert item.start == seq.num_computed_tokens
            drafts = item.draft_token_ids
            tokens = list(seq.all_token_ids) + drafts
            if drafts:
                assert item.start == seq.num_tokens - 1 and item.is_decode
                assert item.sample_seqs == [seq]
            assert item.end <= len(tokens)
            assert len(seq.block_ids) * self.bm.block_size >= item.end
            prev = 0
            if item.start:
                b, o = self._slot(seq, item.start - 1)
                prev = self.kv[b][o]  # type: ignore[assignment]
            row_kv = []
            for p in range(item.start, item.end):
                b, o = self._slot(seq, p)
                assert self.bm.ref_count(b) == 1, f"write into shared block {b} (no CoW)"
                prev = mix(prev, tokens[p] * 131 + p)
                self.kv[b][o] = prev
                row_kv.append(prev)
            context = [self.kv[b][o] for b, o in (self._slot(seq, p) for p in range(item.end))]
            assert context == kv_chain(tokens[: item.end]), f"corrupt KV for {seq}"
            if drafts:
                n_out = seq.num_output_tokens
                targets = [
                    next_token(kv, seeds[seq.request_id], seq.index, n_out + j)
                    for j, kv in enumerate(row_kv)
                ]
                emitted = accept_greedy(targets, drafts)
                sampled[seq.seq_id] = emitted[0]
                if len(emitted) > 1:
                    accepted[seq.seq_id] = emitted[1:]
                continue
            if item.sample_seqs:
                assert item.end == seq.num_tokens
            for target in item.sample_seqs:
                sampled[target.seq_id] = next_token(
                    prev, seeds[target.request_id], target.index, target.num_output_tokens
                )
        return sampled, accepted


def stop_checks(
    s: Scheduler, new_tokens: list[NewToken], stops: dict[str, list[int]], max_model_len: int
) -> None:
    for new in new_tokens:
        seq, n_out = new.seq, new.index + 1
        if seq.status.is_finished:  # stopped at an earlier token of the same step
            continue
        assert n_out <= seq.params.max_tokens, "more tokens than max_tokens"
        assert seq.num_prompt_tokens + n_out <= max_model_len, "past max_model_len"
        if seq.output_token_ids[new.index] in stops[seq.request_id]:
            s.finish(seq, SequenceStatus.FINISHED_STOPPED)
        elif n_out >= seq.params.max_tokens or seq.num_prompt_tokens + n_out >= max_model_len:
            s.finish(seq, SequenceStatus.FINISHED_LENGTH)
        if seq.status.is_finished:
            seq.truncate_outputs(n_out)  # kept proposals after the stop are not outputs


def simulate(
    jobs: list[Job],
    rng: random.Random,
    *,
    num_blocks: int,
    block_size: int,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    prefill_chunk_size: int | None,
    max_model_len: int,
    policy: str,
    caching: bool,
    max_k: int = 4,
) -> dict:
    bm = BlockManager(num_blocks, block_size, enable_prefix_caching=caching)
    s = Scheduler(
        bm,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        prefill_chunk_size=prefill_chunk_size,
        max_model_len=max_model_len,
        policy=policy,
    )
    truth = {
        (j.request_id, i): out
        for j in jobs
        for i, out in enumerate(expected_outputs(j, max_model_len))
    }
    proposer = OracleProposer(truth, rng, max_k)
    s.proposer = proposer
    runner = SpecFakeRunner(bm)
    seeds = {j.request_id: j.seed for j in jobs}
    stops = {j.request_id: j.stop for j in jobs}
    requests: dict[str, Request] = {}
    refused: set[str] = set()
    aborted: set[str] = set()
    pending = sorted(jobs, key=lambda j: j.arrive_at)
    step = verify_steps = kept = preemptions = mid_proposal_aborts = 0
    while pending or s.has_unfinished():
        while pending and pending[0].arrive_at <= step:
            job = pending.pop(0)
            params = SamplingParams(
                n=job.n,
                max_tokens=job.max_tokens,
                seed=job.seed,
                prompt_logprobs=0 if job.prompt_logprobs else None,
            )
            try:
                requests[job.request_id] = s.add_request(
                    job.request_id,
                    job.prompt,
                    params,
                    priority=job.priority,
                    arrival_time=float(step),
                )
            except AdmissionError:
                refused.add(job.request_id)
        for job in jobs:
            if job.abort_at == step and job.request_id in requests:
                if s.abort(job.request_id):
                    aborted.add(job.request_id)
        out = s.schedule()
        preemptions += len(out.preempted)
        check_scheduler_state(s, out)
        sampled, accepted = runner.run(out, seeds)
        applied = s.advance(out)
        proposing = [item.seq for item in out.scheduled if item.draft_token_ids]
        verify_steps += bool(proposing)
        kept += sum(len(v) for v in accepted.values())
        if proposing and rng.random() < 0.05:  # an abort while the verify step runs
            victim = rng.choice(proposing)
            if s.abort(victim.request_id):
                aborted.add(victim.request_id)
                mid_proposal_aborts += 1
        stop_checks(s, s.commit(applied, sampled, accepted), stops, max_model_len)
        bm.check_invariants()
        for seq in s.running:  # rejected proposals' blocks went back at once
            assert len(seq.block_ids) <= bm.blocks_for(seq.num_tokens), f"{seq} kept blocks"
        step += 1
        assert step < 5_000, "no progress: livelock"
    return dict(
        requests=requests,
        refused=refused,
        aborted=aborted,
        bm=bm,
        verify_steps=verify_steps,
        kept=kept,
        preemptions=preemptions,
        proposer=proposer,
        mid_proposal_aborts=mid_proposal_aborts,
    )


def check(jobs: list[Job], result: dict, max_model_len: int, num_blocks: int) -> None:
    bm: BlockManager = result["bm"]
    assert bm.num_free_blocks == num_blocks, "blocks leaked"
    bm.check_invariants()
    for job in jobs:
        rid = job.request_id
        if rid in result["refused"]:
            assert len(job.prompt) + 1 > max_model_len
            continue
        req = result["requests"][rid]
        want = expected_outputs(job, max_model_len)
        got = [seq.output_token_ids for seq in req.seqs]
        if rid in result["aborted"]:
            for g, w in zip(got, want):
                assert g == w[: len(g)], "tokens before the abort are wrong"
            continue
        assert got == want, f"request {rid}"
    # every sequence asked for a proposal was forgotten by the proposer at its end
    assert result["proposer"].asked <= set(result["proposer"].forgotten)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads(), st.integers(0, 2**32 - 1), st.integers(1, 6))
def test_random_workloads_with_proposals_complete_exactly_as_alone(
    workload: tuple[list[Job], dict], seed: int, max_k: int
) -> None:
    jobs, config = workload
    result = simulate(jobs, random.Random(seed), **config, max_k=max_k)
    check(jobs, result, config["max_model_len"], config["num_blocks"])
    event(f"verify steps: {result['verify_steps'] > 0}")
    event(f"kept proposals: {result['kept'] > 0}")
    event(f"preempted: {result['preemptions'] > 0}")
    event(f"aborted mid-proposal: {result['mid_proposal_aborts'] > 0}")


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
@pytest.mark.parametrize("caching", [True, False])
def test_heavy_load_with_proposals_preemption_and_aborts(policy: str, caching: bool) -> None:
    """A pool that holds about two sequences: proposals compete for blocks with preemption,
    forks, prefix hits and aborts (some mid-proposal); nothing is lost or left behind."""
    jobs = heavy_jobs(77, stops=True)
    config = dict(
        num_blocks=12,
        block_size=4,
        max_model_len=40,
        max_num_seqs=6,
        max_num_batched_tokens=24,
        prefill_chunk_size=8,
        policy=policy,
        caching=caching,
    )
    result = simulate(jobs, random.Random(3), **config, max_k=5)
    check(jobs, result, config["max_model_len"], config["num_blocks"])
    assert result["preemptions"] > 0
    assert result["verify_steps"] > 10 and result["kept"] > 10
    assert result["mid_proposal_aborts"] > 0


def test_trim_gives_back_only_the_rejected_blocks() -> None:
    bm = BlockManager(8, 4)
    seq = Sequence("r", 0, [1, 2, 3], SamplingParams(max_tokens=20))
    bm.allocate_prefix(seq)
    bm.append_slots(seq, 3)
    seq.num_computed_tokens = 3
    seq.append_token(4)  # 4 tokens, 3 computed: a decode of position 3 with 6 proposals
    bm.append_slots(seq, 7)  # positions 3..9: blocks 0, 1, 2
    assert len(seq.block_ids) == 3 and bm.num_free_blocks == 5
    seq.num_computed_tokens = 5  # its last token and one proposal kept
    seq.append_token(5)
    seq.append_token(6)
    assert bm.trim(seq, seq.num_tokens) == 1  # 6 tokens: two blocks
    assert len(seq.block_ids) == 2 and bm.num_free_blocks == 6
    bm.check_invariants()
    with pytest.raises(ValueError, match="computed tokens"):
        bm.trim(seq, 2)
