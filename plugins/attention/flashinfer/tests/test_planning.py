"""Planning once per step: which FlashInfer wrapper each step and layer kind gets, with which
arguments, and how often — against a stand-in ``flashinfer`` module that records the calls, so
this runs anywhere. (That the real wrappers compute the right attention with these arguments is
test_attention_gpu.py's business.)"""

from __future__ import annotations

import dataclasses
import sys
import types
from typing import Any

import pytest
import torch

from tallow.layers import AttentionLayer
from tallow.plugin.testing.paged_batch import random_paged_step
from tallow_attention_flashinfer.backend import FlashInferAttentionBackend
from tallow_attention_flashinfer.kinds import LayerKind


class _Wrapper:
    def __init__(
        self, float_workspace_buffer: torch.Tensor, kv_layout: str = "NHD", **kwargs: Any
    ) -> None:
        self.float_workspace = float_workspace_buffer
        self.layout = kv_layout
        self.kwargs = kwargs
        self._int_workspace_buffer = torch.empty(8)  # its own, to be replaced
        self._pin_memory_int_workspace_buffer = torch.empty(8)
        self.plans: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
        self.runs: list[tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor], torch.Tensor]] = []

    def plan(self, *args: Any, **kwargs: Any) -> None:
        self.plans.append((args, kwargs))

    def run(
        self, q: torch.Tensor, kv: tuple[torch.Tensor, torch.Tensor], *, out: torch.Tensor
    ) -> torch.Tensor:
        self.runs.append((q, kv, out))
        return out


class Decode(_Wrapper):
    pass


class Prefill(_Wrapper):
    pass


@pytest.fixture
def fake_flashinfer(monkeypatch):
    module = types.ModuleType("flashinfer")
    module.BatchDecodeWithPagedKVCacheWrapper = Decode  # type: ignore[attr-defined]
    module.BatchPrefillWithPagedKVCacheWrapper = Prefill  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "flashinfer", module)
    return module


def backend(**settings: Any) -> FlashInferAttentionBackend:
    cfg = types.SimpleNamespace(
        plugins=types.SimpleNamespace(
            settings={"tallow-attention-flashinfer": {"workspace_mb": 16, **settings}}
        )
    )
    return FlashInferAttentionBackend(cfg)


def step(query_lens, context_lens, *, heads=8, kv_heads=2, window=None, softcap=None):
    return random_paged_step(
        query_lens=query_lens,
        context_lens=context_lens,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=64,
        block_size=16,
        dtype=torch.bfloat16,
        sliding_window=window,
        logit_softcap=softcap,
        seed=len(query_lens),
    )


def kind_of(s) -> LayerKind:
    return LayerKind.of(s.layer, torch.bfloat16, torch.bfloat16)


def test_a_step_with_prompts_is_planned_once_per_layer_kind(fake_flashinfer) -> None:
    be = backend()
    s = step([5, 1, 17], [0, 20, 3], window=8, softcap=30.0)
    planned = be._planned(s.meta, kind_of(s))
    assert be._planned(s.meta, kind_of(s)) is planned  # the next layer of the kind: no plan
    wrapper = planned.wrapper
    assert isinstance(wrapper, Prefill) and wrapper.kwargs == {"backend": "fa2"}
    assert wrapper.layout == "NHD" and len(wrapper.plans) == 1
    args, kwargs = wrapper.plans[0]
    qo, kv_indptr, indices, last, heads, kv_heads, head_dim, block = args
    assert qo.tolist() == [0, 5, 6, 23]
    assert kv_indptr.tolist() == [0, 1, 3, 5]  # 5, 21 and 20 tokens over pages of 16
    assert last.tolist() == [5, 5, 4]
    tables = s.meta.block_tables
    assert indices.tolist() == [
        int(tables[0, 0]),
        int(tables[1, 0]),
        int(tables[1, 1]),
        int(tables[2, 0]),
        int(tables[2, 1]),
    ]
    assert (heads, kv_heads, head_dim, block) == (8, 2, 64, 16)
    assert kwargs["causal"] is True and kwargs["seq_lens"].tolist() == [5, 21, 20]
    assert kwargs["window_left"] == 7 and kwargs["logits_soft_cap"] == 30.0
    assert kwargs["sm_scale"] == s.layer.scale
    assert kwargs["q_data_type"] == kwargs["kv_data_type"] == torch.bfloat16
    assert planned.rows == 23


def test_layer_kinds_get_plans_and_scratch_of_their_own(fake_flashinfer) -> None:
    be = backend()
    s = step([4, 1], [0, 9])
    local = dataclasses.replace(s.layer, sliding_window=4)  # a Gemma-style local layer
    a = be._planned(s.meta, kind_of(s))
    b = be._planned(s.meta, LayerKind.of(local, torch.bfloat16, torch.bfloat16))
    assert a.wrapper is not b.wrapper
    assert a.wrapper._int_workspace_buffer is not b.wrapper._int_workspace_buffer
    # split-KV scratch is shared by all (kernels run one after another)
    assert a.wrapper.float_workspace is b.wrapper.float_workspace
    assert b.wrapper.plans[0][1]["window_left"] == 3


def test_each_step_is_planned_again(fake_flashinfer) -> None:
    be = backend()
    s1, s2 = step([3, 2], [1, 0]), step([1, 4], [7, 2])
    kind = kind_of(s1)
    be.plan(s1.meta)
    first = be._planned(s1.meta, kind)
    be.plan(s2.meta)
    second = be._planned(s2.meta, kind)
    assert first.wrapper is second.wrapper and len(second.wrapper.plans) == 2
    # metadata nobody planned (a test calling forward directly) is planned on first use
    s3 = step([2, 2], [0, 0])
    be._planned(s3.meta, kind)
    assert len(second.wrapper.plans) == 3


def test_decode_steps_use_the_decode_wrapper(fake_flashinfer) -> None:
    be = backend()
    s = step([1, 1, 1], [0, 16, 40], heads=8, kv_heads=4)  # 2 query heads per KV head
    planned = be._planned(s.meta, kind_of(s))
    assert isinstance(planned.wrapper, Decode) and planned.rows == 3
    assert planned.wrapper.kwargs == {"use_tensor_cores": False, "backend": "auto"}
    (kv_indptr, _, last, *rest), kwargs = planned.wrapper.plans[0]
    assert kv_indptr.tolist() == [0, 1, 3, 6] and last.tolist() == [1, 1, 9]
    assert rest == [8, 4, 64, 16] and "causal" not in kwargs
    tensor_cores = backend(decode_tensor_cores="always")._planned(s.meta, kind_of(s)).wrapper
    assert tensor_cores.kwargs == {"use_tensor_cores": True, "backend": "fa2"}


def test_run_hands_over_the_k_and_v_pages_and_the_sequence_rows(fake_flashinfer) -> None:
    be = backend()
    s = step([1, 1], [3, 5])
    s = dataclasses.replace(s, q=torch.cat([s.q, s.q[:2]]))  # two padding rows after them
    out = torch.zeros_like(s.q)
    planned = be._planned(s.meta, kind_of(s))
    planned.run(s.q, (s.kv_cache["k"], s.kv_cache["v"]), out)
    q, (k_cache, v_cache), o = planned.wrapper.runs[0]
    assert q.shape[0] == 2 and o.shape[0] == 2 and o.data_ptr() == out.data_ptr()
    assert k_cache.data_ptr() == s.kv_cache["k"].data_ptr()
    assert k_cache.shape == s.kv_cache["k"].shape and k_cache.dim() == 4
    assert v_cache.data_ptr() == s.kv_cache["v"].data_ptr()


def graph_meta(s, size: int, width: int):
    """``s``'s metadata as a CUDA graph of ``size`` rows with tables ``width`` wide holds it
    (padding rows: length 1)."""
    n = s.meta.num_seqs
    tables = torch.zeros(size, width, dtype=torch.int32)
    tables[:n, : s.meta.block_tables.shape[1]] = s.meta.block_tables
    lens = s.meta.seq_lens_cpu + [1] * (size - n)
    return dataclasses.replace(
        s.meta,
        num_seqs=size,
        num_tokens=size,
        block_tables=tables,
        seq_lens=torch.tensor(lens, dtype=torch.int32),
        query_start_loc=torch.arange(size + 1, dtype=torch.int32),
        query_start_loc_cpu=list(range(size + 1)),
        seq_lens_cpu=lens,
        cuda_graph=True,
    )


def test_cuda_graph_steps_plan_every_kind_up_front_into_fixed_buffers(fake_flashinfer) -> None:
    be = backend()
    s = step([1, 1, 1], [4, 30, 17])
    kind = kind_of(s)
    with pytest.raises(RuntimeError, match="warm_up"):
        be.plan(graph_meta(s, 4, 8))
    be.kinds.add(kind)
    be.plan(graph_meta(s, 4, 8))
    planned = be._step.plans[kind]  # planned before any layer runs
    wrapper = planned.wrapper
    assert wrapper.kwargs["use_cuda_graph"] is True
    assert wrapper.kwargs["paged_kv_indptr_buffer"].shape == (5,)
    assert wrapper.kwargs["paged_kv_indices_buffer"].shape == (4 * 8,)
    assert wrapper.kwargs["paged_kv_last_page_len_buffer"].shape == (4,)
    (kv_indptr, indices, last, *_), _ = wrapper.plans[0]
    assert kv_indptr.tolist() == [0, 1, 3, 5, 6] and last.tolist() == [5, 15, 2, 1]
    assert len(indices) == 6 and planned.rows == 4
    # a replay of the same size re-plans the same wrapper (the graph reads its buffers)
    other = step([1, 1, 1], [40, 2, 60])
    be.plan(graph_meta(other, 4, 8))
    assert be._step.plans[kind].wrapper is wrapper and len(wrapper.plans) == 2
    # another size has a wrapper of its own; all of the kind plan into one scratch area
    be.plan(graph_meta(other, 8, 8))
    eight = be._step.plans[kind].wrapper
    assert eight is not wrapper and eight.kwargs["paged_kv_indptr_buffer"].shape == (9,)
    assert eight._int_workspace_buffer is wrapper._int_workspace_buffer
    assert eight._pin_memory_int_workspace_buffer is wrapper._pin_memory_int_workspace_buffer


@pytest.mark.parametrize("causal, window", [(True, None), (True, 8), (False, None)])
def test_warm_up_steps_are_whole_batches(causal: bool, window) -> None:
    """The tiny steps the warm-up runs per layer kind are well-formed: every query row has a
    slot in its own pages, and the reference computes them."""
    from tallow.kernels import store_cast_kv
    from tallow.kernels import paged_attention_ref
    from tallow.kernels import allocate_layer
    from tallow.kernels import CastKVCodec
    from tallow_attention_flashinfer.backend import _tiny_step
    from tallow_attention_flashinfer.paging import host_page_args

    layer = AttentionLayer(
        0, 8, 2, 64, 0.125, sliding_window=window, logit_softcap=None, causal=causal
    )
    kind = LayerKind.of(layer, torch.bfloat16, torch.float8_e4m3fn)
    codec = CastKVCodec(storage=torch.float8_e4m3fn)
    like = allocate_layer(
        codec, num_kv_heads=2, head_dim=64, block_size=4, num_blocks=1, model_dtype=torch.bfloat16
    )
    for query_lens, context_lens in (([3, 1], [2, 4] if causal else [0, 0]), ([1, 1], [5, 0])):
        lay, q, k, v, cache, meta = _tiny_step(kind, like, query_lens, context_lens)
        assert lay.sliding_window == window and lay.causal == causal
        assert cache.codec is codec and cache is not like
        assert cache["k"].dtype == torch.float8_e4m3fn and q.dtype == torch.bfloat16
        args = host_page_args(meta.query_start_loc_cpu, meta.seq_lens_cpu, 4)
        assert args.num_pages == cache.num_blocks  # every page of the cache belongs to one
        assert meta.is_decode_only == (query_lens == [1, 1])
        store_cast_kv(cache["k"], cache["v"], k, v, meta.slot_mapping)
        out = paged_attention_ref(
            q,
            cache,
            query_start_loc=meta.query_start_loc_cpu,
            seq_lens=meta.seq_lens_cpu,
            block_tables=meta.block_tables,
            scale=lay.scale,
            sliding_window=window,
            causal=causal,
        )
        assert out.shape == q.shape and bool(torch.isfinite(out.float()).all())
