"""Which fused-MoE config a call gets: the sweep's table for known shapes, the default else."""

from __future__ import annotations

import json

import pytest
import torch

from tallow.kernels import moe_config as mc


@pytest.fixture
def table(tmp_path, monkeypatch):
    path = tmp_path / "moe_configs.json"
    monkeypatch.setattr(mc, "TABLE_PATH", path)
    mc._table.cache_clear()
    yield path
    mc._table.cache_clear()


def test_default_takes_the_gemv_path_for_a_few_tokens_only(table):
    assert mc.moe_config(128, 768, 2048, 1).path == "gemv"
    assert mc.moe_config(128, 768, 2048, mc.DECODE_MAX_TOKENS).path == "gemv"
    big = mc.moe_config(128, 768, 2048, 4096)
    assert big.path == "gemm" and big.block_m == 64
    # few rows per expert: small blocks, so padding does not dominate
    assert mc.moe_config(128, 768, 2048, 16).block_m == 16


def test_table_buckets_pick_the_smallest_that_holds_the_tokens(table):
    gemv = mc.MoEConfig("gemv", 1, 16, 512, 8, 1)
    small = mc.MoEConfig("gemm", 16, 64, 128, 4, 4)
    large = mc.MoEConfig("gemm", 128, 128, 64, 8, 3)
    key = mc.table_key(128, 768, 2048, torch.bfloat16)
    table.write_text(
        json.dumps(
            {
                key: [
                    mc.table_entry(1 << 30, large),
                    mc.table_entry(2, gemv),
                    mc.table_entry(64, small),
                ]
            }
        )
    )
    assert mc.moe_config(128, 768, 2048, 1) == gemv
    assert mc.moe_config(128, 768, 2048, 3) == small
    assert mc.moe_config(128, 768, 2048, 65) == large
    # another shape or dtype falls back to the default
    assert mc.moe_config(64, 768, 2048, 1) == mc.default_moe_config(64, 768, 2048, 1)
    assert mc.moe_config(128, 768, 2048, 1, torch.float16) == mc.default_moe_config(
        128, 768, 2048, 1, torch.float16
    )


def test_configs_are_checked():
    with pytest.raises(ValueError, match="power of two"):
        mc.MoEConfig("gemm", 48, 64, 64)
    with pytest.raises(ValueError, match="at least 16"):
        mc.MoEConfig("gemm", 8, 64, 64)
    with pytest.raises(ValueError, match="path"):
        mc.MoEConfig("dense")
