"""The packed GEMM's weight layout and tiles (:mod:`tallow.kernels.packed_gemm` describes
both); no Triton here."""

from __future__ import annotations

from dataclasses import dataclass

import torch

KINDS = ("u4", "u8", "fp8", "e2m1")
_CODE_DTYPES = {
    "u4": torch.int32,
    "u8": torch.uint8,
    "fp8": torch.float8_e4m3fn,
    "e2m1": torch.int32,
}
#: the e2m1 (FP4) values by code, bit 3 the sign
E2M1_VALUES = (
    0.0,
    0.5,
    1.0,
    1.5,
    2.0,
    3.0,
    4.0,
    6.0,
    -0.0,
    -0.5,
    -1.0,
    -1.5,
    -2.0,
    -3.0,
    -4.0,
    -6.0,
)
#: the kinds whose codes are 4 bits, 8 to an int32 word along K
NIBBLE_KINDS = ("u4", "e2m1")
_FLOATS = (torch.float16, torch.bfloat16, torch.float32)
#: the largest M that takes the split-K variant in the default rule
SPLIT_K_MAX_ROWS = 16


@dataclass(frozen=True)
class PackedGemmWeight:
    """A ``[rows, cols]`` (N x K) weight in the packed GEMM's layout (module docstring)."""

    kind: str
    rows: int
    cols: int
    group: int
    codes: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor | None = None
    zero_point: float = 0.0
    mins: torch.Tensor | None = None
    scale_cols: int = 1

    def __post_init__(self) -> None:
        what = f"packed {self.kind} weight [{self.rows}, {self.cols}]"
        if self.kind not in KINDS:
            raise ValueError(f"{what}: kind must be one of {', '.join(KINDS)}")
        if self.group <= 0 or self.scale_cols <= 0:
            raise ValueError(
                f"{what}: group ({self.group}) and scale_cols ({self.scale_cols}) must be positive"
            )
        if self.kind in NIBBLE_KINDS and self.cols % 8:
            raise ValueError(f"{what}: 4-bit codes need K a multiple of 8, got {self.cols}")
        k_rows = self.cols // 8 if self.kind in NIBBLE_KINDS else self.cols
        groups = -(-self.cols // self.group)
        expect = {
            "codes": ((k_rows, self.rows), (_CODE_DTYPES[self.kind],)),
            "scales": ((groups, -(-self.rows // self.scale_cols)), _FLOATS),
        }
        if self.zeros is not None:
            expect["zeros"] = ((groups, self.rows), (torch.uint8,))
        if self.mins is not None:
            expect["mins"] = ((groups, self.rows), _FLOATS)
        for name, (shape, dtypes) in expect.items():
            t = getattr(self, name)
            if tuple(t.shape) != shape or t.dtype not in dtypes or not t.is_contiguous():
                raise ValueError(
                    f"{what}: {name} must be contiguous "
                    f"{'/'.join(map(str, dtypes))} of shape {shape}, got "
                    f"{t.dtype} {tuple(t.shape)}"
                )
        if self.kind in ("fp8", "e2m1") and (self.zeros is not None or self.zero_point):
            raise ValueError(f"{what}: {self.kind} codes are values; they take no zero point")

    @property
    def device(self) -> torch.device:
        return self.codes.device

    @property
    def nbytes(self) -> int:
        return sum(
            t.numel() * t.element_size()
            for t in (self.codes, self.scales, self.zeros, self.mins)
            if t is not None
        )


def pack_u4(codes: torch.Tensor) -> torch.Tensor:
    """Unsigned 4-bit codes ``[N, K]`` (any integer dtype, ``K`` a multiple of 8) → the
    ``u4`` layout's int32 words ``[K / 8, N]``."""
    n, k = codes.shape
    if k % 8:
        raise ValueError(f"4-bit codes: K ({k}) must be a multiple of 8")
    c = codes.to(torch.int64).T.reshape(k // 8, 8, n)
    shifts = (torch.arange(8, device=codes.device, dtype=torch.int64) * 4)[None, :, None]
    words = (c << shifts).sum(dim=1)
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32).contiguous()


def unpack_u4(words: torch.Tensor) -> torch.Tensor:
    """The inverse of :func:`pack_u4`: codes ``[N, K]`` (uint8)."""
    kw, n = words.shape
    shifts = (torch.arange(8, device=words.device, dtype=torch.int32) * 4)[None, :, None]
    codes = (words[:, None, :] >> shifts) & 15  # [K/8, 8, N]
    return codes.reshape(kw * 8, n).T.to(torch.uint8)


def packed_weight(
    kind: str,
    codes: torch.Tensor,
    scales: torch.Tensor,
    *,
    group: int,
    zeros: torch.Tensor | None = None,
    zero_point: float = 0.0,
    mins: torch.Tensor | None = None,
    scale_cols: int = 1,
) -> PackedGemmWeight:
    """A :class:`PackedGemmWeight` from tensors in the formats' row-major orientation: codes
    ``[N, K]`` (unsigned integers below ``2**bits``, or e4m3), scales ``[N / scale_cols, K /
    group]``, zeros and mins ``[N, K / group]``. They are transposed (and 4-bit codes packed)
    here, once."""
    if kind not in KINDS:
        raise ValueError(f"packed weight: kind must be one of {', '.join(KINDS)}, got {kind!r}")
    n, k = codes.shape
    if kind in NIBBLE_KINDS:
        if codes.numel() and int(codes.max()) > 15:
            raise ValueError(f"packed {kind} weight: codes must be below 16")
        stored = pack_u4(codes)
    elif kind == "u8":
        stored = codes.to(torch.uint8).T.contiguous()
    else:
        stored = codes.T.contiguous()

    def kmajor(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t.T.contiguous()

    return PackedGemmWeight(
        kind,
        n,
        k,
        group,
        stored,
        kmajor(scales),  # type: ignore[arg-type]
        kmajor(None if zeros is None else zeros.to(torch.uint8)),
        float(zero_point),
        kmajor(mins),
        scale_cols,
    )


def codes_of(w: PackedGemmWeight) -> torch.Tensor:
    """The codes as float32 ``[N, K]`` (exact; e2m1 codes as their values)."""
    if w.kind == "e2m1":
        table = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=w.device)
        return table[unpack_u4(w.codes).long()]
    if w.kind == "u4":
        return unpack_u4(w.codes).to(torch.float32)
    return w.codes.T.to(torch.float32)


def dequantize_packed_ref(w: PackedGemmWeight) -> torch.Tensor:
    """The weight as float32 ``[N, K]``, the arithmetic of the module docstring in torch."""
    k_idx = torch.arange(w.cols, device=w.device) // w.group
    n_idx = torch.arange(w.rows, device=w.device) // w.scale_cols
    scale = w.scales.to(torch.float32)[k_idx][:, n_idx].T  # [N, K]
    zero = (
        w.zeros.to(torch.float32)[k_idx].T
        if w.zeros is not None
        else torch.tensor(w.zero_point, dtype=torch.float32, device=w.device)
    )
    out = (codes_of(w) - zero) * scale
    if w.mins is not None:
        out = out - w.mins.to(torch.float32)[k_idx].T
    return out


@dataclass(frozen=True)
class PackedGemmConfig:
    """Tiles of one launch: ``split_k`` programs share each output tile's K (1: none);
    ``swap_ab``: the product computed transposed, ``y^T = W x^T``, so that the decoded weights
    are ``tl.dot``'s first operand, which Hopper's ``wgmma`` reads from registers (the second
    must pass through shared memory: only the few rows of x then do)."""

    block_m: int
    block_n: int
    block_k: int
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 3
    swap_ab: bool = False

    def __post_init__(self) -> None:
        for name in ("block_m", "block_n", "block_k"):
            v = getattr(self, name)
            if v < 16 or v & (v - 1):
                raise ValueError(
                    f"packed GEMM config: {name} must be a power of two >= 16 "
                    f"(tl.dot's smallest tile), got {v}"
                )
        if self.split_k < 1:
            raise ValueError(f"packed GEMM config: split_k must be >= 1, got {self.split_k}")


#: tuned tiles: (kind, M bucket, N, K) -> config; M buckets are :func:`m_bucket`'s
TUNED_CONFIGS: dict[tuple[str, int, int, int], PackedGemmConfig] = {}
#: programs the default rule aims the split-K grid at (about twice a Hopper GPU's SM count)
TARGET_PROGRAMS = 264


def load_tuned_configs(path: str) -> int:
    """Add the entries of a JSON table (``bench/gpu/packed_gemm_micro.py --sweep --table``:
    ``"kind,bucket,n,k"`` -> ``[block_m, block_n, block_k, split_k, num_warps, num_stages,
    swap_ab]``)
    to :data:`TUNED_CONFIGS`; returns how many."""
    import json

    with open(path) as f:
        table = json.load(f)
    for key, values in table.items():
        kind, bucket, n, k = key.split(",")
        if kind not in KINDS:
            raise ValueError(f"{path}: entry {key!r} names no packed kind ({', '.join(KINDS)})")
        TUNED_CONFIGS[(kind, int(bucket), int(n), int(k))] = PackedGemmConfig(*values)
    return len(table)


def m_bucket(m: int) -> int:
    """The row-count bucket of the config table: 1, 16, 64, 128 or 256 (anything above)."""
    for b in (1, 16, 64, 128):
        if m <= b:
            return b
    return 256


def packed_gemm_config(m: int, n: int, k: int, kind: str) -> PackedGemmConfig:
    """The tiles for ``M x N x K``: :data:`TUNED_CONFIGS`'s entry, else the default rule
    (split-K over ``BLOCK_N = 64`` tiles up to :data:`SPLIT_K_MAX_ROWS` rows, enough splits
    for :data:`TARGET_PROGRAMS` programs; 128 x 128 tiles above)."""
    bucket = m_bucket(m)
    tuned = TUNED_CONFIGS.get((kind, bucket, n, k))
    if tuned is not None:
        return tuned
    block_k = 128 if kind in NIBBLE_KINDS else 64
    if m <= SPLIT_K_MAX_ROWS:
        tiles_n = -(-n // 64)
        k_tiles = -(-k // block_k)
        split = max(1, min(k_tiles, TARGET_PROGRAMS // max(tiles_n, 1)))
        return PackedGemmConfig(16, 64, block_k, split, num_warps=4, num_stages=4, swap_ab=True)
    block_m = 64 if bucket <= 64 else 128
    return PackedGemmConfig(
        block_m,
        128,
        64 if kind in NIBBLE_KINDS else 32,
        1,
        num_warps=8 if block_m == 128 else 4,
        num_stages=3,
    )


def check_config(w: PackedGemmWeight, config: PackedGemmConfig) -> None:
    """Refuse tiles whose K blocks would straddle a scale group."""
    g, bk = w.group, config.block_k
    if not (g % bk == 0 or bk % g == 0 or g >= w.cols):
        raise ValueError(
            f"packed GEMM config: block_k {bk} and the weight's group {g} must divide one another"
        )
