"""Tile configurations of the fused-MoE kernels, per (experts, intermediate, hidden, tokens).

A :class:`MoEConfig` picks the path (``gemv`` for a few tokens, ``gemm`` beyond) and its tiles.
:func:`moe_config` looks the shape up in ``moe_configs.json`` (written by
``bench/gpu/moe_sweep.py`` on a GPU: for each shape a list of token-count buckets, each with
the config that ran fastest for it) and falls back to :func:`default_moe_config`.
"""

from __future__ import annotations

import functools
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

TABLE_PATH = Path(__file__).with_name("moe_configs.json")
PATHS = ("gemv", "gemm")
#: up to this many tokens the default takes the GEMV path
DECODE_MAX_TOKENS = 4


@dataclass(frozen=True)
class MoEConfig:
    """How :func:`tallow.kernels.moe.fused_moe` runs one call.

    ``path`` ``"gemv"``: one program per (token, expert, ``block_n`` output features), reading
    ``block_k`` columns per step (no alignment, no tensor cores: a few tokens). ``"gemm"``: the
    grouped GEMM over :func:`~tallow.kernels.moe.moe_align`'s blocks of ``block_m`` rows.
    ``num_warps`` / ``num_stages`` go to the launch."""

    path: str = "gemm"
    block_m: int = 64
    block_n: int = 64
    block_k: int = 32
    num_warps: int = 4
    num_stages: int = 3

    def __post_init__(self) -> None:
        if self.path not in PATHS:
            raise ValueError(f"MoEConfig.path must be one of {PATHS}, got {self.path!r}")
        for name in ("block_m", "block_n", "block_k"):
            value = getattr(self, name)
            if value < 1 or value & (value - 1):
                raise ValueError(f"MoEConfig.{name} must be a power of two, got {value}")
        if self.path == "gemm" and min(self.block_m, self.block_n, self.block_k) < 16:
            raise ValueError(
                f"MoEConfig: the grouped GEMM needs tiles of at least 16 (tl.dot), got {self}"
            )


def default_moe_config(
    num_experts: int,
    intermediate: int,
    hidden: int,
    tokens: int,
    dtype: torch.dtype = torch.bfloat16,
) -> MoEConfig:
    """A config that is reasonable everywhere: the GEMV path up to
    :data:`DECODE_MAX_TOKENS` tokens (each pair reads only its expert's rows: batch-1 decode
    is a stream of ``top_k`` experts' weights); then block_m growing with the rows an expert
    gets on average, so few tokens do not pad every block to 64 rows."""
    if tokens <= DECODE_MAX_TOKENS:
        # 16-byte loads of 16-bit weights, eight rows per program: enough programs to fill
        # the GPU for every pair while each streams whole cache lines
        return MoEConfig("gemv", block_m=1, block_n=8, block_k=256, num_warps=4, num_stages=1)
    per_expert = tokens * 8 / max(num_experts, 1)  # top_k is not known here: assume 8
    block_m = 16 if per_expert <= 16 else 32 if per_expert <= 64 else 64
    block_n = 64 if tokens <= 256 else 128
    return MoEConfig(
        "gemm",
        block_m=block_m,
        block_n=block_n,
        block_k=64,
        num_warps=4 if block_n == 64 else 8,
        num_stages=3,
    )


@functools.lru_cache(maxsize=1)
def _table() -> dict[str, list[dict]]:
    if not TABLE_PATH.exists():
        return {}
    return json.loads(TABLE_PATH.read_text())


def table_key(num_experts: int, intermediate: int, hidden: int, dtype: torch.dtype) -> str:
    """The key of a shape in ``moe_configs.json``."""
    return f"E={num_experts},I={intermediate},H={hidden},{str(dtype).removeprefix('torch.')}"


def moe_config(
    num_experts: int,
    intermediate: int,
    hidden: int,
    tokens: int,
    dtype: torch.dtype = torch.bfloat16,
) -> MoEConfig:
    """The tuned config of the smallest bucket that holds ``tokens`` for this shape, else
    :func:`default_moe_config`."""
    buckets = _table().get(table_key(num_experts, intermediate, hidden, dtype))
    if buckets:
        for entry in sorted(buckets, key=lambda b: b["max_tokens"]):
            if tokens <= entry["max_tokens"]:
                return MoEConfig(**{k: v for k, v in entry.items() if k != "max_tokens"})
    return default_moe_config(num_experts, intermediate, hidden, tokens, dtype)


def table_entry(max_tokens: int, config: MoEConfig) -> dict:
    """One bucket of ``moe_configs.json`` (what the sweep script writes)."""
    return {"max_tokens": max_tokens, **asdict(config)}
