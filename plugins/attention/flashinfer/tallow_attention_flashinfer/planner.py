"""FlashInfer's wrappers, planned once per step and layer kind, run once per layer.

A wrapper's ``plan`` schedules a batch on the host (how the keys of each sequence are split
over thread blocks) and copies that schedule to the device; its ``run`` launches the kernels
of one layer with it. Per layer kind there is one wrapper for decode-only steps, one for steps
with prompts, and one per CUDA-graph batch size (FlashInfer's graph mode: fixed batch size,
page arguments in fixed buffers that the captured kernels read, re-filled by ``plan`` before
each replay). All of a kind's wrappers plan into one device scratch area and its pinned host
mirror, since a step uses one of them; the split-KV scratch (the float workspace) is shared
by every wrapper of every kind, since kernels run one after another.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from .kinds import LayerKind, decode_on_tensor_cores, prefill_kernels
from .paging import PageArgs

#: bytes of the scratch a plan writes its schedule into (FlashInfer's own size)
INT_WORKSPACE_BYTES = 8 << 20


@dataclass
class Planned:
    """A wrapper planned for one step of one layer kind, and the query rows it covers."""

    wrapper: Any
    rows: int

    def run(
        self, q: torch.Tensor, pages: tuple[torch.Tensor, torch.Tensor], out: torch.Tensor
    ) -> None:
        """Attention of ``q``'s first ``rows`` rows into ``out`` over ``pages``, the layer's K
        and V page tensors [blocks, block_size, kv heads, head size] (FlashInfer's NHD layout,
        which its paged kernels take as a (k, v) tuple)."""
        self.wrapper.run(q[: self.rows], pages, out=out[: self.rows])


@dataclass
class StepBatch:
    """What every layer kind's plan of one step is made from."""

    args: PageArgs
    indices: torch.Tensor  # the page list (device, int32; at least args.num_pages entries)
    block_size: int
    decode_only: bool
    #: captured in or replayed from a CUDA graph of ``args.num_seqs`` rows
    cuda_graph: bool
    #: width of the block tables (pages a sequence may have), sizes the graph page buffers
    table_width: int


class KindPlans:
    """The wrappers of one layer kind."""

    def __init__(
        self,
        kind: LayerKind,
        float_workspace: torch.Tensor,
        *,
        prefill_backend: str,
        decode_tensor_cores: str,
        capability: tuple[int, int],
    ) -> None:
        self.kind = kind
        self.float_workspace = float_workspace
        self.tensor_core_decode = decode_on_tensor_cores(kind, decode_tensor_cores)
        self.prefill_backend = prefill_kernels(kind, prefill_backend, capability)
        device = float_workspace.device
        self.int_workspace = torch.empty(INT_WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        self.pinned = torch.empty(
            INT_WORKSPACE_BYTES, dtype=torch.uint8, pin_memory=device.type == "cuda"
        )
        #: marks the copy of the last schedule out of ``pinned``: the next plan overwrites it
        self.copied: torch.cuda.Event | None = None
        self._decode: Any = None
        self._prefill: Any = None
        self._graphs: dict[int, Any] = {}

    # -- the wrappers ----------------------------------------------------------------------
    def _adopt(self, wrapper: Any) -> Any:
        """``wrapper`` planning into the kind's shared scratch instead of its own."""
        wrapper._int_workspace_buffer = self.int_workspace
        wrapper._pin_memory_int_workspace_buffer = self.pinned
        return wrapper

    def _decode_wrapper(self, **graph: Any) -> Any:
        import flashinfer

        tc = self.tensor_core_decode
        return self._adopt(
            flashinfer.BatchDecodeWithPagedKVCacheWrapper(
                self.float_workspace,
                "NHD",
                use_tensor_cores=tc,
                backend="fa2" if tc else "auto",
                **graph,
            )
        )

    def decode_wrapper(self) -> Any:
        if self._decode is None:
            self._decode = self._decode_wrapper()
        return self._decode

    def prefill_wrapper(self) -> Any:
        if self._prefill is None:
            import flashinfer

            self._prefill = self._adopt(
                flashinfer.BatchPrefillWithPagedKVCacheWrapper(
                    self.float_workspace, "NHD", backend=self.prefill_backend
                )
            )
        return self._prefill

    def graph_wrapper(self, num_seqs: int, table_width: int) -> Any:
        """The decode wrapper of CUDA graphs of ``num_seqs`` rows, with its fixed buffers."""
        wrapper = self._graphs.get(num_seqs)
        if wrapper is None:
            device = self.float_workspace.device
            wrapper = self._graphs[num_seqs] = self._decode_wrapper(
                use_cuda_graph=True,
                paged_kv_indptr_buffer=torch.zeros(num_seqs + 1, dtype=torch.int32, device=device),
                paged_kv_indices_buffer=torch.zeros(
                    num_seqs * table_width, dtype=torch.int32, device=device
                ),
                paged_kv_last_page_len_buffer=torch.zeros(
                    num_seqs, dtype=torch.int32, device=device
                ),
            )
        return wrapper

    # -- one step --------------------------------------------------------------------------
    def plan(self, batch: StepBatch) -> Planned:
        """Plan ``batch`` for this kind; the result runs every layer of the kind this step."""
        kind, args = self.kind, batch.args
        if self.copied is not None:
            self.copied.synchronize()  # the previous schedule has left the pinned buffer
        common = dict(
            window_left=kind.window_left,
            logits_soft_cap=kind.softcap,
            q_data_type=kind.q_dtype,
            kv_data_type=kind.kv_dtype,
            sm_scale=kind.scale,
            non_blocking=True,
        )
        indices = batch.indices[: args.num_pages]
        if batch.decode_only:
            wrapper = (
                self.graph_wrapper(args.num_seqs, batch.table_width)
                if batch.cuda_graph
                else self.decode_wrapper()
            )
            wrapper.plan(
                args.kv_indptr,
                indices,
                args.last_page_len,
                kind.num_heads,
                kind.num_kv_heads,
                kind.head_dim,
                batch.block_size,
                seq_lens=args.seq_lens,
                **common,
            )
            rows = args.num_seqs
        else:
            wrapper = self.prefill_wrapper()
            wrapper.plan(
                args.qo_indptr,
                args.kv_indptr,
                indices,
                args.last_page_len,
                kind.num_heads,
                kind.num_kv_heads,
                kind.head_dim,
                batch.block_size,
                causal=kind.causal,
                seq_lens=args.seq_lens,
                **common,
            )
            rows = args.num_rows
        if self.float_workspace.is_cuda:
            if self.copied is None:
                self.copied = torch.cuda.Event()
            self.copied.record()
        return Planned(wrapper, rows)
