"""The launch policy the packed-weight GEMVs share (tallow.kernels.quad_gemv)."""

from __future__ import annotations

import torch

from tallow.kernels.quad_gemv import MAX_WARPS, WARPS_PER_SM, launch_config, warps_along_k


def test_few_programs_spread_their_warps_along_k_until_the_gpu_is_full():
    # llama-3-8b at batch 1, 8 rows per program, 132 SMs: o_proj (512 programs, 128 quads a
    # row) takes 4 warps, gate_up (3584 programs) keeps 1
    assert warps_along_k(512, 128, 132) == 4
    assert warps_along_k(3584, 128, 132) == 1
    assert 512 * 4 >= 132 * WARPS_PER_SM


def test_an_iteration_never_outgrows_a_row_nor_the_warp_limit():
    assert warps_along_k(1, 40, 132) == 1  # 64 quads for 2 warps do not fit in 40
    assert warps_along_k(1, 64, 132) == 2
    assert warps_along_k(1, 10_000, 132) == MAX_WARPS
    assert warps_along_k(1, 10_000, 132, warps=4) == MAX_WARPS


def test_launch_config_counts_the_programs_of_the_shape():
    cpu = torch.device("cpu")  # the interpreter's default SM count
    assert launch_config((1, 8, 1, True), 1, 4096, 448, cpu) == (1, 8, 4, True)
    assert launch_config((4, 2, 1, True), 16, 4096, 128, cpu) == (4, 2, 1, True)
