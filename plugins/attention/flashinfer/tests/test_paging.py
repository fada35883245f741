"""tallow's step metadata as FlashInfer's page arguments, against expectations worked out by
hand, and the layer kinds' kernel choices. Runs anywhere (no GPU, no flashinfer)."""

from __future__ import annotations

import random

import pytest
import torch

from tallow.layers import AttentionLayer
from tallow_attention_flashinfer.kinds import (
    LayerKind,
    decode_on_tensor_cores,
    prefill_kernels,
    window_left,
)
from tallow_attention_flashinfer.paging import host_page_args, page_list

# Four sequences, block size 4: a decode over 1 token, a prefill of 2 tokens after 2 cached
# (exactly one full page), a 1-token chunk after 4 cached (a second page with one token), and
# 5 new tokens after 4 cached (pages of 4, 4, 1).
QSL = [0, 1, 3, 4, 9]
SEQ_LENS = [1, 4, 5, 9]
TABLES = torch.tensor([[7, 99, 99], [2, 99, 99], [5, 9, 99], [0, 3, 8]], dtype=torch.int32)


def test_host_offsets_of_a_batch() -> None:
    args = host_page_args(QSL, SEQ_LENS, block_size=4)
    assert args.qo_indptr.tolist() == [0, 1, 3, 4, 9]
    assert args.kv_indptr.tolist() == [0, 1, 2, 4, 7]  # pages 1, 1, 2, 3
    assert args.last_page_len.tolist() == [1, 4, 1, 1]
    assert args.seq_lens.tolist() == SEQ_LENS
    assert (args.num_pages, args.num_rows, args.num_seqs) == (7, 9, 4)
    for t in (args.qo_indptr, args.kv_indptr, args.last_page_len, args.seq_lens):
        assert t.dtype == torch.int32 and t.device.type == "cpu"


def test_page_list_of_a_batch() -> None:
    out = page_list(torch.tensor(SEQ_LENS, dtype=torch.int32), TABLES, block_size=4)
    assert out.shape == (4 * 3 + 1,) and out.dtype == torch.int32
    assert out[:7].tolist() == [7, 2, 5, 9, 0, 3, 8]
    # the entries past each sequence's pages all go to the last slot, never between pages
    assert out[-1].item() == 99


def test_page_list_fills_a_given_buffer_and_checks_it() -> None:
    buf = torch.full((13,), -5, dtype=torch.int32)
    assert page_list(torch.tensor(SEQ_LENS), TABLES, 4, out=buf) is buf
    assert buf[:7].tolist() == [7, 2, 5, 9, 0, 3, 8]
    with pytest.raises(ValueError, match=r"out must be int32 \[13\]"):
        page_list(torch.tensor(SEQ_LENS), TABLES, 4, out=torch.zeros(12, dtype=torch.int32))


@pytest.mark.parametrize("seed", range(5))
def test_page_list_matches_the_block_tables_on_random_batches(seed: int) -> None:
    rng = random.Random(seed)
    block_size = rng.choice([1, 4, 16])
    lens = [rng.randint(1, 70) for _ in range(rng.randint(1, 9))]
    width = max(-(-n // block_size) for n in lens) + rng.randint(0, 3)
    tables = torch.randint(0, 1000, (len(lens), width), dtype=torch.int32)
    want = [int(tables[i, j]) for i, n in enumerate(lens) for j in range(-(-n // block_size))]
    got = page_list(torch.tensor(lens, dtype=torch.int32), tables, block_size)
    assert got[: len(want)].tolist() == want
    args = host_page_args(list(range(len(lens) + 1)), lens, block_size)
    assert args.num_pages == len(want)
    ends = args.kv_indptr.tolist()
    for i, n in enumerate(lens):  # each sequence's run of pages, and its last page's fill
        assert ends[i + 1] - ends[i] == -(-n // block_size)
        assert (ends[i + 1] - ends[i] - 1) * block_size + int(args.last_page_len[i]) == n


@pytest.mark.parametrize(
    "qsl, lens, message",
    [
        ([0, 1], [1, 2], "query_start_loc must have 3 entries"),
        ([0, 2, 2], [2, 3], "grow by at least 1"),
        ([1, 2], [3], "must start at 0"),
        ([0, 3], [2], r"seq_lens\[0\] = 2 is shorter than the sequence's 3 query rows"),
        ([0], [], "one length per sequence"),
    ],
)
def test_inconsistent_batches_are_refused(qsl, lens, message) -> None:
    with pytest.raises(ValueError, match=message):
        host_page_args(qsl, lens, block_size=16)


def test_window_left_counts_the_same_keys_as_the_reference() -> None:
    """tallow's window W lets the query at p see keys with p - k < W (attention_ref); FlashInfer
    lets it see keys p - window_left ... p."""
    assert window_left(None) == -1 and window_left(0) == -1
    for window in (1, 2, 7, 64):
        left = window_left(window)
        for p in range(0, 80):
            ours = {k for k in range(p + 1) if p - k < window}
            theirs = set(range(max(0, p - left), p + 1))
            assert ours == theirs


def kind(heads: int, kv_heads: int, kv_dtype: torch.dtype = torch.bfloat16) -> LayerKind:
    layer = AttentionLayer(0, heads, kv_heads, 128, 0.1, sliding_window=8, logit_softcap=30.0)
    return LayerKind.of(layer, torch.bfloat16, kv_dtype)


def test_layer_kind_carries_what_a_plan_depends_on() -> None:
    k = kind(32, 8)
    assert (k.num_heads, k.num_kv_heads, k.head_dim, k.scale, k.group) == (32, 8, 128, 0.1, 4)
    assert (k.window_left, k.softcap, k.causal) == (7, 30.0, True)
    plain = LayerKind.of(AttentionLayer(0, 4, 2, 64, 0.125), torch.float16, torch.float16)
    assert (plain.window_left, plain.softcap) == (-1, 0.0)
    assert kind(32, 8) == k and hash(kind(32, 8)) == hash(k) and kind(32, 4) != k


def test_decode_kernel_choice() -> None:
    assert not decode_on_tensor_cores(kind(16, 8), "auto")  # 2 query heads per KV head
    assert decode_on_tensor_cores(kind(32, 8), "auto")  # 4
    assert decode_on_tensor_cores(kind(16, 8, torch.float8_e4m3fn), "auto")  # 8-bit cache
    assert decode_on_tensor_cores(kind(16, 8), "always")
    assert not decode_on_tensor_cores(kind(32, 8), "never")
    # 6 query heads per KV head: FlashInfer's CUDA-core decode is not compiled for it
    assert decode_on_tensor_cores(kind(48, 8), "never")


def test_prefill_kernel_choice() -> None:
    assert prefill_kernels(kind(32, 8), "auto", (9, 0)) == "fa3"
    assert prefill_kernels(kind(32, 8), "auto", (8, 0)) == "fa2"
    assert prefill_kernels(kind(32, 8), "auto", (10, 0)) == "fa2"
    assert prefill_kernels(kind(32, 8, torch.float8_e5m2), "auto", (9, 0)) == "fa2"
    assert prefill_kernels(kind(32, 8), "fa2", (9, 0)) == "fa2"
