"""Paged KV memory bookkeeping: fixed-size blocks, reference counts, copy-on-write and a prefix
cache over full blocks.

Only numbers live here; the runner owns the tensors. A sequence's block table
(``seq.block_ids``) maps its token ``j`` to block ``block_ids[j // block_size]``.

One manager serves one paged cache group (``group``: the index of the sequence's table in
``seq.block_tables``); :class:`tallow.engine.kv_manager.KVCacheManager` composes one per group.
A manager with a sliding ``window`` gives back, after each committed step
(:meth:`BlockManager.mark_computed`), the blocks whose every token is older than the window of any future
query: a query at position ``p`` reads keys ``k`` with ``p - k < window``, so once the
sequence has ``c`` tokens committed, blocks wholly below ``c - window + 1`` are never read
again. Their table entries then name the *null block* (id ``num_blocks``, one past the pool: a
valid, never written block of the group's tensors), so kernels that iterate a table and mask
never index out of bounds.

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


def chain_hash(parent: bytes | None, token_ids: Iterable[int], extra: bytes = b"") -> bytes:
    """The prefix-cache key of a full block: stable across processes (no salted ``hash()``).
    ``extra`` is what else the block's K/V depend on: the hashes of the images whose tokens it
    holds (:meth:`tallow.engine.multimodal.MultimodalPrompt.block_key`)."""
    h = hashlib.sha256(parent or b"")
    h.update(array("q", token_ids).tobytes())
    if extra:
        h.update(extra)
    return h.digest()


class BlockManager:
    """Allocates KV blocks to sequences.

    ``num_free_blocks`` counts both never-used/released blocks and evictable cached ones
    (those can be reused at once). Exact accounting holds: once every sequence is freed,
    ``num_free_blocks == num_total_blocks``.
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int = 16,
        enable_prefix_caching: bool = True,
        *,
        group: int = 0,
        window: int | None = None,
    ) -> None:
        for name, value in (("num_blocks", num_blocks), ("block_size", block_size)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if window is not None and (not isinstance(window, int) or window < 1):
            raise ValueError(f"window must be a positive integer or None, got {window!r}")
        self.block_size = block_size
        #: the index of this manager's table in ``seq.block_tables``
        self.group = group
        #: a sliding window (tokens): blocks older than it are given back while sequences run
        self.window = window
        #: the block that released table entries name (None without a window)
        self.null_block: int | None = num_blocks if window is not None else None
        #: seq_id -> leading table entries already given back (windowed managers)
        self._released: dict[int, int] = {}
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

    def _table(self, seq: Sequence) -> list[int]:
        """``seq``'s block table in this manager's group."""
        tables = seq.block_tables
        while len(tables) <= self.group:
            tables.append([])
        registered = seq.registered_blocks
        while len(registered) <= self.group:
            registered.append(0)
        return tables[self.group]

    def _set_table(self, seq: Sequence, table: list[int], registered: int) -> None:
        self._table(seq)
        seq.block_tables[self.group] = table
        seq.registered_blocks[self.group] = registered

    @property
    def max_seq_blocks(self) -> int | None:
        """The most blocks one sequence holds at once, whatever its length (None: no bound,
        it grows with the sequence)."""
        return None

    def live_blocks(self, seq: Sequence) -> int:
        """Blocks ``seq`` holds in this group (entries naming the null block excluded)."""
        return len(self._table(seq)) - self._released.get(seq.seq_id, 0)

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
                raise ValueError(f"block {i} of sequence {seq.seq_id} is not full of known tokens")
            extra = seq.mm.block_key(i * bs, (i + 1) * bs) if seq.mm is not None else b""
            hashes.append(
                chain_hash(hashes[i - 1] if i else None, tokens[i * bs : (i + 1) * bs], extra)
            )
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

    def cached_blocks(self, seq: Sequence, limit: int) -> list[int | None]:
        """For ``seq``'s first ``limit`` full blocks, the cached block holding each (None
        where this group's cache has none). Pure lookup."""
        return [self._cache.get(self._block_hash(seq, i)) for i in range(limit)]

    def first_needed_block(self, num_tokens: int) -> int:
        """The first block a query at position ``num_tokens`` (and any later one) reads: 0
        without a window."""
        if self.window is None:
            return 0
        return max(0, num_tokens - self.window + 1) // self.block_size

    def window_hit(self, cached: list[int | None], blocks: int) -> list[int] | None:
        """The table of a prefix hit of ``blocks`` full blocks given :meth:`cached_blocks`:
        the null block below the window of the first query, the cached blocks in it; None when
        one of those is not cached."""
        first = self.first_needed_block(blocks * self.block_size)
        needed = [b for b in cached[first:blocks] if b is not None]
        if len(needed) < blocks - first:
            return None
        null = self.null_block if self.null_block is not None else -1
        return [null] * first + needed

    def allocate_prefix(
        self, seq: Sequence, prefix_hits: list[int] | None = None, *, record_stats: bool = True
    ) -> int:
        """Attach cached blocks to a sequence that holds none; return the tokens they cover.

        Sets ``seq.num_computed_tokens`` to that count (0 on a miss or with caching off).
        ``prefix_hits`` is a fresh :meth:`get_prefix_hits` result, looked up if omitted.
        ``record_stats`` adds this lookup to :attr:`hit_rate`.
        """
        if self._table(seq) or (seq.num_computed_tokens and self.group == 0):
            raise ValueError(
                f"allocate_prefix: sequence {seq.seq_id} already holds blocks or computed tokens"
            )
        hits = self.get_prefix_hits(seq) if prefix_hits is None else list(prefix_hits)
        null = self.null_block
        for i, block in enumerate(hits):
            if block == null:
                continue
            if self._hash[block] is None or self._hash[block] != self._block_hash(seq, i):
                raise ValueError(
                    f"allocate_prefix: block {block} is not the cached block "
                    f"{i} of sequence {seq.seq_id}; look the prefix up again"
                )
        for block in hits:
            if block == null:
                continue
            if self._ref[block] == 0:
                del self._evictable[block]
            self._ref[block] += 1
        cached = len(hits) * self.block_size
        self._set_table(seq, hits, len(hits))
        released = sum(1 for b in hits if b == null) if null is not None else 0
        if released:
            self._released[seq.seq_id] = released
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
        if self.enable_prefix_caching:
            self._register(seq, upto)
        if self.window is not None:
            self.release_outside_window(
                seq, seq.num_computed_tokens if upto is None else min(upto, seq.num_computed_tokens)
            )

    def _register(self, seq: Sequence, upto: int | None) -> None:
        table = self._table(seq)
        registered = seq.registered_blocks[self.group]
        if upto is not None and upto // self.block_size <= registered:
            return  # no block completed below ``upto``: the usual decode step, cheaply
        computed = min(seq.num_computed_tokens, seq.num_known_tokens)
        if upto is not None:
            computed = min(computed, upto)
        full = min(computed // self.block_size, len(table))
        if full <= registered:
            return
        null = self.null_block
        for i in range(registered, full):
            block = table[i]
            if block == null:
                continue
            h = self._block_hash(seq, i)
            if self._hash[block] is None and h not in self._cache:
                self._hash[block] = h
                self._cache[h] = block
        seq.registered_blocks[self.group] = max(registered, full)

    def release_outside_window(self, seq: Sequence, committed: int) -> int:
        """Give back ``seq``'s blocks that no query at position ``committed`` or later reads
        (see the module docstring); their entries name the null block. Returns how many.

        ``committed`` counts tokens whose step is done on the host's side: with async
        scheduling a step may still run on the device, but the blocks it reads lie at or above
        its own start's window, and a block given back now is written only by a step queued
        later on the same stream."""
        if self.window is None:
            return 0
        table = self._table(seq)
        first = min(self.first_needed_block(committed), len(table))
        done = self._released.get(seq.seq_id, 0)
        if first <= done:
            return 0
        null = self.null_block
        for i in range(done, first):
            block = table[i]
            if block == null:
                continue
            self._drop_ref(block)
            table[i] = null  # type: ignore[assignment]
        self._released[seq.seq_id] = first
        return first - done

    def _drop_ref(self, block: int) -> None:
        self._ref[block] -= 1
        if self._ref[block] == 0:
            if self._hash[block] is not None:
                self._evictable[block] = None
            else:
                self._free.append(block)

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
            hashes.append(
                chain_hash(hashes[-1] if hashes else None, token_ids[i * bs : (i + 1) * bs])
            )
        # a windowed group needs only the blocks inside the window of the first query after
        # the prefix (see KVCacheManager.get_prefix_hits)
        first = self.first_needed_block(len(hashes) * bs)
        missing = [h for h in hashes[first:] if h not in self._cache]
        if len(missing) > self.num_free_blocks:
            raise NoFreeBlocksError(
                f"the prefix needs {len(missing)} KV blocks, {self.num_free_blocks} are free"
            )
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
    def _blocks_needed(
        self, seq: Sequence, num_new_tokens: int, prefix_hits: list[int] | tuple[int, ...] = ()
    ) -> int:
        if prefix_hits:
            start, table = len(prefix_hits) * self.block_size, prefix_hits
        else:
            start, table = seq.num_computed_tokens, self._table(seq)
        end = start + num_new_tokens
        last = self.blocks_for(end)
        need = max(0, last - len(table))
        # A block about to be written that another sequence also references gets copied.
        for i in range(start // self.block_size, min(len(table), last)):
            if self._ref[table[i]] > 1 and not prefix_hits:
                need += 1
        return need

    def can_allocate(
        self, seq: Sequence, num_new_tokens: int, prefix_hits: list[int] | tuple[int, ...] = ()
    ) -> bool:
        """Whether :meth:`BlockManager.append_slots` (``seq``, ``num_new_tokens``) would succeed now.

        For a sequence about to be admitted, pass the ``prefix_hits`` it will attach: they are
        counted as covering its first tokens, and evictable ones stop being free.
        """
        free = len(self._free) + len(self._evictable)
        if not prefix_hits:
            # At most the blocks spanning the new tokens are needed (new or copied): this
            # bound settles almost every call without looking at the table.
            if free >= num_new_tokens // self.block_size + 2:
                return True
        elif self._table(seq) or (seq.num_computed_tokens and self.group == 0):
            raise ValueError("can_allocate: prefix_hits only apply to a sequence holding no blocks")
        else:
            null = self.null_block
            free -= sum(1 for b in prefix_hits if b != null and self._ref[b] == 0)
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
        table = self._table(seq)
        bs = self.block_size
        end = seq.num_computed_tokens + num_new_tokens
        if (
            end <= len(table) * bs
            and self._ref[table[seq.num_computed_tokens // bs]] == 1
            and (end - 1) // bs == seq.num_computed_tokens // bs
        ):
            return []  # the common decode: one private block already has room
        need = self._blocks_needed(seq, num_new_tokens)
        if need > self.num_free_blocks:
            raise NoFreeBlocksError(
                f"sequence {seq.seq_id} needs {need} KV blocks, {self.num_free_blocks} are free"
            )
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

    def trim(self, seq: Sequence, num_tokens: int) -> int:
        """Give back ``seq``'s blocks past the first ``blocks_for(num_tokens)``: the slots of
        proposed tokens a verify step rejected (speculative decoding). Those blocks were taken
        by that step, hold no computed token and are in no prefix-cache entry, so they go
        back to the free list. Returns how many."""
        keep = self.blocks_for(num_tokens)
        if keep * self.block_size < seq.num_computed_tokens:
            raise ValueError(
                f"trim: sequence {seq.seq_id} has {seq.num_computed_tokens} "
                f"computed tokens, more than {keep} blocks hold"
            )
        table = self._table(seq)
        dropped = 0
        null = self.null_block
        while len(table) > keep:
            block = table.pop()
            if block != null:
                self._drop_ref(block)
                dropped += 1
        registered = seq.registered_blocks[self.group]
        seq.registered_blocks[self.group] = min(registered, len(table))
        return dropped

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """Give ``child`` (holding no blocks) all of ``parent``'s blocks and computed tokens.

        The child's tokens must start with the parent's computed tokens (children of a request
        share its prompt). Shared blocks are copied on the first write (:meth:`BlockManager.append_slots`).
        """
        if self._table(child) or (child.num_computed_tokens and self.group == 0):
            raise ValueError(f"fork: child sequence {child.seq_id} already holds blocks")
        n = parent.num_computed_tokens
        if child.all_token_ids[:n] != parent.all_token_ids[:n]:
            raise ValueError(
                f"fork: sequence {child.seq_id} does not share the computed tokens "
                f"of sequence {parent.seq_id}"
            )
        table = self._table(parent)
        null = self.null_block
        for block in table:
            if block != null:
                self._ref[block] += 1
        released = self._released.get(parent.seq_id)
        if released:
            self._released[child.seq_id] = released
        self._set_table(child, list(table), 0)
        child.num_computed_tokens = n
        # Hashes of blocks with identical tokens are identical: reuse the parent's chain.
        same = 0
        limit = min(len(parent.block_hashes), child.num_tokens // self.block_size)
        pa, ca, bs = parent.all_token_ids, child.all_token_ids, self.block_size
        while same < limit and pa[same * bs : (same + 1) * bs] == ca[same * bs : (same + 1) * bs]:
            same += 1
        if len(child.block_hashes) < same:
            child.block_hashes[:] = parent.block_hashes[:same]
        child.registered_blocks[self.group] = min(parent.registered_blocks[self.group], same)
        self._owners[child.seq_id] = child

    def free(self, seq: Sequence) -> None:
        """Drop ``seq``'s references. Cached blocks no one references become evictable (tail
        blocks first in eviction order); others become free. Leaves num_computed_tokens alone."""
        null = self.null_block
        for block in reversed(self._table(seq)):
            if block != null:
                self._drop_ref(block)
        self._set_table(seq, [], 0)
        self._released.pop(seq.seq_id, None)
        self._owners.pop(seq.seq_id, None)

    # -- checking ------------------------------------------------------------------------
    def check_invariants(self) -> None:
        """Raise AssertionError if the bookkeeping is inconsistent (used by tests)."""

        def fail(msg: str) -> None:
            raise AssertionError(f"BlockManager invariant: {msg}")

        counts = [0] * self._num_blocks
        null = self.null_block
        for seq in self._owners.values():
            table = self._table(seq)
            live = [b for b in table if b != null]
            if len(set(live)) != len(live):
                fail(f"sequence {seq.seq_id} lists a block twice: {table}")
            released = self._released.get(seq.seq_id, 0)
            if null is not None and any(b == null for b in table[released:]):
                fail(f"sequence {seq.seq_id} names the null block past its released entries")
            if null is not None and any(b != null for b in table[:released]):
                fail(f"sequence {seq.seq_id} holds a released entry")
            for block in live:
                counts[block] += 1
            if len(table) * self.block_size < seq.num_computed_tokens:
                fail(
                    f"sequence {seq.seq_id} has {seq.num_computed_tokens} computed tokens in "
                    f"{len(table)} blocks"
                )
            for i, block in enumerate(table):
                if block == null:
                    continue
                h = self._hash[block]
                if h is not None and h != self._block_hash(seq, i):
                    fail(
                        f"block {block} is cached under a hash that is not sequence "
                        f"{seq.seq_id}'s block {i}"
                    )
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
