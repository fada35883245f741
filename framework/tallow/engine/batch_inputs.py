"""The host-side inputs of the model runner's steps and their move to the device.

:class:`BatchInputs` (one per :class:`tallow.engine.model_runner.ModelRunner`) builds a step's
flat batch (token ids, positions, slot mapping, block tables, sampled and fed rows) in reusable
staging buffers, pinned when a GPU is in use (:meth:`BatchInputs.fill_host`; a tensor-parallel
worker copies a received batch into them with :meth:`BatchInputs.stage`), and moves it to the
device in one transfer per buffer (:meth:`BatchInputs.upload`) as a :class:`DeviceBatch`.
The layout of the two buffers is :class:`tallow.types.HostBatch`'s.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt
import torch

from tallow.layers import AttentionMetadata
from tallow.types import HostBatch

from .scheduled import ScheduledSeq
from .sequence import Sequence

__all__ = ["BatchInputs", "DeviceBatch", "logit_rows"]


@dataclass
class DeviceBatch:
    """One step's inputs on the device."""

    ids: torch.Tensor
    pos: torch.Tensor
    meta: AttentionMetadata
    #: the flat rows whose logits are sampled, one per sampled sequence
    sample_rows: torch.Tensor
    #: rows whose input id is a token of the step still running, and its row in that step's
    #: token ids (None when there are none)
    fed_rows: torch.Tensor | None = None
    fed_from: torch.Tensor | None = None


def _fill_block_table(table: np.ndarray, tables: list[list[int]]) -> None:
    """Write the block tables into the rows of ``table`` (zeros past each one's end) with one
    numpy conversion of all their ids rather than one per row."""
    table.fill(0)
    flat: list[int] = []
    for blocks in tables:
        flat.extend(blocks)
    lengths = np.fromiter(map(len, tables), dtype=np.int64, count=len(tables))
    table[np.arange(table.shape[1]) < lengths[:, None]] = flat


def logit_rows(scheduled: list[ScheduledSeq], host: HostBatch | None) -> list[tuple[int, int]]:
    """The row ranges whose logits a step computes for prompt logprobs, in order."""
    if host is None or not any(item.prompt_logprobs for item in scheduled):
        return []
    qsl = host.query_start_loc
    return [(qsl[i], qsl[i + 1]) for i, item in enumerate(scheduled) if item.prompt_logprobs]


class BatchInputs:
    """The staging buffers of a runner's steps and the flat batch built in them.

    ``num_paged_groups`` paged cache groups (each with its own block table and slots, the
    first being the primary one) and ``num_state_groups`` groups of per-sequence state slots;
    ``free_state_slot`` is the state slot of padding rows and of sequences holding none.
    """

    def __init__(
        self,
        *,
        device: torch.device,
        block_size: int,
        num_paged_groups: int = 1,
        num_state_groups: int = 0,
        free_state_slot: int = 0,
    ) -> None:
        self.device = device
        self.block_size = block_size
        self.num_paged_groups = max(1, num_paged_groups)
        self.num_state_groups = num_state_groups
        self.free_state_slot = free_state_slot
        self._host: dict[str, torch.Tensor] = {}
        self._copied: torch.cuda.Event | None = None  # marks the last host→device transfers

    def _staging(self, name: str, n: int, dtype: npt.DTypeLike) -> np.ndarray:
        """A reusable host buffer (pinned when a GPU is in use) of at least ``n`` elements.

        Reused every step: :meth:`fill_host` and :meth:`stage` first wait for the previous
        step's copies out of these buffers (a step that samples nothing is not otherwise
        waited for).
        """
        buf = self._host.get(name)
        if buf is None or buf.numel() < n:
            size = max(n, 2 * (buf.numel() if buf is not None else 1024))
            buf = torch.empty(
                size,
                dtype=torch.from_numpy(np.empty(0, dtype)).dtype,
                pin_memory=self.device.type == "cuda",
            )
            self._host[name] = buf
        return buf.numpy()[:n]

    def _to_device(self, name: str, array: np.ndarray) -> torch.Tensor:
        host = self._host[name][: array.size]
        return host.to(self.device, non_blocking=True)

    def prepare(
        self, scheduled: list[ScheduledSeq], fed: dict[int, int] | None = None
    ) -> DeviceBatch:
        """The step's flat batch for ``scheduled`` on the device: :meth:`fill_host`, then
        :meth:`upload`."""
        return self.upload(self.fill_host(scheduled, fed))

    def _reuse_staging(self) -> None:
        if self._copied is not None:
            self._copied.synchronize()  # the last step's transfers have left the buffers
            self._copied = None

    def fill_host(
        self, scheduled: list[ScheduledSeq], fed: dict[int, int] | None = None
    ) -> HostBatch:
        """Host-side flat batch for ``scheduled`` (list of ScheduledSeq) in the staging buffers
        (int64: tokens, positions, slots, sampled rows, fed rows; int32: offsets, lengths,
        tables).

        ``fed`` maps each sequence sampled by the step still running (async scheduling) to its
        row in that step's token ids: a sequence whose last token is still pending gets a
        placeholder id here, and the batch says where on the device the real one is.
        """
        self._reuse_staging()
        bs = self.block_size
        num_seqs = len(scheduled)
        lens = [item.num_tokens for item in scheduled]
        num_tokens = sum(lens)
        # a verify row group (proposed tokens) has every row sampled, others one per target
        num_sampled = sum(
            item.num_tokens if item.draft_token_ids else len(item.sample_seqs) for item in scheduled
        )
        seq_lens = [item.start + item.num_tokens for item in scheduled]
        tables = [item.seq.block_ids for item in scheduled]
        num_groups, num_states = self.num_paged_groups, self.num_state_groups
        group_tables = [
            [item.seq.block_tables[g] for item in scheduled] for g in range(1, num_groups)
        ]
        # Wide enough for every block table (a table may run ahead of this step's tokens).
        width = max(
            1,
            max(map(len, tables)),
            -(-max(seq_lens) // bs),
            *(len(t) for ts in group_tables for t in ts),
        )
        # int64 layout: ids, positions, slots [num_tokens each], sampled rows [num_sampled],
        # fed rows and their sources [at most one per sequence each], other groups' slots
        # [num_tokens each], state slots [num_seqs per state group].
        fed_at = 3 * num_tokens + num_sampled
        extra_at = fed_at + 2 * num_seqs
        i64 = self._staging(
            "i64", extra_at + (num_groups - 1) * num_tokens + num_states * num_seqs, np.int64
        )
        ids, pos = i64[:num_tokens], i64[num_tokens : 2 * num_tokens]
        slots = i64[2 * num_tokens : 3 * num_tokens]
        sample_rows = i64[3 * num_tokens : fed_at]
        fed_rows, fed_from = i64[fed_at : fed_at + num_seqs], i64[fed_at + num_seqs : extra_at]
        table_at = 2 * num_seqs + 1
        i32 = self._staging("i32", table_at + num_groups * num_seqs * width, np.int32)
        qsl = i32[: num_seqs + 1]
        lens_arr = i32[num_seqs + 1 : table_at]
        table = i32[table_at : table_at + num_seqs * width].reshape(num_seqs, width)
        qsl[0] = 0
        np.cumsum(lens, out=qsl[1:])
        lens_arr[:] = seq_lens
        _fill_block_table(table, tables)
        # Decode rows (one token each, most rows of a busy step) are gathered into lists and
        # written with one numpy call each: per-element numpy writes cost more than the lists.
        one_rows: list[int] = []
        one_ids: list[int] = []
        one_pos: list[int] = []
        one_slots: list[int] = []
        fed_list: list[tuple[int, int]] = []
        rows: list[int] = []
        t = 0
        for i, item in enumerate(scheduled):
            seq, start, n = item.seq, item.start, item.num_tokens
            if n == 1:
                one_rows.append(t)
                one_ids.append(seq.all_token_ids[start])
                one_pos.append(start)
                one_slots.append(tables[i][start // bs] * bs + start % bs)
            else:
                if item.draft_token_ids:
                    ids[t] = seq.all_token_ids[start]
                    ids[t + 1 : t + n] = item.draft_token_ids
                else:
                    ids[t : t + n] = seq.all_token_ids[start : start + n]
                p = np.arange(start, start + n)
                pos[t : t + n] = p
                slots[t : t + n] = table[i, p // bs].astype(np.int64) * bs + p % bs
            t += n
            if seq.num_pending_tokens and start + n == seq.num_tokens:
                # Only a sequence's last token can be pending when a step is planned.
                fed_list.append((t - 1, self._fed_row(fed, seq)))
            if item.draft_token_ids:
                rows.extend(range(t - n, t))
            elif item.sample_seqs:
                rows.extend([t - 1] * len(item.sample_seqs))
        if len(one_rows) == num_tokens:  # decode only: the rows are 0 .. num_tokens - 1
            ids[:], pos[:], slots[:] = one_ids, one_pos, one_slots
        elif one_rows:
            ids[one_rows], pos[one_rows], slots[one_rows] = one_ids, one_pos, one_slots
        sample_rows[:] = rows
        num_fed = len(fed_list)
        if num_fed:
            fed_rows[:num_fed], fed_from[:num_fed] = zip(*fed_list)
        if group_tables:
            seq_of_row = np.repeat(np.arange(num_seqs), lens)
            for g, own in enumerate(group_tables, start=1):
                at = table_at + g * num_seqs * width
                g_table = i32[at : at + num_seqs * width].reshape(num_seqs, width)
                _fill_block_table(g_table, own)
                g_slots = i64[extra_at + (g - 1) * num_tokens : extra_at + g * num_tokens]
                g_slots[:] = g_table[seq_of_row, pos // bs].astype(np.int64) * bs + pos % bs
        state_at = extra_at + (num_groups - 1) * num_tokens
        for s in range(num_states):
            dummy = self.free_state_slot  # padding and sequences holding no slot
            i64[state_at + s * num_seqs : state_at + (s + 1) * num_seqs] = [
                item.seq.state_slots[s]
                if len(item.seq.state_slots) > s and item.seq.state_slots[s] >= 0
                else dummy
                for item in scheduled
            ]
        return HostBatch(
            i64,
            i32,
            num_seqs=num_seqs,
            num_tokens=num_tokens,
            num_sampled=num_sampled,
            num_fed=num_fed,
            width=width,
            max_query_len=max(lens),
            max_seq_len=max(seq_lens),
            num_groups=num_groups,
            num_state_groups=num_states,
        )

    def stage(self, host: HostBatch) -> HostBatch:
        """``host`` (built elsewhere: a tensor-parallel worker receives it) copied into this
        runner's staging buffers, ready for :meth:`upload`."""
        self._reuse_staging()
        i64 = self._staging("i64", host.i64.size, np.int64)
        i64[:] = host.i64
        i32 = self._staging("i32", host.i32.size, np.int32)
        i32[:] = host.i32
        return replace(host, i64=i64, i32=i32)

    def upload(self, host: HostBatch) -> DeviceBatch:
        """Move a batch of the staging buffers (:meth:`fill_host`, :meth:`stage`) to the
        device: one transfer per buffer."""
        num_seqs, num_tokens, width = host.num_seqs, host.num_tokens, host.width
        fed_at = 3 * num_tokens + host.num_sampled
        dev_i64 = self._to_device("i64", host.i64)
        dev_i32 = self._to_device("i32", host.i32)
        if self.device.type == "cuda":
            self._copied = torch.cuda.Event()
            self._copied.record()
        table_at, table_len = 2 * num_seqs + 1, num_seqs * width
        meta = AttentionMetadata(
            num_seqs=num_seqs,
            num_tokens=num_tokens,
            query_start_loc=dev_i32[: num_seqs + 1],
            seq_lens=dev_i32[num_seqs + 1 : table_at],
            block_tables=dev_i32[table_at : table_at + table_len].view(num_seqs, width),
            slot_mapping=dev_i64[2 * num_tokens : 3 * num_tokens],
            max_query_len=host.max_query_len,
            max_seq_len=host.max_seq_len,
            block_size=self.block_size,
            query_start_loc_cpu=host.query_start_loc,
            seq_lens_cpu=host.seq_lens,
        )
        extra_at = fed_at + 2 * num_seqs
        if host.num_groups > 1:
            views = [meta]
            for g in range(1, host.num_groups):
                at = table_at + g * table_len
                views.append(
                    replace(
                        meta,
                        block_tables=dev_i32[at : at + table_len].view(num_seqs, width),
                        slot_mapping=dev_i64[
                            extra_at + (g - 1) * num_tokens : extra_at + g * num_tokens
                        ],
                    )
                )
            meta.group_views = views
        state_at = extra_at + (host.num_groups - 1) * num_tokens
        meta.state_slots = [
            dev_i64[state_at + s * num_seqs : state_at + (s + 1) * num_seqs]
            for s in range(host.num_state_groups)
        ]
        batch = DeviceBatch(
            dev_i64[:num_tokens],
            dev_i64[num_tokens : 2 * num_tokens],
            meta,
            sample_rows=dev_i64[3 * num_tokens : fed_at],
        )
        num_fed = host.num_fed
        if num_fed:
            batch.fed_rows = dev_i64[fed_at : fed_at + num_fed]
            batch.fed_from = dev_i64[fed_at + num_seqs : fed_at + num_seqs + num_fed]
        return batch

    @staticmethod
    def _fed_row(fed: dict[int, int] | None, seq: Sequence) -> int:
        row = None if fed is None else fed.get(seq.seq_id)
        if row is None or seq.num_pending_tokens != 1:
            raise RuntimeError(
                f"sequence {seq.seq_id} has {seq.num_pending_tokens} pending "
                "token(s) that the step in flight did not sample"
            )
        return row
