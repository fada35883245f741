"""The engine's cache memory per cache group: one block manager per paged group, one pool of
state slots per state group (see :mod:`tallow.layers.cache_spec` and docs/architecture.md,
"Cache groups").

:class:`KVCacheManager` answers the scheduler exactly as a single
:class:`~tallow.engine.block_manager.BlockManager` does (the scheduler cannot tell them apart):
an allocation succeeds only if every group can serve it, a preempted or finished sequence
frees in every group, and sizes (``num_free_blocks``, ``num_total_blocks``, ``blocks_for``)
are those of the *primary* group, the first paged group (a full-attention one when the model
has any), whose table is ``seq.block_ids``.

Prefix caching: a hit of ``k`` full blocks must hold, in each full group, the ``k`` blocks;
in each sliding group, the blocks inside the window of the first query after the hit (those
below it are never read: their entries name the null block). The longest ``k`` all groups
agree on is taken. A model with a state group gets no prefix caching (the state at the hit
point is not kept); the manager says so in the log once.

Copy-on-write copies of the primary group are ``(src, dst)`` pairs, those of another paged
group ``(src, dst, group)`` triples. A state slot is taken when a sequence is first given
room (:meth:`KVCacheManager.append_slots`) and zeroed before the step that first uses it; a forked ``n > 1``
completion takes a slot holding a copy of its parent's state. Those operations are handed to
the scheduler's output, in the order they were decided (a slot copied to at a fork, given back
and taken again must end zeroed), through :meth:`KVCacheManager.pop_state_ops`.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass
from typing import Sequence as Seq

from .block_manager import BlockManager, NoFreeBlocksError
from .sequence import Sequence

__all__ = ["KVCacheManager", "GroupHits", "PagedGroupSize", "StatePool"]

log = logging.getLogger("tallow.engine")

#: the capacity, in tokens, of a group that serves a sequence of any length
UNBOUNDED = 1 << 62


@dataclass(frozen=True)
class PagedGroupSize:
    """A paged group's pool: ``num_blocks`` blocks; ``window`` for a sliding group."""

    num_blocks: int
    window: int | None = None


class GroupHits(list[int]):
    """A prefix hit over every paged group: the list itself is the primary group's blocks
    (its length, the hit's block count, is what the scheduler reads); ``tables`` holds each
    group's table for the hit."""

    def __init__(self, tables: list[list[int]]) -> None:
        super().__init__(tables[0] if tables else [])
        self.tables = tables


class StatePool:
    """The state slots of one state group: ``num_slots`` slots, each held by at most one
    sequence (``seq.state_slots[index]``); slot ``num_slots`` is the dummy of padding rows."""

    def __init__(self, num_slots: int, index: int) -> None:
        if num_slots < 1:
            raise ValueError(f"a state group needs at least one slot, got {num_slots}")
        self.num_slots = num_slots
        self.index = index
        self._free: deque[int] = deque(range(num_slots))
        self._owner: dict[int, int] = {}  # slot -> seq_id

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def dummy_slot(self) -> int:
        return self.num_slots

    def slot(self, seq: Sequence) -> int:
        """``seq``'s slot, -1 when it holds none."""
        slots = seq.state_slots
        return slots[self.index] if len(slots) > self.index else -1

    def take(self, seq: Sequence) -> int:
        if not self._free:
            raise NoFreeBlocksError(f"no free state slot in state group {self.index}")
        slot = self._free.popleft()
        slots = seq.state_slots
        while len(slots) <= self.index:
            slots.append(-1)
        slots[self.index] = slot
        self._owner[slot] = seq.seq_id
        return slot

    def release(self, seq: Sequence) -> None:
        slot = self.slot(seq)
        if slot < 0:
            return
        seq.state_slots[self.index] = -1
        del self._owner[slot]
        self._free.append(slot)

    def check_invariants(self, owners: dict[int, Sequence]) -> None:
        free = set(self._free)
        if len(free) != len(self._free) or free & set(self._owner):
            raise AssertionError(
                f"state group {self.index}: a slot is free twice or both free and held"
            )
        if len(free) + len(self._owner) != self.num_slots:
            raise AssertionError(f"state group {self.index}: free + held != total slots")
        for slot, seq_id in self._owner.items():
            seq = owners.get(seq_id)
            if seq is None or self.slot(seq) != slot:
                raise AssertionError(
                    f"state group {self.index}: slot {slot} is held by "
                    f"sequence {seq_id}, which does not name it"
                )


class KVCacheManager:
    """Block managers and state pools of a model's cache groups (see the module docstring).

    ``paged``: the paged groups in order (the first is the primary group); ``state_slots``:
    the slot count of each state group; ``max_step_tokens``: the most tokens one step computes
    for a sequence (bounds what a sliding group holds for one sequence)."""

    def __init__(
        self,
        paged: Seq[PagedGroupSize],
        *,
        block_size: int = 16,
        enable_prefix_caching: bool = True,
        state_slots: Seq[int] = (),
        max_step_tokens: int = 8192,
    ) -> None:
        if not paged:
            raise ValueError("a KVCacheManager needs at least one paged cache group")
        if state_slots and enable_prefix_caching:
            log.warning(
                "prefix caching is off: the model keeps a recurrent state per "
                "sequence, and a cached prefix would need the state at its end"
            )
            enable_prefix_caching = False
        self.groups = [
            BlockManager(g.num_blocks, block_size, enable_prefix_caching, group=i, window=g.window)
            for i, g in enumerate(paged)
        ]
        self.primary = self.groups[0]
        self.states = [StatePool(n, i) for i, n in enumerate(state_slots)]
        self.max_step_tokens = max_step_tokens
        self._owners: dict[int, Sequence] = {}
        self._state_ops: list[tuple[int, int, int]] = []
        #: one paged group, no state pools: the per-sequence calls go to the block manager
        self._direct = len(self.groups) == 1 and not self.states
        if self._direct:
            # One paged group (most models): the scheduler's per-sequence calls go straight to
            # its manager, adding no Python call per sequence and step.
            bm = self.primary
            self.can_allocate = bm.can_allocate  # type: ignore[method-assign]
            self.append_slots = bm.append_slots  # type: ignore[method-assign,assignment]
            self.mark_computed = bm.mark_computed  # type: ignore[method-assign]
            self.fork = bm.fork  # type: ignore[method-assign]
            self.free = bm.free  # type: ignore[method-assign]

    # -- sizes (the primary group's) -------------------------------------------------------
    @property
    def block_size(self) -> int:
        return self.primary.block_size

    @property
    def enable_prefix_caching(self) -> bool:
        return self.primary.enable_prefix_caching

    @property
    def num_total_blocks(self) -> int:
        return self.primary.num_total_blocks

    @property
    def num_free_blocks(self) -> int:
        return self.primary.num_free_blocks

    @property
    def num_cached_blocks(self) -> int:
        return self.primary.num_cached_blocks

    @property
    def num_evictions(self) -> int:
        return sum(g.num_evictions for g in self.groups)

    @property
    def usage(self) -> float:
        """The fullest group's fraction of referenced blocks (0..1)."""
        return max(g.usage for g in self.groups)

    @property
    def hit_rate(self) -> float:
        return self.primary.hit_rate

    def seq_blocks_bound(self, group: BlockManager) -> int | None:
        """The most blocks one sequence holds at once in ``group`` (None: unbounded)."""
        if group.window is None:
            return None
        # the window before a chunk's first query, the chunk, and a partial block each side
        return group.blocks_for(group.window - 1 + self.max_step_tokens) + 1

    @property
    def capacity_tokens(self) -> int:
        """The most tokens one sequence can hold: the smallest over the groups (a sliding
        group whose pool covers one sequence's window and step serves any length)."""
        capacity = UNBOUNDED
        for group in self.groups:
            bound = self.seq_blocks_bound(group)
            if bound is None or group.num_total_blocks < bound:
                capacity = min(capacity, group.capacity_tokens)
        return capacity

    def blocks_for(self, num_tokens: int) -> int:
        """Primary-group blocks a sequence of ``num_tokens`` holds at its largest."""
        need = self.primary.blocks_for(num_tokens)
        bound = self.seq_blocks_bound(self.primary)
        return need if bound is None else min(need, bound)

    def live_blocks(self, seq: Sequence, group: int) -> int:
        """Blocks ``seq`` holds in paged ``group`` (null entries excluded)."""
        return self.groups[group].live_blocks(seq)

    # -- prefix cache -----------------------------------------------------------------------
    def get_prefix_hits(self, seq: Sequence) -> GroupHits:
        """The longest prefix of full blocks every group holds for ``seq`` (see the module
        docstring). Pure lookup."""
        if not self.enable_prefix_caching:
            return GroupHits([[] for _ in self.groups])
        if len(self.groups) == 1 and self.primary.window is None:
            return GroupHits([self.primary.get_prefix_hits(seq)])
        usable = min(seq.num_tokens - 1, seq.num_known_tokens) // self.block_size
        cached = [g.cached_blocks(seq, usable) for g in self.groups]
        k = usable
        for group, blocks in zip(self.groups, cached):
            if group.window is None:
                k = min(k, next((i for i, b in enumerate(blocks) if b is None), len(blocks)))
        changed = True
        while changed and k:
            changed = False
            for group, blocks in zip(self.groups, cached):
                if group.window is None:
                    continue
                while k and group.window_hit(blocks, k) is None:
                    k -= 1
                    changed = True
        tables: list[list[int]] = []
        for group, blocks in zip(self.groups, cached):
            table = (
                [b for b in blocks[:k] if b is not None]
                if group.window is None
                else group.window_hit(blocks, k)
            )
            tables.append(list(table or []))
        return GroupHits(tables)

    def _hits(
        self, prefix_hits: GroupHits | list[int] | tuple[int, ...] | None, group: int
    ) -> list[int]:
        if isinstance(prefix_hits, GroupHits):
            return prefix_hits.tables[group] if prefix_hits.tables else []
        if prefix_hits:
            raise ValueError("prefix hits of a KVCacheManager come from its get_prefix_hits")
        return []

    def allocate_prefix(
        self,
        seq: Sequence,
        prefix_hits: GroupHits | list[int] | None = None,
        *,
        record_stats: bool = True,
    ) -> int:
        hits = self.get_prefix_hits(seq) if prefix_hits is None else prefix_hits
        cached = 0
        for i, group in enumerate(self.groups):
            cached = group.allocate_prefix(
                seq, self._hits(hits, i), record_stats=record_stats and i == 0
            )
        if not self._direct:  # direct: bm.free, not self.free, ends the sequence
            self._owners[seq.seq_id] = seq
        return cached

    def mark_computed(self, seq: Sequence, upto: int | None = None) -> None:
        """Register computed full blocks in every group and give back, in sliding groups,
        blocks outside the window of every future query."""
        for group in self.groups:
            group.mark_computed(seq, upto)

    def register_uncomputed_prefix(self, token_ids: list[int]) -> int:
        """See :meth:`BlockManager.register_uncomputed_prefix`: in every paged group; returns
        the primary group's count."""
        counts = [g.register_uncomputed_prefix(token_ids) for g in self.groups]
        return counts[0]

    def reset_stats(self) -> None:
        for group in self.groups:
            group.reset_stats()

    def reset_prefix_cache(self) -> int:
        """Forget every cached block of every group; returns the primary group's count."""
        counts = [g.reset_prefix_cache() for g in self.groups]
        return counts[0]

    # -- allocation -------------------------------------------------------------------------
    def can_allocate(
        self,
        seq: Sequence,
        num_new_tokens: int,
        prefix_hits: GroupHits | list[int] | tuple[int, ...] = (),
    ) -> bool:
        for i, group in enumerate(self.groups):
            if not group.can_allocate(seq, num_new_tokens, self._hits(prefix_hits, i)):
                return False
        return all(pool.slot(seq) >= 0 or pool.num_free for pool in self.states)

    def append_slots(
        self, seq: Sequence, num_new_tokens: int
    ) -> list[tuple[int, int] | tuple[int, int, int]]:
        copies: list[tuple[int, int] | tuple[int, int, int]] = []
        copies.extend(self.primary.append_slots(seq, num_new_tokens))
        for i, group in enumerate(self.groups[1:], start=1):
            copies.extend((src, dst, i) for src, dst in group.append_slots(seq, num_new_tokens))
        for pool in self.states:
            if pool.slot(seq) < 0:
                self._state_ops.append((pool.index, -1, pool.take(seq)))
        self._owners[seq.seq_id] = seq
        return copies

    def trim(self, seq: Sequence, num_tokens: int) -> int:
        """Give back, in every paged group, ``seq``'s blocks past those ``num_tokens`` tokens
        need (:meth:`BlockManager.trim`); returns the primary group's count. State groups
        keep nothing per token and cannot take tokens back: speculative decoding refuses
        models with them."""
        counts = [group.trim(seq, num_tokens) for group in self.groups]
        return counts[0]

    def fork(self, parent: Sequence, child: Sequence) -> None:
        for group in self.groups:
            group.fork(parent, child)
        for pool in self.states:
            self._state_ops.append((pool.index, pool.slot(parent), pool.take(child)))
        self._owners[child.seq_id] = child

    def free(self, seq: Sequence) -> None:
        for group in self.groups:
            group.free(seq)
        for pool in self.states:
            pool.release(seq)
        self._owners.pop(seq.seq_id, None)

    def pop_state_ops(self) -> list[tuple[int, int, int]]:
        """``(group, src, dst)``: state slot ``dst`` of state group ``group`` takes a copy of
        slot ``src``, or zeros when ``src`` is -1; to apply in order before the next step's
        forward. Handed over once."""
        ops, self._state_ops = self._state_ops, []
        return ops

    # -- checking ---------------------------------------------------------------------------
    def check_invariants(self) -> None:
        for group in self.groups:
            group.check_invariants()
        for pool in self.states:
            pool.check_invariants(self._owners)

    def num_free_state_slots(self, group: int = 0) -> int:
        return self.states[group].num_free
