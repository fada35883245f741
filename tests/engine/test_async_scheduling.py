"""Async scheduling (``scheduler.async_scheduling``): the engine plans and launches step N+1
while step N runs, feeding N's sampled tokens into N+1 on the device.

The oracle is the sync engine on the same tiny model: every test runs both and asserts the same
token ids, text, finish reasons and logprobs, and that no KV block leaked. On a CPU a placeholder
token that reached the model would fail the embedding lookup (it is -1), so matching outputs
also show that every fed token was patched in on the device.
"""

from __future__ import annotations

import contextlib
import io
import json

import pytest

from tallow import LLM, SamplingParams
from tallow.engine.block_manager import BlockManager
from tallow.engine.core import CoreOutput
from tallow.engine.llm_engine import LLMEngine
from tallow.engine.model_runner import PendingStep
from tallow.engine.outputs import RequestOutput
from tallow.engine.scheduler import Scheduler
from tallow.engine.sequence import PENDING_TOKEN, SequenceStatus

PROMPTS = [
    "The quick brown fox",
    "def add(a, b):",
    "Paged attention stores keys and values in fixed-size blocks. Continuous batching",
    "日本語",
]
BASE = dict(dtype="float32", device="cpu", num_blocks=256, block_size=4)
PHASES = {"schedule", "launch", "overlapped", "wait", "post"}


def make(path, async_scheduling: bool, **kw) -> LLM:
    return LLM(model=str(path), **{**BASE, **kw}, async_scheduling=async_scheduling)


def free_blocks(llm: LLM) -> int:
    return llm.engine.core.scheduler.block_manager.num_free_blocks


def assert_same_logprobs(a, b) -> None:
    assert (a is None) == (b is None)
    if a is None:
        return
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert (x is None) == (y is None)
        if x is None:
            continue
        assert x.keys() == y.keys()
        for tok in x:
            assert x[tok].logprob == pytest.approx(y[tok].logprob, abs=1e-5)
            assert x[tok].rank == y[tok].rank and x[tok].decoded_token == y[tok].decoded_token


def assert_same(sync: list[RequestOutput], asyn: list[RequestOutput]) -> None:
    assert len(sync) == len(asyn)
    for a, b in zip(sync, asyn):
        assert a.finished and b.finished
        assert_same_logprobs(a.prompt_logprobs, b.prompt_logprobs)
        assert len(a.outputs) == len(b.outputs)
        for x, y in zip(a.outputs, b.outputs):
            assert (x.token_ids, x.text, x.finish_reason, x.stop_reason) == (
                y.token_ids,
                y.text,
                y.finish_reason,
                y.stop_reason,
            ), a.request_id
            assert_same_logprobs(x.logprobs, y.logprobs)


def run_both(path, prompts, params, **kw) -> tuple[list[RequestOutput], LLM]:
    """Generate with the sync and the async engine; assert identical outputs and no leak.
    Returns the outputs and the async LLM."""
    outs = {}
    for mode in (False, True):
        llm = make(path, mode, **kw)
        start = free_blocks(llm)
        outs[mode] = llm.generate(prompts, params)
        bm = llm.engine.core.scheduler.block_manager
        bm.check_invariants()
        assert free_blocks(llm) == start == bm.num_total_blocks, "KV blocks leaked"
        assert not llm.engine.core.has_unfinished()
    assert_same(outs[False], outs[True])
    return outs[True], llm


def seeded(seed: int, **kw) -> SamplingParams:
    return SamplingParams(temperature=kw.pop("temperature", 1.0), seed=seed, **kw)


# -- identical outputs ----------------------------------------------------------------------
def test_greedy_and_seeded_rows_overlap_every_step(tiny_llama):
    params = [
        SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True),
        seeded(1, top_p=0.9, max_tokens=18, ignore_eos=True),
        seeded(2, temperature=0.7, top_k=20, max_tokens=16, ignore_eos=True),
        seeded(3, min_p=0.1, max_tokens=14, ignore_eos=True),
    ]
    out, llm = run_both(tiny_llama, PROMPTS, params)
    core = llm.engine.core
    # plain rows never wait: every step but the first was launched with another in flight
    assert core.steps == 20 and core.overlapped_steps == core.steps - 1
    assert [len(o.outputs[0].token_ids) for o in out] == [20, 18, 16, 14]


def test_mixed_batch_with_chunked_prefill(tiny_llama):
    prompts = PROMPTS + [PROMPTS[2] * 3, "x"]
    params = [
        SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True),
        seeded(7, max_tokens=12, ignore_eos=True),
    ] * 3
    _, llm = run_both(tiny_llama, prompts, params, prefill_chunk_size=3, max_num_batched_tokens=8)
    assert llm.engine.core.overlapped_steps == llm.engine.core.steps - 1


def test_n_greater_than_one_forks(tiny_llama):
    params = [
        seeded(5, n=3, max_tokens=10, ignore_eos=True),
        SamplingParams(n=2, temperature=0.0, max_tokens=8, ignore_eos=True),
        seeded(9, n=2, top_k=5, max_tokens=6, stop_token_ids=[3, 7, 11]),
    ]
    out, llm = run_both(tiny_llama, PROMPTS[:3], params, prefill_chunk_size=5)
    assert len({tuple(c.token_ids) for c in out[0].outputs}) == 3
    core = llm.engine.core
    assert 0 < core.overlapped_steps < core.steps - 1  # fork steps are collected first


def test_prefix_cache_hits(tiny_llama):
    shared = PROMPTS[2] * 3
    prompts = [shared + " one", shared + " two", shared, PROMPTS[0]]
    params = [
        SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True),
        seeded(11, max_tokens=10, ignore_eos=True),
    ] * 2
    outs = {}
    for mode in (False, True):
        llm = make(tiny_llama, mode)
        first = llm.generate(prompts, params)  # hits within the batch, as scheduled
        second = llm.generate(prompts, params)  # hits on blocks the first batch registered
        assert all(o.num_cached_tokens > 0 for o in second[:3])
        assert free_blocks(llm) == llm.engine.core.scheduler.block_manager.num_total_blocks
        outs[mode] = (first, second)
    assert_same(outs[False][0], outs[True][0])
    assert_same(outs[False][1], outs[True][1])
    assert [o.num_cached_tokens for o in outs[False][1]] == [
        o.num_cached_tokens for o in outs[True][1]
    ]
    assert_same(outs[True][0], outs[True][1])


@pytest.mark.parametrize("caching", [False, True])
def test_preemption_under_a_tiny_kv_budget(tiny_llama, caching):
    # min_tokens, not ignore_eos: sequences of known length reserve their KV and are not
    # preempted (see tallow.engine.scheduler)
    params = [
        SamplingParams(temperature=0.0, max_tokens=40, min_tokens=40),
        seeded(21, max_tokens=40, min_tokens=40),
    ] * 2
    _, llm = run_both(
        tiny_llama, PROMPTS, params, num_blocks=40, enable_prefix_caching=caching, max_model_len=128
    )
    core = llm.engine.core
    assert core.scheduler.num_preemptions > 0
    # no step waits for its predecessor (a step after one that scheduled nothing, because
    # its only candidate was preempted, has nothing in flight to overlap)
    assert core.overlapped_steps >= 0.9 * core.steps


def test_stops_eos_stop_tokens_stop_strings_min_and_max_tokens(tiny_llama):
    base = (
        make(tiny_llama, False)
        .generate(PROMPTS[1], SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True))[0]
        .outputs[0]
    )
    stop_id = base.token_ids[4]
    stop_str = base.text[3:6]
    eos = 0
    params = [
        SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True, stop_token_ids=[stop_id]),
        SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True, stop=[stop_str]),
        SamplingParams(
            temperature=0.0,
            max_tokens=20,
            ignore_eos=True,
            stop=[stop_str],
            include_stop_str_in_output=True,
        ),
        # EOS forced by a logit bias, held back by min_tokens: these rows still overlap
        SamplingParams(temperature=0.0, max_tokens=20, logit_bias={eos: 100.0}, min_tokens=3),
        seeded(4, max_tokens=20, logit_bias={eos: 100.0}, min_tokens=5),
        SamplingParams(temperature=0.0, max_tokens=1),
        SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True),
        seeded(8, max_tokens=5, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=None, ignore_eos=True),  # to max_model_len
    ]
    prompts = (
        [PROMPTS[1]] * 3
        + [PROMPTS[0], PROMPTS[3]]
        + [PROMPTS[3], PROMPTS[0], PROMPTS[1], PROMPTS[2]]
    )
    out, llm = run_both(tiny_llama, prompts, params, max_model_len=48)
    finish = [o.outputs[0].finish_reason for o in out]
    assert finish == ["stop"] * 5 + ["length"] * 4
    assert out[0].outputs[0].stop_reason == stop_id
    assert out[1].outputs[0].stop_reason == stop_str
    assert out[3].outputs[0].token_ids[-1] == eos and len(out[3].outputs[0].token_ids) == 4
    assert out[4].outputs[0].token_ids[-1] == eos and len(out[4].outputs[0].token_ids) == 6
    assert [len(o.outputs[0].token_ids) for o in out[5:8]] == [1, 2, 5]
    assert len(out[8].prompt_token_ids) + len(out[8].outputs[0].token_ids) == 48
    assert llm.engine.core.overlapped_steps == llm.engine.core.steps - 1


def test_logprobs_and_prompt_logprobs(tiny_llama):
    params = [
        SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, logprobs=3),
        seeded(3, max_tokens=8, ignore_eos=True, logprobs=0),
        SamplingParams(temperature=0.0, max_tokens=4, prompt_logprobs=2),
        SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True),
    ]
    out, llm = run_both(tiny_llama, PROMPTS, params, prefill_chunk_size=4)
    assert len(out[0].outputs[0].logprobs) == 8 and out[2].prompt_logprobs[0] is None
    core = llm.engine.core
    assert 0 < core.overlapped_steps < core.steps - 1  # logprob steps are collected first


def test_penalties(tiny_llama):
    params = [
        SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, repetition_penalty=1.5),
        seeded(2, max_tokens=16, ignore_eos=True, frequency_penalty=1.0),
        seeded(6, max_tokens=16, ignore_eos=True, presence_penalty=1.5, top_k=30),
        SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True),
    ]
    _, llm = run_both(tiny_llama, PROMPTS, params)
    core = llm.engine.core
    # steps with penalty rows are collected first; after those finish, greedy overlaps
    assert 0 < core.overlapped_steps < core.steps - 1


# -- requests arriving, streaming, aborts ---------------------------------------------------
def drive(
    engine: LLMEngine,
    arrivals: dict[int, list[tuple[str, str, SamplingParams]]],
    aborts: dict[int, str] | None = None,
) -> tuple[dict[str, RequestOutput], dict[str, list[RequestOutput]]]:
    """Step an engine, adding requests and aborting them at given step numbers; return the
    final output and the stream of outputs of each request."""
    final: dict[str, RequestOutput] = {}
    streams: dict[str, list[RequestOutput]] = {}
    step = 0
    while step <= max(arrivals) or engine.has_unfinished():
        for rid, prompt, params in arrivals.get(step, []):
            engine.add_request(rid, prompt, params)
        if aborts and step in aborts:
            out = engine.abort(aborts[step])
            if out is not None:
                final[out.request_id] = out
        for out in engine.step():
            streams.setdefault(out.request_id, []).append(out)
            if out.finished:
                final[out.request_id] = out
        step += 1
        assert step < 1000
    return final, streams


def test_requests_arriving_while_others_decode_stream_like_sync(tiny_llama):
    greedy = SamplingParams(temperature=0.0, max_tokens=14, ignore_eos=True)
    arrivals = {
        0: [("a", PROMPTS[0], greedy)],
        3: [
            ("b", PROMPTS[1], seeded(1, max_tokens=10, ignore_eos=True)),
            ("c", PROMPTS[2], SamplingParams(temperature=0.0, max_tokens=6, stop=["e"])),
        ],
        7: [("d", PROMPTS[3], seeded(2, n=2, max_tokens=9, ignore_eos=True))],
        8: [("e", PROMPTS[0] * 2, greedy)],
    }
    results = {}
    for mode in (False, True):
        llm = make(tiny_llama, mode, prefill_chunk_size=4)
        final, streams = drive(llm.engine, arrivals)
        for rid, stream in streams.items():  # cumulative, each output extends the last
            for before, after in zip(stream, stream[1:]):
                for x, y in zip(before.outputs, after.outputs):
                    assert y.token_ids[: len(x.token_ids)] == x.token_ids
                    assert y.text.startswith(x.text)
            assert stream[-1].finished and not any(o.finished for o in stream[:-1])
        assert free_blocks(llm) == llm.engine.core.scheduler.block_manager.num_total_blocks
        results[mode] = final
    assert results[False].keys() == results[True].keys() == set("abcde")
    assert_same([results[False][k] for k in "abcde"], [results[True][k] for k in "abcde"])


def test_abort_while_the_step_is_in_flight(tiny_llama):
    greedy = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    arrivals = {0: [(r, p, greedy) for r, p in zip("abc", PROMPTS)]}
    results = {}
    for mode in (False, True):
        llm = make(tiny_llama, mode)
        engine = llm.engine
        for rid, prompt, params in arrivals[0]:
            engine.add_request(rid, prompt, params)
        for _ in range(6):
            engine.step()
        if mode:  # "b" is part of the step the device runs now
            in_flight = engine.core._in_flight
            assert in_flight is not None
            assert "b" in {i.seq.request_id for i in in_flight.plan.scheduled}
        aborted = engine.abort("b")
        assert aborted.finished and aborted.outputs[0].finish_reason == "abort"
        final, _ = drive(engine, {0: []})
        assert "b" not in final and final.keys() == {"a", "c"}
        assert free_blocks(llm) == llm.engine.core.scheduler.block_manager.num_total_blocks
        results[mode] = final
    assert_same([results[False][k] for k in "ac"], [results[True][k] for k in "ac"])


def test_sequence_finished_at_n_is_dropped_from_n_plus_1(tiny_llama):
    """A stop token at step N: the sequence is already in step N+1; its blocks (the slot for
    N+1 included) are freed at once and its N+1 token never appears."""
    base = (
        make(tiny_llama, False)
        .generate(PROMPTS[0], SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True))[0]
        .outputs[0]
    )
    stop_id = base.token_ids[5]
    llm = make(tiny_llama, True)
    engine, core = llm.engine, llm.engine.core
    bm = core.scheduler.block_manager
    engine.add_request(
        "s", PROMPTS[0], SamplingParams(temperature=0.0, max_tokens=12, stop_token_ids=[stop_id])
    )
    engine.add_request(
        "long", PROMPTS[1], SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    )
    seq = core.scheduler.get_request("s").seqs[0]
    saw_drop = False
    final = {}
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                final[out.request_id] = out
        bm.check_invariants()
        in_flight = core._in_flight
        if (
            seq.is_finished
            and in_flight is not None
            and any(i.seq is seq for i in in_flight.plan.scheduled)
        ):
            saw_drop = True
            assert seq.block_ids == [] and seq.num_pending_tokens == 0
            assert PENDING_TOKEN not in seq.output_token_ids
    assert saw_drop
    index = base.token_ids.index(stop_id)
    assert final["s"].outputs[0].token_ids == base.token_ids[: index + 1]
    assert seq.output_token_ids == base.token_ids[: index + 1]
    assert bm.num_free_blocks == bm.num_total_blocks


# -- prefix-cache registration waits for known tokens ----------------------------------------
def test_blocks_with_a_pending_token_are_not_hashed():
    bm = BlockManager(16, 4)
    s = Scheduler(
        bm, max_num_seqs=4, max_num_batched_tokens=64, prefill_chunk_size=None, max_model_len=32
    )
    seq = s.add_request("a", [1, 2, 3, 4, 5, 6, 7], SamplingParams(max_tokens=8)).seqs[0]
    first = s.advance(s.schedule())  # computes 7 prompt tokens, samples token 8 (pending)
    assert seq.all_token_ids[-1] == PENDING_TOKEN and seq.num_known_tokens == 7
    second = s.advance(s.schedule())  # computes the pending token: block 1 is full
    assert seq.num_computed_tokens == 8 and seq.num_pending_tokens == 2
    bm.mark_computed(seq)  # only blocks of known tokens may be registered
    assert bm.num_cached_blocks == 1
    with pytest.raises(ValueError, match="known tokens"):
        bm._block_hash(seq, 1)
    assert bm.get_prefix_hits(seq) == [seq.block_ids[0]]
    s.commit(first, {seq.seq_id: 9})
    assert seq.all_token_ids[7] == 9 and seq.num_pending_tokens == 1
    assert bm.num_cached_blocks == 1  # step 1 computed only 7 tokens
    s.commit(second, {seq.seq_id: 10})
    assert bm.num_cached_blocks == 2 and seq.output_token_ids == [9, 10]
    bm.check_invariants()
    s.finish(seq, SequenceStatus.FINISHED_LENGTH)
    assert bm.num_free_blocks == 16


def test_finish_drops_pending_tokens_and_a_length_bound_sequence_is_not_rescheduled():
    bm = BlockManager(16, 4)
    s = Scheduler(
        bm, max_num_seqs=4, max_num_batched_tokens=64, prefill_chunk_size=None, max_model_len=32
    )
    seq = s.add_request("a", [1, 2, 3], SamplingParams(max_tokens=1)).seqs[0]
    other = s.add_request("b", [4, 5], SamplingParams(max_tokens=5)).seqs[0]
    first = s.advance(s.schedule())
    plan = s.schedule()  # "a" ends by length when its token arrives: nothing more to compute
    assert [i.seq for i in plan.scheduled] == [other]
    second = s.advance(plan)
    s.abort("b")  # aborted while two of its steps are in flight
    assert other.output_token_ids == [] and other.block_ids == []
    assert [n.seq for n in s.commit(first, {seq.seq_id: 7, other.seq_id: 8})] == [seq]
    assert s.commit(second, {other.seq_id: 9}) == []
    s.finish(seq, SequenceStatus.FINISHED_LENGTH)
    assert seq.output_token_ids == [7] and bm.num_free_blocks == 16
    bm.check_invariants()


# -- timings -----------------------------------------------------------------------------------
def greedy_steps(engine: LLMEngine, prompt: str, max_tokens: int) -> list[CoreOutput]:
    """Run one greedy request to its end; what each step call reported."""
    engine.add_request(
        "t", prompt, SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    )
    outs: list[CoreOutput] = []
    while engine.has_unfinished():
        engine.step()
        assert engine.last_step is not None
        outs.append(engine.last_step)
    assert sum(len(o.updates) for o in outs) == max_tokens
    return outs


def test_timings_keys_and_host_time(tiny_llama, monkeypatch):
    llm = make(tiny_llama, True)
    engine = llm.engine
    engine.core.trace_steps()
    outs = greedy_steps(engine, PROMPTS[0], 6)
    assert not outs[0].updates  # the first call only launches
    for o in outs:
        assert set(o.timings) <= PHASES and o.step_time >= sum(o.timings.values()) - 1e-9
        # on a CPU the device is never busy after a launch returns: nothing is hidden
        assert o.hidden == set()
        assert o.host_time == pytest.approx(
            sum(o.timings.get(k, 0.0) for k in ("schedule", "launch", "post"))
        )
    assert {"schedule", "launch", "overlapped", "wait", "post"} == set(outs[2].timings)
    # As on a GPU whose device is still busy: planning and post-processing are hidden.
    monkeypatch.setattr(PendingStep, "is_done", lambda self: False)
    engine.add_request(
        "u", PROMPTS[1], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    )
    engine.step()
    engine.step()
    out = engine.last_step
    assert out.hidden == {"schedule", "launch", "post"} and out.host_time == 0.0
    assert out.timings["schedule"] > 0 and out.timings["wait"] >= 0
    while engine.has_unfinished():
        engine.step()


def test_sync_mode_timings_unchanged(tiny_llama):
    llm = make(tiny_llama, False)
    engine = llm.engine
    engine.core.trace_steps()
    engine.add_request(
        "t", PROMPTS[0], SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    )
    engine.step()
    out = engine.last_step
    assert len(out.updates) == 1 and set(out.timings) == PHASES and out.hidden == set()
    assert out.host_time == pytest.approx(
        out.timings["schedule"] + out.timings["launch"] + out.timings["post"]
    )
    while engine.has_unfinished():
        engine.step()
    assert llm.engine.core.overlapped_steps == 0


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_steps_are_not_timed_by_default(tiny_llama, monkeypatch, async_scheduling):
    # Off, the tracer records nothing and never asks the device whether a step is done.
    asked: list[PendingStep] = []
    is_done = PendingStep.is_done
    monkeypatch.setattr(PendingStep, "is_done", lambda self: asked.append(self) or is_done(self))
    llm = make(tiny_llama, async_scheduling)
    engine = llm.engine
    assert not engine.core.tracer.enabled
    for o in greedy_steps(engine, PROMPTS[0], 5):
        assert o.timings == {} and o.hidden == set() and o.step_time == 0.0
        assert o.host_time == 0.0
    assert asked == []
    # turned on, then off again: only the steps in between are timed
    engine.core.trace_steps()
    engine.add_request(
        "u", PROMPTS[1], SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    )
    engine.step()
    engine.step()
    assert engine.last_step.timings and engine.last_step.step_time > 0
    engine.core.trace_steps(False)
    engine.step()
    assert engine.last_step.timings == {} and engine.last_step.step_time == 0.0
    while engine.has_unfinished():
        engine.step()


# -- configuration ---------------------------------------------------------------------------
def test_config_option_flag_and_env():
    from tallow.cli import main
    from tallow.config import TallowConfig, load_config

    default = TallowConfig().scheduler.async_scheduling
    assert isinstance(default, bool)
    assert load_config(["--no-async-scheduling"], env={}).scheduler.async_scheduling is False
    assert load_config(["--async-scheduling"], env={}).scheduler.async_scheduling is True
    env = {"TALLOW_SCHEDULER__ASYNC_SCHEDULING": "false"}
    assert load_config([], env=env).scheduler.async_scheduling is False
    with contextlib.redirect_stdout(io.StringIO()) as out:
        assert main(["config", "show", "--json", "--no-async-scheduling"]) == 0
    assert json.loads(out.getvalue())["scheduler"]["async_scheduling"] is False
    with contextlib.redirect_stdout(io.StringIO()) as out:
        assert main(["config", "show"]) == 0
    assert f"async_scheduling: {str(default).lower()}" in out.getvalue()


def test_builder_passes_the_option(tiny_llama):
    assert make(tiny_llama, True).engine.core.async_scheduling is True
    assert make(tiny_llama, False).engine.core.async_scheduling is False
