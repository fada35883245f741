"""Scheduler unit tests: admission, budgets, chunking, n > 1, prefix cache, preemption, abort."""

from __future__ import annotations

import pytest

from tallow.engine.block_manager import BlockManager
from tallow.engine.errors import AdmissionError, QueueFullError
from tallow import SamplingParams
from tallow.engine.scheduler import Scheduler, SchedulerOutput
from tallow.engine.sequence import Sequence, SequenceStatus

FIN = SequenceStatus.FINISHED_LENGTH


def make(
    num_blocks: int = 32, block_size: int = 4, *, caching: bool = True, **kw: object
) -> Scheduler:
    opts: dict = dict(
        max_num_seqs=8, max_num_batched_tokens=64, prefill_chunk_size=None, max_model_len=64
    )
    opts.update(kw)
    return Scheduler(BlockManager(num_blocks, block_size, enable_prefix_caching=caching), **opts)


def run_step(s: Scheduler, token: int = 7) -> tuple[SchedulerOutput, list[Sequence]]:
    out = s.schedule()
    sampled = {t.seq_id: token + t.index for item in out.scheduled for t in item.sample_seqs}
    got = s.update(out, sampled)
    s.block_manager.check_invariants()
    return out, got


def plan(out: SchedulerOutput) -> list[tuple[str, int, int, int, int]]:
    """(request, index, start, num_tokens, number sampled) per scheduled item."""
    return [
        (i.seq.request_id, i.seq.index, i.start, i.num_tokens, len(i.sample_seqs))
        for i in out.scheduled
    ]


# -- admission ------------------------------------------------------------------------------
def test_prompt_longer_than_the_context_is_refused() -> None:
    s = make(max_model_len=20, num_blocks=8)
    with pytest.raises(AdmissionError) as info:
        s.add_request("a", list(range(20)), SamplingParams())
    msg = str(info.value)
    assert "20 tokens" in msg and "max_model_len=20" in msg and "holds 32 tokens" in msg
    assert info.value.field == "prompt"
    s.add_request("b", list(range(19)), SamplingParams())  # 19 + 1 fits exactly
    assert s.num_waiting == 1


def test_kv_cache_smaller_than_the_context_is_refused_at_construction() -> None:
    with pytest.raises(
        ValueError,
        match=r"holds 16 tokens \(4 blocks of 4\), fewer than "
        r"max_model_len=17",
    ):
        make(num_blocks=4, max_model_len=17)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(max_num_seqs=0), "max_num_seqs must be a positive integer"),
        (dict(max_num_batched_tokens=-1), "max_num_batched_tokens"),
        (dict(prefill_chunk_size=0), "prefill_chunk_size"),
        (dict(policy="lifo"), "policy must be one of fcfs, priority"),
        (dict(max_waiting=0), "max_waiting"),
    ],
)
def test_bad_construction(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        make(**kwargs)


def test_other_admission_errors() -> None:
    s = make(max_num_seqs=2, max_waiting=2)
    with pytest.raises(AdmissionError, match="empty"):
        s.add_request("e", [], SamplingParams())
    with pytest.raises(AdmissionError, match="token ids"):
        s.add_request("e", [1, -2], SamplingParams())
    with pytest.raises(AdmissionError, match="n=3 completions exceed max_num_seqs=2"):
        s.add_request("n", [1], SamplingParams(n=3))
    s.add_request("a", [1], SamplingParams())
    with pytest.raises(AdmissionError, match="'a' is already in use") as info:
        s.add_request("a", [2], SamplingParams())
    assert info.value.field == "request_id"
    s.add_request("b", [1], SamplingParams())
    with pytest.raises(QueueFullError, match="waiting queue is full"):
        s.add_request("c", [1], SamplingParams())
    with pytest.raises(TypeError, match="SamplingParams"):
        s.add_request("d", [1], {"n": 1})  # type: ignore[arg-type]
    assert s.num_waiting == 2 and set(s.requests) == {"a", "b"}


# -- budgets and chunking -------------------------------------------------------------------
def test_chunked_prefill_samples_only_at_the_end() -> None:
    s = make(prefill_chunk_size=4)
    req = s.add_request("a", list(range(10)), SamplingParams(max_tokens=2))
    seq = req.seqs[0]
    out, got = run_step(s)
    assert plan(out) == [("a", 0, 0, 4, 0)] and got == [] and seq.is_prefill
    out, got = run_step(s)
    assert plan(out) == [("a", 0, 4, 4, 0)] and got == []
    out, got = run_step(s)
    assert plan(out) == [("a", 0, 8, 2, 1)] and got == [seq]
    assert seq.output_token_ids == [7] and seq.num_computed_tokens == 10
    assert not seq.is_prefill and seq.prompt_computed
    out, got = run_step(s)
    assert plan(out) == [("a", 0, 10, 1, 1)] and out.scheduled[0].is_decode
    assert seq.num_computed_tokens == 11 == seq.num_tokens - 1


def test_token_budget_decodes_first_and_shared_with_prefill() -> None:
    s = make(max_num_batched_tokens=10)
    for r in "ab":
        s.add_request(r, [1, 2, 3], SamplingParams())
    out, _ = run_step(s)
    assert plan(out) == [("a", 0, 0, 3, 1), ("b", 0, 0, 3, 1)]
    s.add_request("c", list(range(30)), SamplingParams())
    out, _ = run_step(s)
    # The two decodes come first; the new prompt gets the rest of the budget.
    assert plan(out) == [("a", 0, 3, 1, 1), ("b", 0, 3, 1, 1), ("c", 0, 0, 8, 0)]
    assert out.num_batched_tokens == 10
    out, _ = run_step(s)
    assert plan(out) == [("a", 0, 4, 1, 1), ("b", 0, 4, 1, 1), ("c", 0, 8, 8, 0)]


def test_running_prefill_leaves_room_for_later_decodes() -> None:
    s = make(max_num_batched_tokens=8, caching=False)
    s.add_request("short", [1, 2], SamplingParams(), arrival_time=100.0)
    out, _ = run_step(s)
    assert plan(out) == [("short", 0, 0, 2, 1)]
    s.add_request("long", list(range(40)), SamplingParams(), arrival_time=0.0)
    out, _ = run_step(s)
    assert plan(out) == [("short", 0, 2, 1, 1), ("long", 0, 0, 7, 0)]
    out, _ = run_step(s)
    # "long" ranks first (earlier arrival) but leaves one token of the budget for the decode
    # of "short"; decodes are listed first.
    assert plan(out) == [("short", 0, 3, 1, 1), ("long", 0, 7, 7, 0)]
    assert [i.is_decode for i in out.scheduled] == [True, False]


def test_max_num_seqs() -> None:
    s = make(max_num_seqs=2)
    for r in "abc":
        s.add_request(r, [1, 2], SamplingParams())
    out, _ = run_step(s)
    assert [p[0] for p in plan(out)] == ["a", "b"] and s.num_running == 2 and s.num_waiting == 1
    s.finish(s.requests["a"].seqs[0], FIN)
    out, _ = run_step(s)
    assert [p[0] for p in plan(out)] == ["b", "c"]


# -- n > 1 ------------------------------------------------------------------------------------
def test_n_completions_fork_after_the_prompt_and_copy_on_write() -> None:
    s = make(block_size=4, prefill_chunk_size=4)
    req = s.add_request("a", list(range(6)), SamplingParams(n=3))
    bm = s.block_manager
    out, got = run_step(s)
    assert plan(out) == [("a", 0, 0, 4, 0)]
    out, got = run_step(s)
    assert plan(out) == [("a", 0, 4, 2, 3)]
    assert [t.index for t in out.scheduled[0].sample_seqs] == [0, 1, 2]
    assert [q.output_token_ids for q in req.seqs] == [[7], [8], [9]] and got == req.seqs
    assert req.forked and s.num_running == 3
    assert all(q.block_ids == req.seqs[0].block_ids for q in req.seqs)
    assert bm.num_free_blocks == 30
    shared_full, shared_half = req.seqs[0].block_ids
    out, got = run_step(s)
    # Every completion decodes; two of them copy the shared half-full block first.
    assert sorted(p[1] for p in plan(out)) == [0, 1, 2]
    assert [src for src, _ in out.blocks_to_copy] == [shared_half, shared_half]
    assert {dst for _, dst in out.blocks_to_copy} | {shared_half} == {
        q.block_ids[1] for q in req.seqs
    }
    assert bm.num_free_blocks == 28
    assert len({q.block_ids[1] for q in req.seqs}) == 3
    assert {q.block_ids[0] for q in req.seqs} == {shared_full}
    for q in req.seqs:
        s.finish(q, FIN)
    assert not s.has_unfinished() and bm.num_free_blocks == 32


def test_n_reserves_running_slots() -> None:
    s = make(max_num_seqs=3)
    s.add_request("a", [1, 2], SamplingParams(n=2))
    s.add_request("b", [1, 2], SamplingParams(n=2))
    out, _ = run_step(s)
    assert [p[0] for p in plan(out)] == ["a"]  # b's two completions would make four
    assert s.num_running == 2 and s.num_waiting == 1


# -- prefix cache ---------------------------------------------------------------------------
def test_prefix_cache_across_requests() -> None:
    s = make(block_size=4)
    prompt = list(range(100, 111))  # 11 tokens: two full blocks
    a = s.add_request("a", prompt, SamplingParams())
    run_step(s)
    s.finish(a.seqs[0], FIN)
    b = s.add_request("b", prompt + [5], SamplingParams())
    out, _ = run_step(s)
    assert plan(out) == [("b", 0, 8, 4, 1)]
    assert b.num_cached_tokens == 8
    assert s.prefix_cache_hit_rate == pytest.approx(8 / (11 + 12))
    # A request that wants prompt logprobs computes its whole prompt.
    c = s.add_request("c", prompt, SamplingParams(prompt_logprobs=1))
    out, _ = run_step(s)
    assert ("c", 0, 0, 11, 1) in plan(out) and c.num_cached_tokens == 0
    assert [i.prompt_logprobs for i in out.scheduled if i.seq.request_id == "c"] == [True]


def test_no_cache_when_disabled() -> None:
    s = make(caching=False)
    prompt = list(range(12))
    a = s.add_request("a", prompt, SamplingParams())
    run_step(s)
    s.finish(a.seqs[0], FIN)
    b = s.add_request("b", prompt, SamplingParams())
    out, _ = run_step(s)
    assert plan(out) == [("b", 0, 0, 12, 1)] and b.num_cached_tokens == 0


# -- preemption -----------------------------------------------------------------------------
def test_preemption_by_recompute_resumes_exactly() -> None:
    # 4 blocks of 2 tokens = 8 slots; two sequences of 3 + growth cannot both fit.
    s = make(num_blocks=4, block_size=2, max_model_len=8, caching=False)
    a = s.add_request("a", [1, 2, 3], SamplingParams(), arrival_time=1.0).seqs[0]
    b = s.add_request("b", [4, 5, 6], SamplingParams(), arrival_time=2.0).seqs[0]
    run_step(s)  # both prefilled: 2 blocks each, one token each
    assert a.num_tokens == b.num_tokens == 4 and s.block_manager.num_free_blocks == 0
    out, _ = run_step(s)
    # Position 3 still fits in each one's second block: both decode.
    assert plan(out) == [("a", 0, 3, 1, 1), ("b", 0, 3, 1, 1)]
    out, got = run_step(s)
    # Position 4 needs a new block for each: b (later arrival) is preempted for a.
    assert out.preempted == [b] and plan(out) == [("a", 0, 4, 1, 1)] and got == [a]
    assert b.status is SequenceStatus.WAITING and b.num_computed_tokens == 0
    assert b.block_ids == [] and b.num_preemptions == 1 and s.num_waiting == 1
    assert b.output_token_ids == [7, 7]  # nothing lost
    s.finish(a, FIN)
    out, got = run_step(s)
    # b recomputes its prompt and both outputs, then samples its third token.
    assert plan(out) == [("b", 0, 0, 5, 1)] and got == [b]
    assert b.output_token_ids == [7, 7, 7] and b.num_computed_tokens == 5
    s.finish(b, FIN)
    assert s.block_manager.num_free_blocks == 4 and not s.has_unfinished()


def test_prompt_logprob_rows_are_not_reported_twice_after_preemption() -> None:
    # 8 blocks of 2. hog (7 tokens, 4 blocks) and p (10-token prompt, chunks of 4) both run
    # until hog needs a fifth block at step 3; p, the later arrival, is preempted with 8 of
    # its prompt rows already reported.
    s = make(num_blocks=8, block_size=2, max_model_len=16, caching=False, prefill_chunk_size=4)
    hog = s.add_request("hog", list(range(7)), SamplingParams(), arrival_time=0.0).seqs[0]
    seq = s.add_request(
        "p", list(range(10, 20)), SamplingParams(prompt_logprobs=0), arrival_time=1.0
    ).seqs[0]
    rows: list[int] = []
    preempted: list[Sequence] = []
    while not seq.output_token_ids:
        out, _ = run_step(s)
        preempted += out.preempted
        rows += [
            r
            for i in out.scheduled
            if i.seq is seq and i.prompt_logprobs
            for r in range(i.start, i.end)
        ]
        if hog.num_output_tokens >= 3 and not hog.is_finished:
            s.finish(hog, FIN)
    assert preempted == [seq] and seq.num_preemptions == 1
    assert rows == list(range(10))


# -- priority -------------------------------------------------------------------------------
def test_priority_order_and_preemption_of_lower_priority() -> None:
    s = make(
        num_blocks=4,
        block_size=4,
        max_model_len=16,
        policy="priority",
        max_num_seqs=4,
        caching=False,
    )
    low = s.add_request("low", list(range(10)), SamplingParams(), priority=5).seqs[0]
    run_step(s)
    assert low.status is SequenceStatus.RUNNING and s.block_manager.num_free_blocks == 1
    s.add_request("high", list(range(9)), SamplingParams(), priority=-1)
    out, _ = run_step(s)
    # high needs 3 blocks: low (priority 5 > -1) is preempted to make room.
    assert out.preempted == [low] and ("high", 0, 0, 9, 1) in plan(out)
    assert low.status is SequenceStatus.WAITING
    # Equal priority never preempts; FCFS within a priority.
    s2 = make(num_blocks=4, block_size=4, max_model_len=16, policy="priority", caching=False)
    x = s2.add_request("x", list(range(10)), SamplingParams(), priority=1).seqs[0]
    run_step(s2)
    s2.add_request("y", list(range(9)), SamplingParams(), priority=1)
    out, _ = run_step(s2)
    assert out.preempted == [] and [p[0] for p in plan(out)] == ["x"]
    assert x.status is SequenceStatus.RUNNING


def test_priority_admission_order() -> None:
    s = make(policy="priority", max_num_seqs=1)
    s.add_request("late-urgent", [1], SamplingParams(), priority=0, arrival_time=5.0)
    s.add_request("early", [1], SamplingParams(), priority=3, arrival_time=1.0)
    s.add_request("early-urgent", [1], SamplingParams(), priority=0, arrival_time=2.0)
    order = []
    while s.has_unfinished():
        out, got = run_step(s)
        for seq in got:
            order.append(seq.request_id)
            s.finish(seq, FIN)
    assert order == ["early-urgent", "late-urgent", "early"]


# -- abort, finish, protocol ----------------------------------------------------------------
def test_abort_anywhere_frees_everything() -> None:
    s = make(prefill_chunk_size=4, max_num_seqs=2)
    a = s.add_request("a", list(range(10)), SamplingParams(n=2))
    b = s.add_request("b", [1, 2], SamplingParams())
    run_step(s)  # a mid-prefill, b waiting (slots reserved for a's two completions)
    assert a.seqs[0].num_computed_tokens == 4 and b.seqs[0].status is SequenceStatus.WAITING
    assert s.abort("b") == b.seqs
    assert s.abort("a") == a.seqs
    assert all(q.status is SequenceStatus.FINISHED_ABORTED for q in a.seqs + b.seqs)
    assert all(q.finish_reason == "abort" for q in a.seqs)
    assert s.abort("a") == [] and s.abort("nobody") == []
    assert not s.has_unfinished() and s.num_running == s.num_waiting == 0
    assert s.block_manager.num_free_blocks == 32
    s.block_manager.check_invariants()


def test_abort_between_schedule_and_update() -> None:
    s = make()
    a = s.add_request("a", [1, 2, 3], SamplingParams())
    b = s.add_request("b", [4, 5], SamplingParams())
    out = s.schedule()
    s.abort("a")
    got = s.update(out, {b.seqs[0].seq_id: 9})  # a's token is not needed any more
    assert got == [b.seqs[0]] and a.seqs[0].output_token_ids == []
    s.block_manager.check_invariants()


def test_protocol_errors() -> None:
    s = make()
    s.add_request("a", [1, 2, 3], SamplingParams())
    out = s.schedule()
    with pytest.raises(RuntimeError, match="before update"):
        s.schedule()
    with pytest.raises(ValueError, match="no sampled token for sequence"):
        s.update(out, {})
    s.update(out, {out.scheduled[0].seq.seq_id: 1})
    with pytest.raises(ValueError, match="latest schedule"):
        s.update(out, {out.scheduled[0].seq.seq_id: 1})
    seq = out.scheduled[0].seq
    with pytest.raises(ValueError, match="finished status"):
        s.finish(seq, SequenceStatus.RUNNING)
    s.finish(seq, SequenceStatus.FINISHED_STOPPED, stop_reason=2)
    s.finish(seq, SequenceStatus.FINISHED_LENGTH)  # idempotent: the first status stays
    assert seq.finish_reason == "stop" and seq.stop_reason == 2
    assert s.get_request("a") is None and s.kv_usage == 0.0


# -- reservations of sequences of known length ----------------------------------------------
def _run_to_max_tokens(s: Scheduler, limit: int = 200) -> list[list[str]]:
    """Step until nothing is left, finishing sequences at max_tokens; the running request ids
    of every step."""
    seen = []
    for _ in range(limit):
        if not s.has_unfinished():
            return seen
        _, got = run_step(s)
        seen.append(sorted(seq.request_id for seq in s.running))
        for seq in got:
            if seq.num_output_tokens >= seq.params.max_tokens:
                s.finish(seq, FIN)
    raise AssertionError("did not finish")


def test_known_length_sequences_reserve_their_growth_and_are_never_preempted() -> None:
    # 6 blocks of 2 tokens. Each request: 3 prompt + 5 outputs = 8 tokens = 4 blocks.
    params = SamplingParams(max_tokens=5, ignore_eos=True)
    s = make(num_blocks=6, block_size=2, max_model_len=12, caching=False)
    a = s.add_request("a", [1, 2, 3], params).seqs[0]
    b = s.add_request("b", [4, 5, 6], params).seqs[0]
    assert s.reserved_blocks() == 0
    out, _ = run_step(s)
    # b's prompt (2 blocks) would fit now, but a still grows into 2 more blocks: b waits.
    assert plan(out) == [("a", 0, 0, 3, 1)] and s.num_waiting == 1
    assert s.reserved_blocks() == 2  # a holds 2 of its 4 blocks
    steps = _run_to_max_tokens(s)
    assert s.num_preemptions == 0 and a.num_preemptions == b.num_preemptions == 0
    assert ["a", "b"] not in steps  # never both at once
    assert a.output_token_ids and len(b.output_token_ids) == 5
    assert s.block_manager.num_free_blocks == 6 and s.reserved_blocks() == 0


def test_sequences_of_unknown_length_reserve_nothing_and_are_preempted_as_before() -> None:
    params = SamplingParams(max_tokens=5)  # may stop at EOS: length not known
    s = make(num_blocks=6, block_size=2, max_model_len=12, caching=False)
    s.add_request("a", [1, 2, 3], params)
    s.add_request("b", [4, 5, 6], params)
    out, _ = run_step(s)
    assert plan(out) == [("a", 0, 0, 3, 1), ("b", 0, 0, 3, 1)]  # both admitted at once
    _run_to_max_tokens(s)
    assert s.num_preemptions >= 1  # 2 x 4 blocks do not fit in 6


def test_unknown_length_sequences_do_not_take_reserved_blocks() -> None:
    s = make(num_blocks=6, block_size=2, max_model_len=12, caching=False)
    s.add_request("a", [1, 2, 3], SamplingParams(max_tokens=5, ignore_eos=True))
    run_step(s)  # a holds 2 blocks and reserves 2 more: 2 are free for others
    s.add_request("big", [7, 8, 9, 10, 11], SamplingParams(max_tokens=1))  # needs 3 blocks
    s.add_request("small", [7, 8, 9], SamplingParams(max_tokens=1))  # would need 2
    out, _ = run_step(s)
    assert plan(out) == [("a", 0, 3, 1, 1)]  # big waits (fcfs: small queues behind it)
    assert s.num_waiting == 2


def test_reservation_follows_finish_and_abort() -> None:
    params = SamplingParams(max_tokens=5, ignore_eos=True)
    s = make(num_blocks=6, block_size=2, max_model_len=12, caching=False)
    s.add_request("a", [1, 2, 3], params)
    s.add_request("b", [4, 5, 6], params)
    run_step(s)
    assert s.reserved_blocks() == 2 and s.num_waiting == 1
    s.abort("a")
    assert s.reserved_blocks() == 0
    out, _ = run_step(s)
    assert plan(out) == [("b", 0, 0, 3, 1)]
