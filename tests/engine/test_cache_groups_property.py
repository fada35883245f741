"""The scheduler over a KVCacheManager of three cache groups (full attention, a sliding window,
a recurrent state; or the first two with prefix caching), driven by a fake model over simulated caches, with random admissions,
aborts, chunk sizes, priorities (preemptions) and ``n > 1`` forks.

The fake model reads what a real one would: each computed position reads every earlier token
from the full group's blocks and the tokens inside its window from the sliding group's blocks
(a block given back too early, a wrong table or a missed copy-on-write shows as a wrong token
read); its state slot must hold the digest of exactly the tokens before the step (a slot not
zeroed when taken, or not copied at a fork, shows there); the token it samples depends on the
digest. Outputs are compared with each completion computed alone. Every step the invariants of
every group hold; at the end every block of every group and every state slot is free.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tallow.engine.kv_manager import KVCacheManager, PagedGroupSize
from tallow import SamplingParams
from tallow.engine.scheduler import Scheduler
from tallow.engine.sequence import SequenceStatus

VOCAB = 19
MASK = (1 << 64) - 1
BLOCK, WINDOW, MAX_LEN = 4, 10, 64


def mix(a: int, b: int) -> int:
    z = (a * 0x9E3779B97F4A7C15 + b + 0x632BE59BD9B4E019) & MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    return z ^ (z >> 31)


def digest(tokens: list[int]) -> int:
    state = 0
    for tok in tokens:
        state = mix(state, tok)
    return state


def next_token(state: int, seed: int, index: int, step: int) -> int:
    return mix(mix(state, seed * 31 + index), step) % VOCAB


def alone(prompt: list[int], seed: int, index: int, max_tokens: int) -> list[int]:
    tokens, out = list(prompt), []
    while len(out) < max_tokens and len(tokens) < MAX_LEN:
        tok = next_token(digest(tokens), seed, index, len(out))
        tokens.append(tok)
        out.append(tok)
    return out


class FakeModel:
    def __init__(self, manager: KVCacheManager, num_slots: int) -> None:
        self.m = manager
        self.stateful = bool(manager.states)
        self.kv = [[[None] * BLOCK for _ in range(g.num_total_blocks + 1)] for g in manager.groups]
        self.states = [0] * (num_slots + 1)

    def run(self, out, seeds: dict[str, int]) -> dict[int, int]:
        for copy in out.blocks_to_copy:
            src, dst, g = copy if len(copy) == 3 else (*copy, 0)
            self.kv[g][dst] = list(self.kv[g][src])
        for _, src, dst in out.state_ops:
            self.states[dst] = 0 if src < 0 else self.states[src]
        sampled = {}
        for item in out.scheduled:
            seq = item.seq
            tokens = seq.all_token_ids
            slot = seq.state_slots[0] if self.stateful else len(self.states) - 1
            if not self.stateful:  # no state group: the digest stands in for attention
                self.states[slot] = digest(tokens[: item.start])
            assert self.states[slot] == digest(tokens[: item.start]), "state slot not in step"
            for p in range(item.start, item.end):
                full, sliding = seq.block_tables[0], seq.block_tables[1]
                for k in range(p):  # attention over the whole context
                    assert self.kv[0][full[k // BLOCK]][k % BLOCK] == tokens[k]
                for k in range(max(0, p - WINDOW + 1), p):  # and over the window
                    block = sliding[k // BLOCK]
                    assert block != self.m.groups[1].null_block, "a block in the window is gone"
                    assert self.kv[1][block][k % BLOCK] == tokens[k]
                self.kv[0][full[p // BLOCK]][p % BLOCK] = tokens[p]
                self.kv[1][sliding[p // BLOCK]][p % BLOCK] = tokens[p]
                self.states[slot] = mix(self.states[slot], tokens[p])
            for target in item.sample_seqs:
                sampled[target.seq_id] = next_token(
                    self.states[slot], seeds[seq.request_id], target.index, target.num_output_tokens
                )
        return sampled


jobs = st.lists(
    st.tuples(
        st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=30),  # prompt
        st.integers(1, 2),  # n
        st.integers(1, 14),  # max_tokens
        st.integers(0, 2),  # priority
        st.integers(0, 12),  # arrives at step
        st.one_of(st.none(), st.integers(1, 25)),  # aborted at step
    ),
    min_size=1,
    max_size=7,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    jobs=jobs,
    full_blocks=st.integers(16, 40),
    chunk=st.integers(1, 12),
    budget=st.integers(4, 24),
    policy=st.sampled_from(["fcfs", "priority"]),
    stateful=st.booleans(),
)
def test_every_group_balances_under_random_workloads(
    jobs, full_blocks, chunk, budget, policy, stateful
):
    max_seqs = 4
    # with a state group prefix caching is refused; without one it is on
    manager = KVCacheManager(
        [PagedGroupSize(full_blocks), PagedGroupSize(12, WINDOW)],
        block_size=BLOCK,
        enable_prefix_caching=True,
        state_slots=[max_seqs] if stateful else [],
        max_step_tokens=budget,
    )
    scheduler = Scheduler(
        manager,
        max_num_seqs=max_seqs,
        max_num_batched_tokens=budget,
        prefill_chunk_size=chunk,
        max_model_len=MAX_LEN,
        policy=policy,
    )
    model = FakeModel(manager, max_seqs)
    seeds, outputs, expected, aborted = {}, {}, {}, set()
    step = 0
    while step < 400:
        for j, (prompt, n, max_tokens, priority, arrive, abort_at) in enumerate(jobs):
            rid = f"r{j}"
            if arrive == step:
                seeds[rid] = j
                params = SamplingParams(max_tokens=max_tokens, n=n, temperature=0.0)
                scheduler.add_request(rid, prompt, params, priority=priority)
                outputs[rid] = [[] for _ in range(n)]
                expected[rid] = [alone(prompt, j, i, max_tokens) for i in range(n)]
            if abort_at == step and scheduler.abort(rid):
                aborted.add(rid)
        if step > 12 and not scheduler.has_unfinished():
            break
        out = scheduler.schedule()
        sampled = model.run(out, seeds)
        for seq in scheduler.update(out, sampled):
            outputs[seq.request_id][seq.index].append(seq.output_token_ids[-1])
            if seq.num_output_tokens >= seq.params.max_tokens or seq.num_tokens >= MAX_LEN:
                scheduler.finish(seq, SequenceStatus.FINISHED_LENGTH)
        manager.check_invariants()
        if stateful:
            held = sum(1 for s in scheduler.running if s.state_slots and s.state_slots[0] >= 0)
            assert held == max_seqs - manager.num_free_state_slots()
        step += 1
    assert not scheduler.has_unfinished()
    for rid, outs in outputs.items():
        for got, want in zip(outs, expected[rid]):
            if rid in aborted:
                assert got == want[: len(got)]
            else:
                assert got == want
    for group in manager.groups:
        assert group.num_free_blocks == group.num_total_blocks
    if stateful:
        assert manager.num_free_state_slots() == max_seqs
    manager.check_invariants()
