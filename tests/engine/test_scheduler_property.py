"""Scheduler + BlockManager driven by a fake deterministic model over a simulated KV cache.

The fake model behaves like a real one where it matters for the scheduler: the "K/V" it
writes for position p is a hash of the whole prefix, computed from the value it *reads back
from the cache* at p-1 (as attention reads earlier positions), and the token it samples
depends on everything in the context. A wrong block table, a missed copy-on-write, a stale
prefix-cache hit or a lost/duplicated token therefore changes the outputs, which are compared
with the outputs of each request computed alone, without any scheduler.

The same workloads also run in the async-scheduling interleaving: step N+1 is scheduled and run
after ``advance(N)`` but before ``commit(N)`` (so sequences carry placeholder tokens, and the
fake "device" feeds step N's tokens into N+1, as the runner does), stops are checked one step
late, aborts land while steps are in flight, and some steps are collected before the next one
is planned (the engine's fallback).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tallow.engine.block_manager import BlockManager
from tallow.engine.errors import AdmissionError
from tallow import SamplingParams
from tallow.engine.scheduler import AppliedStep, NewToken, Scheduler, SchedulerOutput
from tallow.engine.sequence import PENDING_TOKEN, Request, Sequence, SequenceStatus

VOCAB = 23
MASK = (1 << 64) - 1


def mix(a: int, b: int) -> int:
    """A splitmix64-style mix: deterministic, no salted hash()."""
    z = (a * 0x9E3779B97F4A7C15 + b + 0x632BE59BD9B4E019) & MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def kv_chain(tokens: list[int]) -> list[int]:
    out, prev = [], 0
    for p, tok in enumerate(tokens):
        prev = mix(prev, tok * 131 + p)
        out.append(prev)
    return out


def next_token(last_kv: int, seed: int, index: int, step: int) -> int:
    return mix(mix(last_kv, seed * 97 + index), step) % VOCAB


@dataclass
class Job:
    request_id: str
    prompt: list[int]
    n: int
    max_tokens: int
    stop: list[int]
    seed: int
    priority: int
    arrive_at: int  # step number
    abort_at: int | None
    prompt_logprobs: bool


def expected_outputs(job: Job, max_model_len: int) -> list[list[int]]:
    """Each completion run alone: the oracle (no scheduler, no cache)."""
    outs = []
    for index in range(job.n):
        tokens, out = list(job.prompt), []
        while True:
            tok = next_token(kv_chain(tokens)[-1], job.seed, index, len(out))
            tokens.append(tok)
            out.append(tok)
            if tok in job.stop or len(out) >= job.max_tokens or len(tokens) >= max_model_len:
                break
        outs.append(out)
    return outs


class FakeRunner:
    def __init__(self, bm: BlockManager) -> None:
        self.bm = bm
        self.kv: list[list[int | None]] = [
            [None] * bm.block_size for _ in range(bm.num_total_blocks)
        ]
        self.prompt_rows: dict[str, list[int]] = {}

    def _slot(self, seq: Sequence, pos: int) -> tuple[int, int]:
        bs = self.bm.block_size
        return seq.block_ids[pos // bs], pos % bs

    def run(
        self, out: SchedulerOutput, seeds: dict[str, int], feed: dict[int, int] | None = None
    ) -> dict[int, int]:
        """Run a step; ``feed`` holds the tokens of the step still in flight (seq_id → token),
        which the host sees as placeholders, as the model runner gets them on the device."""
        for src, dst in out.blocks_to_copy:  # before the forward, as the contract says
            self.kv[dst] = list(self.kv[src])
        written: set[tuple[int, int]] = set()
        sampled: dict[int, int] = {}
        for item in out.scheduled:
            seq = item.seq
            assert seq.status is SequenceStatus.RUNNING
            assert item.start == seq.num_computed_tokens and item.end <= seq.num_tokens
            assert len(seq.block_ids) * self.bm.block_size >= item.end
            tokens = list(seq.all_token_ids)
            assert seq.num_pending_tokens <= 1, "a step planned on two unknown tokens"
            if seq.num_pending_tokens:
                assert tokens[-1] == PENDING_TOKEN
                tokens[-1] = (feed or {})[seq.seq_id]
            assert PENDING_TOKEN not in tokens
            prev = 0
            if item.start:
                b, o = self._slot(seq, item.start - 1)
                prev = self.kv[b][o]  # type: ignore[assignment]
            for p in range(item.start, item.end):
                b, o = self._slot(seq, p)
                assert self.bm.ref_count(b) == 1, f"write into shared block {b} (no CoW)"
                assert (b, o) not in written, f"two rows write slot {(b, o)}"
                written.add((b, o))
                prev = mix(prev, tokens[p] * 131 + p)
                self.kv[b][o] = prev
            # Attention reads the whole context back from the cache.
            context = [self.kv[b][o] for b, o in (self._slot(seq, p) for p in range(item.end))]
            assert context == kv_chain(tokens[: item.end]), f"corrupt KV for {seq}"
            if item.prompt_logprobs:
                self.prompt_rows.setdefault(seq.request_id, []).extend(range(item.start, item.end))
            if item.sample_seqs:
                assert item.end == seq.num_tokens
            for target in item.sample_seqs:
                sampled[target.seq_id] = next_token(
                    prev, seeds[target.request_id], target.index, target.num_output_tokens
                )
        return sampled


def check_scheduler_state(s: Scheduler, out: SchedulerOutput) -> None:
    s.block_manager.check_invariants()
    assert out.num_batched_tokens == sum(i.num_tokens for i in out.scheduled)
    assert out.num_batched_tokens <= s.max_num_batched_tokens
    assert len({i.seq.seq_id for i in out.scheduled}) == len(out.scheduled)
    assert len(s.running) <= s.max_num_seqs
    seen_prefill = False
    for item in out.scheduled:  # decodes first
        assert not (item.is_decode and seen_prefill)
        seen_prefill |= not item.is_decode
    for seq in s.running:
        assert seq.status is SequenceStatus.RUNNING
        assert seq.num_computed_tokens < seq.num_tokens
    for seq in s.waiting:
        assert seq.status is SequenceStatus.WAITING and seq.block_ids == []
        assert seq.num_computed_tokens == 0
    assert not set(map(id, s.running)) & set(map(id, s.waiting))


def stop_checks(
    s: Scheduler, new_tokens: list[NewToken], stops: dict[str, list[int]], max_model_len: int
) -> None:
    """The engine's stop checks, on each token's own index (placeholders may follow it)."""
    for new in new_tokens:
        seq, n_out = new.seq, new.index + 1
        if seq.output_token_ids[new.index] in stops[seq.request_id]:
            s.finish(seq, SequenceStatus.FINISHED_STOPPED)
        elif n_out >= seq.params.max_tokens or seq.num_prompt_tokens + n_out >= max_model_len:
            s.finish(seq, SequenceStatus.FINISHED_LENGTH)


def simulate(
    jobs: list[Job],
    *,
    num_blocks: int,
    block_size: int,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    prefill_chunk_size: int | None,
    max_model_len: int,
    policy: str,
    caching: bool,
    async_steps: random.Random | None = None,
) -> dict:
    """Run the jobs. With ``async_steps`` (a seeded RNG) steps overlap as in async
    scheduling; the RNG decides which steps are collected before the next is planned."""
    bm = BlockManager(num_blocks, block_size, enable_prefix_caching=caching)
    s = Scheduler(
        bm,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        prefill_chunk_size=prefill_chunk_size,
        max_model_len=max_model_len,
        policy=policy,
    )
    runner = FakeRunner(bm)
    seeds = {j.request_id: j.seed for j in jobs}
    stops = {j.request_id: j.stop for j in jobs}
    requests: dict[str, Request] = {}
    refused: set[str] = set()
    aborted: set[str] = set()
    pending = sorted(jobs, key=lambda j: j.arrive_at)
    step, preemptions, hits = 0, 0, 0
    dropped = preempted_pending = 0  # async: tokens of finished sequences, pending preempted
    in_flight: tuple[AppliedStep, dict[int, int]] | None = None
    while pending or s.has_unfinished() or in_flight is not None:
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
        if in_flight is not None and async_steps.random() < 0.2:
            stop_checks(s, s.commit(*in_flight), stops, max_model_len)  # collected first
            in_flight = None
        was_running = {seq.seq_id for seq in s.running}
        out = s.schedule()
        hits += sum(1 for i in out.scheduled if i.seq.seq_id not in was_running and i.start)
        if s.has_unfinished() and not any(q.num_pending_tokens for q in s.running + s.waiting):
            assert out.scheduled, "nothing scheduled while requests are unfinished"
        preemptions += len(out.preempted)
        preempted_pending += sum(1 for q in out.preempted if q.num_pending_tokens)
        if async_steps is None:
            sampled = runner.run(out, seeds)
            got = s.update(out, sampled)
            stop_checks(
                s, [NewToken(q, q.num_output_tokens - 1) for q in got], stops, max_model_len
            )
        else:
            sampled = runner.run(out, seeds, feed=in_flight[1] if in_flight else None)
            applied = s.advance(out)  # placeholders; the next schedule() plans on them
            if in_flight is not None:
                stop_checks(s, s.commit(*in_flight), stops, max_model_len)
            # the step just run computed tokens that nobody wants now (finished meanwhile)
            dropped += sum(1 for new in applied.tokens if new.seq.status.is_finished)
            in_flight = (applied, sampled) if out.scheduled else None
        check_scheduler_state(s, out)
        step += 1
        assert step < 5_000, "no progress: livelock"
    return dict(
        requests=requests,
        refused=refused,
        aborted=aborted,
        runner=runner,
        bm=bm,
        preemptions=preemptions,
        admissions_with_cache_hits=hits,
        scheduler=s,
        dropped_tokens=dropped,
        preempted_with_pending_token=preempted_pending,
    )


def verify(jobs: list[Job], result: dict, max_model_len: int, num_blocks: int) -> None:
    bm: BlockManager = result["bm"]
    assert bm.num_free_blocks == num_blocks, "blocks leaked"
    bm.check_invariants()
    for job in jobs:
        rid = job.request_id
        too_long = len(job.prompt) + 1 > max_model_len
        assert (rid in result["refused"]) == too_long
        if too_long:
            continue
        req = result["requests"][rid]
        want = expected_outputs(job, max_model_len)
        got = [seq.output_token_ids for seq in req.seqs]
        if rid in result["aborted"]:
            assert all(
                seq.status is SequenceStatus.FINISHED_ABORTED or seq.status.is_finished
                for seq in req.seqs
            )
            for g, w in zip(got, want):
                assert g == w[: len(g)], "tokens before the abort are wrong"
            continue
        assert got == want, f"request {rid}"
        for seq in req.seqs:
            assert seq.status in (SequenceStatus.FINISHED_STOPPED, SequenceStatus.FINISHED_LENGTH)
            assert seq.num_cached_tokens % bm.block_size == 0
            assert seq.num_cached_tokens <= len(job.prompt) - 1
            if job.prompt_logprobs:
                assert seq.num_cached_tokens == 0
        if job.prompt_logprobs:
            assert result["runner"].prompt_rows[rid] == list(range(len(job.prompt)))


# -- workloads ------------------------------------------------------------------------------
@st.composite
def workloads(draw: st.DrawFn) -> tuple[list[Job], dict]:
    block_size = draw(st.sampled_from([1, 2, 4, 8]))
    max_model_len = draw(st.integers(8, 40))
    min_blocks = -(-max_model_len // block_size)
    # From "one sequence only" up to roomy: small pools force preemption.
    num_blocks = min_blocks + draw(st.integers(0, min_blocks // 2 + 1))
    config = dict(
        num_blocks=num_blocks,
        block_size=block_size,
        max_model_len=max_model_len,
        max_num_seqs=draw(st.integers(3, 6)),
        max_num_batched_tokens=draw(st.integers(4, 48)),
        prefill_chunk_size=draw(st.one_of(st.none(), st.integers(1, 12))),
        policy=draw(st.sampled_from(["fcfs", "priority"])),
        caching=draw(st.sampled_from([True, True, False])),
    )
    prefixes = [
        draw(st.lists(st.integers(0, VOCAB - 1), min_size=4, max_size=24)) for _ in range(2)
    ]
    jobs = []
    for i in range(draw(st.integers(2, 8))):
        prefix = prefixes[draw(st.integers(0, 1))]
        cut = draw(st.one_of(st.just(len(prefix)), st.integers(0, len(prefix))))
        prompt = prefix[:cut] + draw(st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=10))
        if draw(st.integers(0, 9)) == 0:
            prompt = prompt * (max_model_len // len(prompt) + 1)  # can never fit
        jobs.append(
            Job(
                request_id=f"r{i}",
                prompt=prompt,
                n=draw(st.integers(1, 3)),
                max_tokens=draw(st.integers(1, 16)),
                stop=draw(st.lists(st.integers(0, VOCAB - 1), max_size=1)),
                seed=draw(st.integers(0, 5)),
                priority=draw(st.integers(0, 2)),
                arrive_at=draw(st.integers(0, 8)),
                abort_at=draw(st.one_of(st.none(), st.none(), st.integers(0, 30))),
                prompt_logprobs=draw(st.integers(0, 4)) == 0,
            )
        )
    return jobs, config


def run_and_verify(jobs: list[Job], config: dict, async_steps: random.Random | None = None) -> dict:
    result = simulate(jobs, **config, async_steps=async_steps)
    verify(jobs, result, config["max_model_len"], config["num_blocks"])
    return result


@pytest.mark.parametrize("interleaving", ["sync", "async"])
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads(), st.integers(0, 2**32 - 1))
def test_random_workloads_complete_exactly_as_alone(
    interleaving: str, workload: tuple[list[Job], dict], seed: int
) -> None:
    """In the async interleaving N+1 is scheduled before N is committed: still the same
    outputs as alone, no leak, no stale cache hit."""
    jobs, config = workload
    async_steps = random.Random(seed) if interleaving == "async" else None
    result = run_and_verify(jobs, config, async_steps=async_steps)
    event(f"preempted: {result['preemptions'] > 0}")
    event(f"prefix hits: {result['admissions_with_cache_hits'] > 0}")
    event(f"n>1: {any(j.n > 1 for j in jobs)}")
    event(f"aborted: {bool(result['aborted'])}")
    if async_steps is not None:
        event(f"finished while in the next step: {result['dropped_tokens'] > 0}")
        event(f"preempted with a pending token: {result['preempted_with_pending_token'] > 0}")


def heavy_jobs(seed: int, *, stops: bool) -> list[Job]:
    """30 jobs sharing prefixes, some with n > 1, prompt logprobs, aborts (and stop tokens)."""
    rng = random.Random(seed)
    shared = [rng.randrange(VOCAB) for _ in range(16)]
    return [
        Job(
            request_id=f"j{i}",
            prompt=shared[: rng.randrange(17)]
            + [rng.randrange(VOCAB) for _ in range(rng.randrange(1, 8))],
            n=rng.choice([1, 1, 2, 3]),
            max_tokens=rng.randrange(1 if stops else 4, 16),
            stop=[rng.randrange(VOCAB)] if stops and rng.random() < 0.5 else [],
            seed=i,
            priority=rng.randrange(3),
            arrive_at=rng.randrange(20),
            abort_at=rng.choice([None] * 5 + [rng.randrange(40)]),
            prompt_logprobs=rng.random() < 0.15,
        )
        for i in range(30)
    ]


@pytest.mark.parametrize("interleaving", ["sync", "async"])
@pytest.mark.parametrize("policy", ["fcfs", "priority"])
@pytest.mark.parametrize("caching", [True, False])
def test_heavy_load_with_preemption(policy: str, caching: bool, interleaving: str) -> None:
    """A fixed, larger workload on a pool that holds about two sequences: preemption, forks
    and prefix hits all happen, and everything still comes out exactly. The async
    interleaving also has stop tokens, so sequences finish while in the next step."""
    asynchronous = interleaving == "async"
    jobs = heavy_jobs(99 if asynchronous else 1234, stops=asynchronous)
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
    result = run_and_verify(jobs, config, async_steps=random.Random(5) if asynchronous else None)
    assert result["preemptions"] > 0
    if caching:
        assert result["scheduler"].prefix_cache_hit_rate > 0
    if asynchronous:
        assert result["aborted"] and result["dropped_tokens"] > 0
        assert result["preempted_with_pending_token"] > 0
