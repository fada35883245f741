"""What an FP8 checkpoint's ``quantization_config`` says, checked (imports no torch).

Two dialects name the same storage, a float8 e4m3 weight and float scales that multiply it
back (``w = q * scale``):

- Hugging Face / vLLM ``quant_method: "fp8"`` (what ``FineGrainedFP8Config`` and vLLM write):
  without ``weight_block_size`` one ``weight_scale`` per tensor; with ``weight_block_size:
  [128, 128]`` one ``weight_scale_inv`` per 128 x 128 block, ``[ceil(N/128), ceil(K/128)]``,
  as DeepSeek-V3 and Qwen3-FP8 ship it (the name is historical: it multiplies). Activations:
  ``activation_scheme`` ``dynamic`` (computed per token, per 128-column group for block-wise
  weights) or ``static`` (one ``input_scale`` per tensor). ``fmt`` must be ``e4m3``.
- compressed-tensors (``quant_method: "compressed-tensors"``, ``format: float-quantized``, as
  llm-compressor writes it): the ``config_groups``' ``weights`` give the strategy, ``tensor``,
  ``channel`` (``weight_scale [N, 1]``) or ``block`` (``block_structure [128, 128]``), and
  ``input_activations`` how activations are quantized: ``token`` and dynamic, ``group`` of 128
  and dynamic (with block weights), ``tensor`` and static (``input_scale``), or none at all
  (weights only).

:func:`parse` turns either into an :class:`Fp8Config`; what it cannot serve raises
``ValueError`` naming the field.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: weight scale granularities
WEIGHT_KINDS = ("tensor", "channel", "block")
#: activation quantization: per token, per token and 128-column group, one static scale per
#: tensor, or none (weights only)
ACTIVATION_KINDS = ("token", "group", "static", "none")
#: the only block shape the kernels take (rows, columns)
BLOCK = (128, 128)

_CT = "compressed-tensors"


@dataclass(frozen=True)
class Fp8Config:
    """How one model's FP8 weights are stored and its activations quantized."""

    weights: str
    activations: str
    #: ``fp8`` (HF / vLLM names), ``compressed-tensors`` or ``isq`` (quantized at load)
    dialect: str = "fp8"

    def __post_init__(self) -> None:
        if self.weights not in WEIGHT_KINDS:
            raise ValueError(f"weights must be one of {WEIGHT_KINDS}, got {self.weights!r}")
        if self.activations not in ACTIVATION_KINDS:
            raise ValueError(
                f"activations must be one of {ACTIVATION_KINDS}, got {self.activations!r}"
            )
        allowed = ("group", "none") if self.block else ("token", "static", "none")
        if self.activations not in allowed:
            raise ValueError(
                f"{self.activations} activations do not go with {self.weights} "
                f"weights (expected one of {allowed})"
            )

    @property
    def block(self) -> bool:
        return self.weights == "block"

    @property
    def scale_name(self) -> str:
        """The checkpoint name of a layer's weight scale."""
        return "weight_scale_inv" if self.block and self.dialect == "fp8" else "weight_scale"

    def describe(self) -> str:
        acts = {
            "token": "activations per token",
            "group": "activations per token and 128 columns",
            "static": "static activation scales",
            "none": "weights only",
        }[self.activations]
        weights = "128x128 blocks" if self.block else f"per {self.weights}"
        return f"e4m3 {weights}, {acts}"


#: what ``model.isq fp8`` makes: one scale per output row, activations per token
ISQ_CONFIG = Fp8Config("channel", "token", "isq")


def detects(config: dict[str, Any]) -> bool:
    """Whether an HF-style ``config`` holds FP8 weights this plugin reads (its
    ``quantization_config`` may still be refused by :func:`parse`, naming the field)."""
    quant = config.get("quantization_config")
    if not isinstance(quant, dict):
        return False
    method = quant.get("quant_method")
    if method == "fp8":
        return True
    if method != _CT:
        return False
    groups = quant.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        return False
    for group in groups.values():
        weights = group.get("weights") if isinstance(group, dict) else None
        if not (
            isinstance(weights, dict)
            and weights.get("type") == "float"
            and weights.get("num_bits") == 8
        ):
            return False
    return True


def parse(config: dict[str, Any]) -> Fp8Config:
    """The :class:`Fp8Config` of an HF-style checkpoint ``config``; ``ValueError`` naming the
    field of a ``quantization_config`` this plugin cannot serve."""
    quant = config.get("quantization_config")
    if not isinstance(quant, dict):
        raise ValueError(f"quantization_config: expected an object, got {quant!r}")
    method = quant.get("quant_method")
    if method == "fp8":
        return _parse_fp8(quant)
    if method == _CT:
        return _parse_compressed_tensors(quant)
    raise ValueError(f"quantization_config.quant_method: expected 'fp8' or '{_CT}', got {method!r}")


def _parse_fp8(quant: dict[str, Any]) -> Fp8Config:
    where = "quantization_config"
    fmt = quant.get("fmt", "e4m3")
    if fmt != "e4m3":
        raise ValueError(f"{where}.fmt: only 'e4m3' weights are supported, got {fmt!r}")
    scheme = quant.get("activation_scheme", "dynamic")
    if scheme not in ("dynamic", "static"):
        raise ValueError(
            f"{where}.activation_scheme: expected 'dynamic' or 'static', got {scheme!r}"
        )
    block = quant.get("weight_block_size")
    if block is None:
        return Fp8Config("tensor", "token" if scheme == "dynamic" else "static", "fp8")
    if not isinstance(block, (list, tuple)) or list(block) != list(BLOCK):
        raise ValueError(
            f"{where}.weight_block_size: only {list(BLOCK)} blocks are supported, got {block!r}"
        )
    if scheme != "dynamic":
        raise ValueError(
            f"{where}.activation_scheme: block-wise weights "
            f"(weight_block_size {list(BLOCK)}) need 'dynamic' activations, got "
            f"{scheme!r}"
        )
    scale_fmt = quant.get("scale_fmt", "float")
    if scale_fmt not in ("float", "ue8m0"):
        raise ValueError(f"{where}.scale_fmt: expected 'float' or 'ue8m0', got {scale_fmt!r}")
    return Fp8Config("block", "group", "fp8")


def _parse_compressed_tensors(quant: dict[str, Any]) -> Fp8Config:
    where = "quantization_config"
    fmt = quant.get("format")
    groups = quant.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        raise ValueError(
            f"{where}.config_groups: expected a non-empty object of quantization "
            f"schemes, got {groups!r}"
        )
    status = quant.get("quantization_status", "compressed")
    if status != "compressed":
        raise ValueError(
            f"{where}.quantization_status: expected 'compressed' (weights stored "
            f"in float8), got {status!r}"
        )
    if quant.get("kv_cache_scheme"):
        raise ValueError(
            f"{where}.kv_cache_scheme: KV-cache scales stored in the checkpoint are "
            "not supported (choose a KV codec with cache.kv_codec instead)"
        )
    found = None
    for name, group in groups.items():
        at = f"{where}.config_groups.{name}"
        if not isinstance(group, dict):
            raise ValueError(f"{at}: expected an object, got {group!r}")
        group_fmt = group.get("format") or fmt
        if group_fmt not in ("float-quantized", "naive-quantized"):
            raise ValueError(
                f"{at}.format: expected 'float-quantized' (float8 weights), got {group_fmt!r}"
            )
        weights = _weights_kind(group.get("weights"), f"{at}.weights")
        acts = _activations_kind(group.get("input_activations"), weights, f"{at}.input_activations")
        if group.get("output_activations"):
            raise ValueError(f"{at}.output_activations: quantized outputs are not supported")
        if found is not None and found != (weights, acts):
            raise ValueError(
                f"{at}: every group must quantize alike; this one has {weights} "
                f"weights and {acts} activations, an earlier one {found[0]} and "
                f"{found[1]}"
            )
        found = (weights, acts)
    assert found is not None
    return Fp8Config(found[0], found[1], _CT)


def _float8_args(args: Any, at: str) -> dict[str, Any]:
    if not isinstance(args, dict):
        raise ValueError(f"{at}: expected an object, got {args!r}")
    if args.get("type") != "float" or args.get("num_bits") != 8:
        raise ValueError(
            f"{at}: expected 8-bit float quantization (type 'float', num_bits 8), "
            f"got type {args.get('type')!r}, num_bits {args.get('num_bits')!r}"
        )
    if args.get("symmetric", True) is not True:
        raise ValueError(f"{at}.symmetric: only symmetric float8 (no zero point) is supported")
    return args


def _weights_kind(args: Any, at: str) -> str:
    args = _float8_args(args, at)
    strategy = args.get("strategy")
    if args.get("dynamic"):
        raise ValueError(f"{at}.dynamic: weights must have static scales")
    if strategy in ("tensor", "channel"):
        return strategy
    if strategy == "block":
        block = args.get("block_structure")
        if not isinstance(block, (list, tuple)) or list(block) != list(BLOCK):
            raise ValueError(
                f"{at}.block_structure: only {list(BLOCK)} blocks are supported, got {block!r}"
            )
        return "block"
    raise ValueError(f"{at}.strategy: expected 'tensor', 'channel' or 'block', got {strategy!r}")


def _activations_kind(args: Any, weights: str, at: str) -> str:
    if args is None:
        return "none"
    args = _float8_args(args, at)
    strategy, dynamic = args.get("strategy"), args.get("dynamic")
    if weights == "block":
        if strategy == "group" and args.get("group_size") == BLOCK[1] and dynamic is True:
            return "group"
        raise ValueError(
            f"{at}: block-wise weights need dynamic activations in groups of "
            f"{BLOCK[1]} (strategy 'group', group_size {BLOCK[1]}, dynamic true), "
            f"got strategy {strategy!r}, group_size {args.get('group_size')!r}, "
            f"dynamic {dynamic!r}"
        )
    if strategy == "token" and dynamic is True:
        return "token"
    if strategy == "tensor" and dynamic is False:
        return "static"
    raise ValueError(
        f"{at}: expected dynamic per-token activations (strategy 'token', dynamic "
        f"true) or a static scale per tensor (strategy 'tensor', dynamic false), "
        f"got strategy {strategy!r}, dynamic {dynamic!r}"
    )
