"""BlockManager: accounting, copy-on-write, prefix cache with chained hashes and LRU eviction."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tallow.engine.block_manager import BlockManager, NoFreeBlocksError, chain_hash
from tallow import SamplingParams
from tallow.engine.sequence import Sequence


def make_seq(tokens: list[int], request_id: str = "r", index: int = 0) -> Sequence:
    return Sequence(
        request_id=request_id, index=index, prompt_token_ids=tokens, params=SamplingParams()
    )


def compute(bm: BlockManager, seq: Sequence, n: int) -> list[tuple[int, int]]:
    """What the scheduler does for one step of n tokens, then update."""
    copies = bm.append_slots(seq, n)
    seq.num_computed_tokens += n
    bm.mark_computed(seq)
    bm.check_invariants()
    return copies


def test_allocation_and_exact_accounting() -> None:
    bm = BlockManager(10, 4)
    a, b = make_seq(list(range(10))), make_seq(list(range(100, 103)))
    assert bm.can_allocate(a, 10) and bm.num_free_blocks == 10
    compute(bm, a, 6)
    assert len(a.block_ids) == 2 and bm.num_free_blocks == 8
    compute(bm, a, 4)
    assert len(a.block_ids) == 3 and bm.usage == pytest.approx(0.3)
    compute(bm, b, 3)
    assert bm.num_free_blocks == 6
    assert set(a.block_ids).isdisjoint(b.block_ids)
    bm.free(a)
    bm.free(b)
    bm.check_invariants()
    assert bm.num_free_blocks == 10 and a.block_ids == [] and bm.usage == 0.0


def test_exhaustion() -> None:
    bm = BlockManager(2, 4)
    seq = make_seq(list(range(12)))
    assert bm.can_allocate(seq, 8)
    assert not bm.can_allocate(seq, 9)
    with pytest.raises(NoFreeBlocksError, match="needs 3 KV blocks, 2 are free"):
        bm.append_slots(seq, 9)
    bm.check_invariants()
    assert bm.num_free_blocks == 2


def test_fork_and_copy_on_write() -> None:
    bm = BlockManager(8, 4)
    parent = make_seq(list(range(6)))
    compute(bm, parent, 6)  # blocks: [full, half]
    children = [make_seq(list(range(6)), index=i) for i in (1, 2)]
    for child in children:
        bm.fork(parent, child)
        assert child.block_ids == parent.block_ids
        assert child.num_computed_tokens == 6
    bm.check_invariants()
    assert [bm.ref_count(b) for b in parent.block_ids] == [3, 3]
    assert bm.num_free_blocks == 6
    shared_full, shared_half = parent.block_ids
    # Each sequence appends one token and writes position 6, in the shared half block.
    for seq, tok in ((children[0], 40), (children[1], 41), (parent, 42)):
        seq.append_token(tok)
    assert bm.can_allocate(children[0], 1)
    copies0 = compute(bm, children[0], 1)
    assert copies0 == [(shared_half, children[0].block_ids[1])]
    copies1 = compute(bm, children[1], 1)
    assert copies1 == [(shared_half, children[1].block_ids[1])]
    # The last holder writes in place: no copy.
    assert compute(bm, parent, 1) == []
    assert parent.block_ids[1] == shared_half and bm.ref_count(shared_half) == 1
    assert bm.ref_count(shared_full) == 3  # the full block is never written, stays shared
    assert bm.num_free_blocks == 4
    for seq in (parent, *children):
        bm.free(seq)
        bm.check_invariants()
    assert bm.num_free_blocks == 8


def test_fork_refuses_a_child_with_other_tokens() -> None:
    bm = BlockManager(4, 4)
    parent = make_seq([1, 2, 3])
    compute(bm, parent, 3)
    with pytest.raises(ValueError, match="does not share"):
        bm.fork(parent, make_seq([1, 2, 9]))


def test_prefix_cache_hit_after_free_and_chaining() -> None:
    bm = BlockManager(16, 4)
    prompt = list(range(1, 11))  # 2 full blocks + 2 tokens
    a = make_seq(prompt)
    assert bm.allocate_prefix(a) == 0
    compute(bm, a, 10)
    assert bm.num_cached_blocks == 2
    bm.free(a)
    assert bm.num_free_blocks == 16  # cached blocks are evictable, hence free
    b = make_seq(prompt + [77])
    hits = bm.get_prefix_hits(b)
    assert hits == a_blocks_of(bm, prompt)
    assert bm.can_allocate(b, 3, hits)
    assert bm.allocate_prefix(b, hits) == 8
    assert b.num_computed_tokens == 8 and b.block_ids == hits
    bm.check_invariants()
    assert bm.num_free_blocks == 14
    # Same second block, different first block: the chain does not match.
    c = make_seq([9, 9, 9, 9] + prompt[4:])
    assert bm.get_prefix_hits(c) == []
    assert bm.hit_rate == pytest.approx(8 / (10 + 11))


def a_blocks_of(bm: BlockManager, prompt: list[int]) -> list[int]:
    """The cached blocks of prompt's full blocks, found through the cache's own keys."""
    out, parent = [], None
    for i in range(len(prompt) // bm.block_size):
        parent = chain_hash(parent, prompt[i * bm.block_size : (i + 1) * bm.block_size])
        out.append(bm._cache[parent])
    return out


def test_last_token_is_always_computed() -> None:
    bm = BlockManager(8, 4)
    prompt = list(range(8))  # exactly two blocks
    a = make_seq(prompt)
    compute(bm, a, 8)
    assert bm.num_cached_blocks == 2
    b = make_seq(prompt)
    # Only the first block counts: the second holds the last token, which must be computed.
    assert len(bm.get_prefix_hits(b)) == 1
    assert bm.allocate_prefix(b) == 4
    assert bm.can_allocate(b, 4)
    copies = compute(bm, b, 4)
    assert copies == [] and b.block_ids[1] != a.block_ids[1]
    # The duplicate full block is not registered: the first copy stays canonical.
    assert not bm.is_cached(b.block_ids[1]) and bm.num_cached_blocks == 2
    bm.free(a)
    bm.free(b)
    bm.check_invariants()
    assert bm.num_free_blocks == 8


def test_evictable_blocks_count_as_free_but_not_for_their_own_hit() -> None:
    bm = BlockManager(3, 4)
    a = make_seq(list(range(9)))
    compute(bm, a, 9)
    bm.free(a)  # two cached (evictable) blocks + one free
    b = make_seq(list(range(9)) + [5, 5, 5])
    hits = bm.get_prefix_hits(b)
    assert len(hits) == 2
    # Attaching the two hits leaves one free block: enough for 4 more tokens, not 5.
    assert bm.can_allocate(b, 4, hits) and not bm.can_allocate(b, 5, hits)


def test_lru_eviction_order() -> None:
    bm = BlockManager(6, 2)
    a = make_seq([1, 2, 3, 4, 5])  # blocks A0 A1 + partial
    compute(bm, a, 5)
    a0, a1, _ = a.block_ids
    b = make_seq([7, 8, 9])
    compute(bm, b, 3)
    b0 = b.block_ids[0]
    bm.free(a)  # released tail first: a1 is older in LRU than a0
    bm.free(b)
    assert bm.num_free_blocks == 6 and bm.num_cached_blocks == 3
    # Fresh blocks go first: 6 blocks - 3 cached = 3 uncached ones.
    c = make_seq(list(range(100, 112)))
    bm.append_slots(c, 6)
    assert bm.num_evictions == 0 and bm.num_cached_blocks == 3
    bm.append_slots(c, 8)  # one more block: evict the least recently freed cached block
    assert bm.num_evictions == 1
    assert not bm.is_cached(a1) and bm.is_cached(a0) and bm.is_cached(b0)
    bm.append_slots(c, 10)
    assert not bm.is_cached(a0) and bm.is_cached(b0)
    bm.check_invariants()
    # The evicted prefix is gone: a new sequence with a's prompt finds nothing.
    assert bm.get_prefix_hits(make_seq([1, 2, 3, 4, 5])) == []


def test_hit_on_a_block_in_use_shares_it() -> None:
    bm = BlockManager(8, 4)
    a = make_seq(list(range(9)))
    compute(bm, a, 9)
    b = make_seq(list(range(9)))
    assert bm.allocate_prefix(b) == 8
    assert b.block_ids == a.block_ids[:2]
    assert [bm.ref_count(x) for x in b.block_ids] == [2, 2]
    compute(bm, b, 1)
    bm.free(a)
    assert [bm.ref_count(x) for x in b.block_ids[:2]] == [1, 1]
    bm.free(b)
    bm.check_invariants()
    assert bm.num_free_blocks == 8


def test_stale_hits_are_refused() -> None:
    bm = BlockManager(2, 2)
    a = make_seq([1, 2, 3])
    compute(bm, a, 3)
    bm.free(a)
    b = make_seq([1, 2, 3])
    hits = bm.get_prefix_hits(b)
    c = make_seq([5, 6, 7, 8])
    bm.append_slots(c, 4)  # evicts the cached block
    with pytest.raises(ValueError, match="look the prefix up again"):
        bm.allocate_prefix(b, hits)


def test_reset_prefix_cache_and_disabled_cache() -> None:
    bm = BlockManager(8, 4)
    a = make_seq(list(range(9)))
    compute(bm, a, 9)
    keep = make_seq(list(range(9)))
    bm.allocate_prefix(keep)
    bm.free(a)
    assert bm.reset_prefix_cache() == 2
    bm.check_invariants()
    assert bm.num_cached_blocks == 0 and bm.get_prefix_hits(make_seq(list(range(9)))) == []
    bm.free(keep)
    assert bm.num_free_blocks == 8

    off = BlockManager(8, 4, enable_prefix_caching=False)
    x = make_seq(list(range(9)))
    compute(off, x, 9)
    off.free(x)
    y = make_seq(list(range(9)))
    assert off.get_prefix_hits(y) == [] and off.allocate_prefix(y) == 0
    assert off.num_cached_blocks == 0 and off.hit_rate == 0.0


def test_uncomputed_prefix_is_found_like_a_computed_one() -> None:
    """A prompt registered without computing (the latency bench's synthetic context) gives a
    later sequence with that prompt the same hits a computed prompt would: every full block
    before the last token, evictable meanwhile, and a second registration takes no block."""
    tokens = list(range(11))  # blocks of 4: two full blocks before the last token
    bm = BlockManager(6, 4)
    assert bm.register_uncomputed_prefix(tokens) == 2
    assert bm.num_free_blocks == 6 and bm.num_cached_blocks == 2
    assert bm.register_uncomputed_prefix(tokens) == 0 and bm.num_cached_blocks == 2
    reference = BlockManager(6, 4)
    done = make_seq(tokens, "done")
    compute(reference, done, 11)
    reference.free(done)
    seq = make_seq(tokens)
    hits = bm.get_prefix_hits(seq)
    assert len(hits) == len(reference.get_prefix_hits(make_seq(tokens))) == 2
    assert bm.allocate_prefix(seq, hits) == 8 and seq.num_computed_tokens == 8
    compute(bm, seq, 3)
    assert bm.num_free_blocks == 3
    with pytest.raises(NoFreeBlocksError):
        BlockManager(1, 4).register_uncomputed_prefix(tokens)
    with pytest.raises(ValueError, match="prefix caching"):
        BlockManager(6, 4, enable_prefix_caching=False).register_uncomputed_prefix(tokens)


def test_invariant_checker_catches_corruption() -> None:
    bm = BlockManager(4, 2)
    a = make_seq([1, 2, 3])
    compute(bm, a, 3)
    bm._ref[a.block_ids[0]] += 1
    with pytest.raises(AssertionError, match="reference counts"):
        bm.check_invariants()
    bm._ref[a.block_ids[0]] -= 1
    bm._free.append(a.block_ids[1])
    with pytest.raises(AssertionError):
        bm.check_invariants()


def test_bad_construction() -> None:
    with pytest.raises(ValueError, match="num_blocks must be a positive integer"):
        BlockManager(0)
    with pytest.raises(ValueError, match="block_size must be a positive integer"):
        BlockManager(4, block_size=0)


def test_chain_hash_is_stable_across_processes() -> None:
    code = (
        "from tallow.engine.block_manager import chain_hash;"
        "print(chain_hash(chain_hash(None, [1, 2, 3]), [4, 5, 6]).hex())"
    )
    outs = set()
    for seed in ("1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        outs.add(
            subprocess.run(
                [sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True
            ).stdout.strip()
        )
    assert outs == {chain_hash(chain_hash(None, [1, 2, 3]), [4, 5, 6]).hex()}


# -- random operation sequences -----------------------------------------------------------
OPS = st.lists(
    st.tuples(st.sampled_from(["new", "step", "fork", "free", "grow"]), st.integers(0, 1_000)),
    min_size=1,
    max_size=60,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ops=OPS,
    block_size=st.sampled_from([1, 2, 4]),
    num_blocks=st.integers(4, 24),
    caching=st.booleans(),
)
def test_random_operations_keep_invariants(
    ops: list[tuple[str, int]], block_size: int, num_blocks: int, caching: bool
) -> None:
    bm = BlockManager(num_blocks, block_size, enable_prefix_caching=caching)
    live: list[Sequence] = []
    for op, x in ops:
        if op == "new":
            # Few distinct prompts, so prefixes repeat and hit the cache.
            seq = make_seq([(x % 3) + i % 2 for i in range(1 + x % 11)])
            hits = bm.get_prefix_hits(seq)
            if bm.can_allocate(seq, 0, hits):
                bm.allocate_prefix(seq, hits)
                live.append(seq)
        elif op in ("step", "grow") and live:
            seq = live[x % len(live)]
            if op == "grow" or seq.num_uncomputed_tokens == 0:
                seq.append_token(x % 5)
            n = max(1, min(seq.num_uncomputed_tokens, 1 + x % 5))
            if seq.num_uncomputed_tokens and bm.can_allocate(seq, n):
                compute(bm, seq, n)
        elif op == "fork" and live:
            parent = live[x % len(live)]
            child = make_seq(list(parent.all_token_ids), index=len(live))
            bm.fork(parent, child)
            live.append(child)
        elif op == "free" and live:
            bm.free(live.pop(x % len(live)))
        bm.check_invariants()
    for seq in live:
        bm.free(seq)
    bm.check_invariants()
    assert bm.num_free_blocks == num_blocks
