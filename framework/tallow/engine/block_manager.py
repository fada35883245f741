"""Paged KV memory bookkeeping: fixed-size blocks, reference counts, copy-on-write and a prefix
cache over full blocks.

Only numbers live here; the runner owns the tensors. A sequence's block table
(``seq.block_ids``) maps its token ``j`` to block ``block_ids[j // block_size]``.

Prefix cache: a *full* block whose K/V are computed is registered under a chained hash, the
hash of (its parent block's hash, its token ids), so a hit on block ``i`` implies the whole
prefix up to it matches. When the last reference to a cached block goes away the block is not
wiped: it joins an LRU list of evictable blocks and stays findable until it is taken for reuse.
Fresh blocks are handed out before evictable ones, and evictable ones oldest first; a
sequence's blocks are released tail first, so the deep end of a prefix goes before its head.

Not thread-safe: the engine core's single thread owns it.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict, deque
from typing import Iterable

from .sequence import Sequence

__all__ = ["BlockManager", "NoFreeBlocksError"]


class NoFreeBlocksError(RuntimeError):
    """append_slots was asked for more blocks than are free (check can_allocate first)."""


def chain_hash(parent: bytes | None, token_ids: Iterable[int]) -> bytes:
    """The prefix-cache key of a full block: stable across processes (no salted ``hash()``)."""
    h = hashlib.sha256(parent or b"")
    h.update(array("q", token_ids).tobytes())
    return h.digest()


class BlockManager:
    """Allocates KV blocks to sequences.

    ``num_free_blocks`` counts both never-used/released blocks and evictable cached ones
    (those can be reused at once). Exact accounting holds: once every sequence is freed,
    ``num_free_blocks == num_total_blocks``.
    """

    def __init__(self, num_blocks: int, block_size: int = 16,
                 enable_prefix_caching: bool = True) -> None:
        for name, value in (("num_blocks", num_blocks), ("block_size", block_size)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        self.block_size = block_size
        self.enable_prefix_caching = bool(enable_prefix_caching)
        self._num_blocks = num_blocks
        self._ref = [0] * num_blocks
        self._hash: list[bytes | None] = [None] * num_blocks  # set only for cached blocks
        self._cache: dict[bytes, int] = {}
        self._free: deque[int] = deque(range(num_blocks))  # unreferenced, not cached
        self._evictable: OrderedDict[int, None] = OrderedDict()  # unreferenced, cached; LRU
        self._owners: dict[int, Sequence] = {}  # seq_id -> sequence holding blocks
        self._query_tokens = 0
        self._hit_tokens = 0
        self.num_evictions = 0

    # -- sizes ---------------------------------------------------------------------------
    @property
    def num_total_blocks(self) -> int:
        return self._num_blocks

    @property
    def num_free_blocks(self) -> int:
        """Blocks that can be handed out now: free plus evictable cached blocks."""
        return len(self._free) + len(self._evictable)

    @property
    def num_cached_blocks(self) -> int:
        """Blocks findable in the prefix cache (referenced or evictable)."""
        return len(self._cache)

    @property
    def usage(self) -> float:
        """Fraction of blocks referenced by some sequence (0..1)."""
        return 1.0 - self.num_free_blocks / self._num_blocks

    @property
    def hit_rate(self) -> float:
        """Prefix-cache hits / lookups, in prompt tokens (0.0 before any lookup)."""
        return self._hit_tokens / self._query_tokens if self._query_tokens else 0.0

    @property
    def capacity_tokens(self) -> int:
        return self._num_blocks * self.block_size

    def blocks_for(self, num_tokens: int) -> int:
        """Blocks needed to hold ``num_tokens`` tokens."""
        return -(-num_tokens // self.block_size)

    def ref_count(self, block_id: int) -> int:
        return self._ref[block_id]

    def is_cached(self, block_id: int) -> bool:
        return self._hash[block_id] is not None

    # -- prefix cache --------------------------------------------------------------------
    def _block_hash(self, seq: Sequence, index: int) -> bytes:
        """Hash of ``seq``'s full block ``index``, extending its lazily built hash chain."""
        hashes = seq.block_hashes
        bs = self.block_size
        tokens = seq.all_token_ids
        while len(hashes) <= index:
            i = len(hashes)
            if (i + 1) * bs > seq.num_known_tokens:
                # A block with a placeholder (a token still on the device) has no hash yet.
                raise ValueError(f"block {i} of sequence {seq.seq_id} is not full of known "
                                 "tokens")
            hashes.append(chain_hash(hashes[i - 1] if i else None, tokens[i * bs:(i + 1) * bs]))
        return hashes[index]

    def get_prefix_hits(self, seq: Sequence) -> list[int]:
        """Cached blocks that hold ``seq``'s longest cached prefix of full blocks. Pure lookup.

        Only blocks wholly inside the first ``num_tokens - 1`` tokens count: the last token is
        always computed (its logits are needed), and it never lands in a shared block. Nor do
        blocks holding a token still on the device (async scheduling).
        """
        if not self.enable_prefix_caching:
            return []
        hits: list[int] = []
        usable = min(seq.num_tokens - 1, seq.num_known_tokens)
        for i in range(usable // self.block_size):
            block = self._cache.get(self._block_hash(seq, i))
            if block is None:
                break
            hits.append(block)
        return hits

    def allocate_prefix(self, seq: Sequence, prefix_hits: list[int] | None = None, *,
                        record_stats: bool = True) -> int:
        """Attach cached blocks to a sequence that holds none; return the tokens they cover.

        Sets ``seq.num_computed_tokens`` to that count (0 on a miss or with caching off).
        ``prefix_hits`` is a fresh :meth:`get_prefix_hits` result, looked up if omitted.
        ``record_stats`` adds this lookup to :attr:`hit_rate`.
        """
        if seq.block_ids or seq.num_computed_tokens:
            raise ValueError(f"allocate_prefix: sequence {seq.seq_id} already holds blocks "
                             f"or computed tokens")
        hits = self.get_prefix_hits(seq) if prefix_hits is None else list(prefix_hits)
        for i, block in enumerate(hits):
            if self._hash[block] is None or self._hash[block] != self._block_hash(seq, i):
                raise ValueError(f"allocate_prefix: block {block} is not the cached block "
                                 f"{i} of sequence {seq.seq_id}; look the prefix up again")
        for block in hits:
            if self._ref[block] == 0:
                del self._evictable[block]
            self._ref[block] += 1
        cached = len(hits) * self.block_size
        seq.block_ids = hits
        seq.num_registered_blocks = len(hits)
        seq.num_computed_tokens = cached
        self._owners[seq.seq_id] = seq
        if record_stats and self.enable_prefix_caching:
            self._query_tokens += seq.num_tokens
            self._hit_tokens += cached
        return cached

    def mark_computed(self, seq: Sequence, upto: int | None = None) -> None:
        """Register the full blocks of ``seq`` whose K/V are now computed in the prefix cache.

        ``upto`` caps the tokens considered (with async scheduling ``num_computed_tokens`` may
        already count a step still running); blocks holding a pending token are never
        registered. A block whose contents are already cached under another block is left
        uncached (the first copy stays canonical).
        """
        if not self.enable_prefix_caching:
            return
        if upto is not None and upto // self.block_size <= seq.num_registered_blocks:
            return  # no block completed below ``upto``: the usual decode step, cheaply
        computed = min(seq.num_computed_tokens, seq.num_known_tokens)
        if upto is not None:
            computed = min(computed, upto)
        full = min(computed // self.block_size, len(seq.block_ids))
        if full <= seq.num_registered_blocks:
            return
        for i in range(seq.num_registered_blocks, full):
            h = self._block_hash(seq, i)
            block = seq.block_ids[i]
            if self._hash[block] is None and h not in self._cache:
                self._hash[block] = h
                self._cache[h] = block
        seq.num_registered_blocks = max(seq.num_registered_blocks, full)

    def register_uncomputed_prefix(self, token_ids: list[int]) -> int:
        """Register the full blocks of a prompt ``token_ids`` in the prefix cache *without
        computing them*; a later sequence with this prompt then starts at its last block.

        For benchmarks only (``tallow bench latency --synthetic-context``): it times decoding
        at long context without spending minutes on prefill. The blocks keep whatever the KV
        cache holds, not the prompt's K/V, so the engine never calls this. The blocks are left
        evictable (unreferenced). Returns how many were registered; blocks already cached are
        kept as they are.
        """
        if not self.enable_prefix_caching:
            raise ValueError("register_uncomputed_prefix needs prefix caching enabled")
        bs = self.block_size
        hashes: list[bytes] = []
        for i in range((len(token_ids) - 1) // bs):  # the last token is always computed
            hashes.append(chain_hash(hashes[-1] if hashes else None,
                                     token_ids[i * bs:(i + 1) * bs]))
        missing = [h for h in hashes if h not in self._cache]
        if len(missing) > self.num_free_blocks:
            raise NoFreeBlocksError(f"the prefix needs {len(missing)} KV blocks, "
                                    f"{self.num_free_blocks} are free")
        for h in missing:
            block = self._take()
            self._ref[block] = 0
            self._hash[block] = h
            self._cache[h] = block
            self._evictable[block] = None
        return len(missing)

    def reset_stats(self) -> None:
        """Start :attr:`hit_rate` and the eviction count afresh (after a warm-up, say)."""
        self._query_tokens = self._hit_tokens = self.num_evictions = 0

    def reset_prefix_cache(self) -> int:
        """Forget every cached block (blocks in use stay allocated). Returns how many were
        forgotten."""
        dropped = len(self._cache)
        for block in self._evictable:
            self._free.append(block)
        self._evictable.clear()
        for block in self._cache.values():
            self._hash[block] = None
        self._cache.clear()
        return dropped

    # -- allocation ----------------------------------------------------------------------
    def _blocks_needed(self, seq: Sequence, num_new_tokens: int,
                       prefix_hits: list[int] | tuple[int, ...] = ()) -> int:
        if prefix_hits:
            start, table = len(prefix_hits) * self.block_size, prefix_hits
        else:
            start, table = seq.num_computed_tokens, seq.block_ids
        end = start + num_new_tokens
        last = self.blocks_for(end)
        need = max(0, last - len(table))
        # A block about to be written that another sequence also references gets copied.
        for i in range(start // self.block_size, min(len(table), last)):
            if self._ref[table[i]] > 1 and not prefix_hits:
                need += 1
        return need

    def can_allocate(self, seq: Sequence, num_new_tokens: int,
                     prefix_hits: list[int] | tuple[int, ...] = ()) -> bool:
        """Whether :meth:`append_slots` (``seq``, ``num_new_tokens``) would succeed now.

        For a sequence about to be admitted, pass the ``prefix_hits`` it will attach: they are
        counted as covering its first tokens, and evictable ones stop being free.
        """
        free = len(self._free) + len(self._evictable)
        if not prefix_hits:
            # At most the blocks spanning the new tokens are needed (new or copied): this
            # bound settles almost every call without looking at the table.
            if free >= num_new_tokens // self.block_size + 2:
                return True
        elif seq.block_ids or seq.num_computed_tokens:
            raise ValueError("can_allocate: prefix_hits only apply to a sequence holding no "
                             "blocks")
        else:
            free -= sum(1 for b in prefix_hits if self._ref[b] == 0)
        return self._blocks_needed(seq, num_new_tokens, prefix_hits) <= free

    def _take(self) -> int:
        if self._free:
            block = self._free.popleft()
        elif self._evictable:
            block, _ = self._evictable.popitem(last=False)
            h = self._hash[block]
            if h is not None and self._cache.get(h) == block:
                del self._cache[h]
            self._hash[block] = None
            self.num_evictions += 1
        else:  # pragma: no cover - callers check can_allocate first
            raise NoFreeBlocksError("no free KV blocks")
        self._ref[block] = 1
        return block

    def append_slots(self, seq: Sequence, num_new_tokens: int) -> list[tuple[int, int]]:
        """Make room for tokens ``seq.num_computed_tokens .. + num_new_tokens``.

        Returns the copy-on-write copies ``(src_block, dst_block)`` the runner must perform
        before the step's forward: a block to be written that is shared with another sequence
        is replaced, in this sequence's table only, by a private copy.
        """
        if num_new_tokens < 0:
            raise ValueError(f"num_new_tokens must be >= 0, got {num_new_tokens}")
        table = seq.block_ids
        bs = self.block_size
        end = seq.num_computed_tokens + num_new_tokens
        if end <= len(table) * bs and self._ref[table[seq.num_computed_tokens // bs]] == 1 and (
                end - 1) // bs == seq.num_computed_tokens // bs:
            return []  # the common decode: one private block already has room
        need = self._blocks_needed(seq, num_new_tokens)
        if need > self.num_free_blocks:
            raise NoFreeBlocksError(f"sequence {seq.seq_id} needs {need} KV blocks, "
                                    f"{self.num_free_blocks} are free")
        last = self.blocks_for(end)
        copies: list[tuple[int, int]] = []
        for i in range(seq.num_computed_tokens // self.block_size, min(len(table), last)):
            src = table[i]
            if self._ref[src] > 1:
                dst = self._take()
                self._ref[src] -= 1
                table[i] = dst
                copies.append((src, dst))
        while len(table) < last:
            table.append(self._take())
        self._owners[seq.seq_id] = seq
        return copies

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """Give ``child`` (holding no blocks) all of ``parent``'s blocks and computed tokens.

        The child's tokens must start with the parent's computed tokens (children of a request
        share its prompt). Shared blocks are copied on the first write (:meth:`append_slots`).
        """
        if child.block_ids or child.num_computed_tokens:
            raise ValueError(f"fork: child sequence {child.seq_id} already holds blocks")
        n = parent.num_computed_tokens
        if child.all_token_ids[:n] != parent.all_token_ids[:n]:
            raise ValueError(f"fork: sequence {child.seq_id} does not share the computed tokens "
                             f"of sequence {parent.seq_id}")
        for block in parent.block_ids:
            self._ref[block] += 1
        child.block_ids = list(parent.block_ids)
        child.num_computed_tokens = n
        # Hashes of blocks with identical tokens are identical: reuse the parent's chain.
        same = 0
        limit = min(len(parent.block_hashes), child.num_tokens // self.block_size)
        pa, ca, bs = parent.all_token_ids, child.all_token_ids, self.block_size
        while same < limit and pa[same * bs:(same + 1) * bs] == ca[same * bs:(same + 1) * bs]:
            same += 1
        if len(child.block_hashes) < same:
            child.block_hashes[:] = parent.block_hashes[:same]
        child.num_registered_blocks = min(parent.num_registered_blocks, same)
        self._owners[child.seq_id] = child

    def free(self, seq: Sequence) -> None:
        """Drop ``seq``'s references. Cached blocks no one references become evictable (tail
        blocks first in eviction order); others become free. Leaves num_computed_tokens alone."""
        for block in reversed(seq.block_ids):
            self._ref[block] -= 1
            if self._ref[block] == 0:
                if self._hash[block] is not None:
                    self._evictable[block] = None
                else:
                    self._free.append(block)
        seq.block_ids = []
        seq.num_registered_blocks = 0
        self._owners.pop(seq.seq_id, None)

    # -- checking ------------------------------------------------------------------------
    def check_invariants(self) -> None:
        """Raise AssertionError if the bookkeeping is inconsistent (used by tests)."""
        def fail(msg: str) -> None:
            raise AssertionError(f"BlockManager invariant: {msg}")

        counts = [0] * self._num_blocks
        for seq in self._owners.values():
            if len(set(seq.block_ids)) != len(seq.block_ids):
                fail(f"sequence {seq.seq_id} lists a block twice: {seq.block_ids}")
            for block in seq.block_ids:
                counts[block] += 1
            if len(seq.block_ids) * self.block_size < seq.num_computed_tokens:
                fail(f"sequence {seq.seq_id} has {seq.num_computed_tokens} computed tokens in "
                     f"{len(seq.block_ids)} blocks")
            for i, block in enumerate(seq.block_ids):
                h = self._hash[block]
                if h is not None and h != self._block_hash(seq, i):
                    fail(f"block {block} is cached under a hash that is not sequence "
                         f"{seq.seq_id}'s block {i}")
        if counts != self._ref:
            bad = [b for b in range(self._num_blocks) if counts[b] != self._ref[b]]
            fail(f"reference counts differ from block tables at blocks {bad[:10]}")
        free, evictable = set(self._free), set(self._evictable)
        if len(free) != len(self._free):
            fail("a block is on the free list twice")
        if free & evictable:
            fail(f"blocks both free and evictable: {sorted(free & evictable)[:10]}")
        unreferenced = {b for b in range(self._num_blocks) if self._ref[b] == 0}
        if free | evictable != unreferenced:
            fail("free + evictable blocks are not exactly the unreferenced blocks")
        if any(self._hash[b] is not None for b in free):
            fail("a free block still carries a cache hash")
        if any(self._hash[b] is None for b in evictable):
            fail("an evictable block carries no cache hash")
        for h, block in self._cache.items():
            if self._hash[block] != h:
                fail(f"cache entry for block {block} disagrees with the block's hash")
        if sum(1 for h in self._hash if h is not None) != len(self._cache):
            fail("a block carries a hash that the cache does not map to it")
        if self.num_free_blocks + sum(1 for r in self._ref if r > 0) != self._num_blocks:
            fail("free + used != total")
