"""Reading a checkpoint's ``quantization_config``: which layout its integer weights are in.

:func:`checkpoint_layout` turns the config into a :class:`CheckpointLayout` (the tensors each
quantized linear layer stores, and how to read them) or raises ``ValueError`` naming the field
it cannot serve. :func:`holds_integer_weights` is the scheme's ``detect``: whether the config
is one of the integer weight formats at all (a compressed-tensors checkpoint may hold fp8 or
fp4 weights instead, which other schemes serve).

Code widths and group sizes are read again from each layer's tensors when it loads (GPTQModel's
``dynamic`` and compressed-tensors' config groups may give layers other values than the
defaults), so the config's ``bits`` and ``group_size`` are checked here only for values no
layer could use.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: ``quant_method`` values of the formats read here
GPTQ_METHODS = ("gptq", "gptq_marlin")
AWQ_METHODS = ("awq", "awq_marlin")
QUANT_METHODS = (*GPTQ_METHODS, *AWQ_METHODS, "marlin", "compressed-tensors")


@dataclass(frozen=True)
class CheckpointLayout:
    """How one quantized linear layer is stored (see :mod:`tallow_quant_int4.formats`).

    ``tensors``: the suffixes of its checkpoint tensors (``q_proj.qweight``...), ``required``
    those without which it cannot be unpacked. ``zero_offset``: what GPTQ v1 subtracted from
    its stored zero points."""

    kind: str  # "gptq", "awq", "compressed" or "marlin"
    method: str  # the quant_method as the config gives it
    tensors: tuple[str, ...]
    required: tuple[str, ...]
    zero_offset: int = 0
    desc_act: bool = False

    @property
    def optional(self) -> tuple[str, ...]:
        return tuple(t for t in self.tensors if t not in self.required)


def _field(q: dict[str, Any], key: str, default: Any = None) -> Any:
    return q.get(key, default)


def _fail(key: str, value: Any, expected: str) -> ValueError:
    return ValueError(
        f"quantization_config.{key}: {value!r} is not supported (expected {expected})"
    )


def _check_bits(q: dict[str, Any], allowed: tuple[int, ...], key: str = "bits") -> None:
    bits = _field(q, key)
    if bits is not None and bits not in allowed:
        raise _fail(key, bits, " or ".join(map(str, allowed)))


def _check_group(q: dict[str, Any], key: str = "group_size") -> None:
    group = _field(q, key)
    if group is None:
        return
    if isinstance(group, bool) or not isinstance(group, int) or (group <= 0 and group != -1):
        raise _fail(key, group, "-1 (one group per row) or a positive number of columns")


def _check_bool(q: dict[str, Any], key: str) -> bool:
    value = _field(q, key, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise _fail(key, value, "true or false")
    return value


def _compressed_groups(q: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    groups = _field(q, "config_groups") or {}
    if not isinstance(groups, dict):
        raise _fail("config_groups", groups, "a mapping of group names to schemes")
    return list(groups.items())


def holds_integer_weights(config: dict[str, Any]) -> bool:
    """Whether the HF-style ``config``'s ``quantization_config`` stores integer weights in one
    of the formats this plugin reads (GPTQ, AWQ, Marlin, compressed-tensors with integer
    weights and float activations)."""
    q = config.get("quantization_config")
    if not isinstance(q, dict):
        return False
    method = q.get("quant_method")
    if method in GPTQ_METHODS or method in AWQ_METHODS or method == "marlin":
        return True
    if method != "compressed-tensors":
        return False
    try:
        groups = _compressed_groups(q)
    except ValueError:
        return False
    if not groups:
        return False
    for _, scheme in groups:
        weights = scheme.get("weights") if isinstance(scheme, dict) else None
        if not isinstance(weights, dict) or weights.get("type", "int") != "int":
            return False
        if scheme.get("input_activations") is not None:
            return False
    return True


def checkpoint_layout(config: dict[str, Any]) -> CheckpointLayout:
    """The layout of the integer weights ``config`` describes; ``ValueError`` naming the field
    for one this plugin cannot serve."""
    q = config.get("quantization_config")
    if not isinstance(q, dict):
        raise ValueError(
            "quantization_config: expected a mapping describing the quantized "
            f"weights, got {type(q).__name__}"
        )
    method = q.get("quant_method")
    if method in GPTQ_METHODS:
        return _gptq(q, method)
    if method in AWQ_METHODS:
        return _awq(q, method)
    if method == "marlin":
        _check_bits(q, (4,))
        _check_marlin_group(q)
        return _marlin(method)
    if method == "compressed-tensors":
        return _compressed(q)
    raise _fail("quant_method", method, ", ".join(QUANT_METHODS))


def _marlin(method: str) -> CheckpointLayout:
    return CheckpointLayout("marlin", method, ("B", "s", "workspace"), ("B", "s"))


def _check_marlin_group(q: dict[str, Any]) -> None:
    group = _field(q, "group_size", 128)
    if group not in (128, -1):
        raise _fail("group_size", group, "128 or -1 for a checkpoint in Marlin format")


def _gptq(q: dict[str, Any], method: str) -> CheckpointLayout:
    fmt = _field(q, "checkpoint_format", "gptq")
    marlin = _check_bool(q, "is_marlin_format") or fmt == "marlin"
    if marlin:
        _check_bits(q, (4,))
        _check_marlin_group(q)
        if _field(q, "sym", True) is not True:
            raise _fail("sym", _field(q, "sym"), "true for a checkpoint in Marlin format")
        if _check_bool(q, "desc_act"):
            raise _fail("desc_act", True, "false for a checkpoint in Marlin format")
        return _marlin(method)
    if fmt not in ("gptq", "gptq_v2"):
        raise _fail("checkpoint_format", fmt, "gptq, gptq_v2 or marlin")
    _check_bits(q, (4, 8))
    _check_group(q)
    _check_bool(q, "sym")
    desc_act = _check_bool(q, "desc_act")
    required = ("qweight", "qzeros", "scales") + (("g_idx",) if desc_act else ())
    return CheckpointLayout(
        "gptq",
        method,
        ("qweight", "qzeros", "scales", "g_idx"),
        required,
        zero_offset=1 if fmt == "gptq" else 0,
        desc_act=desc_act,
    )


def _awq(q: dict[str, Any], method: str) -> CheckpointLayout:
    version = str(_field(q, "version", "gemm")).lower()
    if version != "gemm":
        raise _fail("version", _field(q, "version"), "gemm (AutoAWQ's GEMM packing)")
    _check_bits(q, (4,))
    _check_bits(q, (4,), "w_bit")
    _check_group(q)
    _check_group(q, "q_group_size")
    if _field(q, "zero_point", True) is not True:
        raise _fail("zero_point", _field(q, "zero_point"), "true (AWQ GEMM stores zero points)")
    return CheckpointLayout(
        "awq", method, ("qweight", "qzeros", "scales"), ("qweight", "qzeros", "scales")
    )


def _compressed(q: dict[str, Any]) -> CheckpointLayout:
    status = _field(q, "quantization_status", "compressed")
    if status != "compressed":
        raise _fail("quantization_status", status, "compressed: the weights stored packed")
    top_format = _field(q, "format")
    groups = _compressed_groups(q)
    if not groups:
        raise _fail("config_groups", {}, "at least one group of quantized layers")
    desc_act = False
    for name, scheme in groups:
        where = f"config_groups.{name}"
        if not isinstance(scheme, dict) or not isinstance(scheme.get("weights"), dict):
            raise _fail(f"{where}.weights", None, "the quantization of the weights")
        w = scheme["weights"]
        fmt = scheme.get("format") or top_format
        if fmt != "pack-quantized":
            raise _fail(
                f"{where}.format" if scheme.get("format") else "format",
                fmt,
                "pack-quantized for integer weights",
            )
        if w.get("type", "int") != "int":
            raise _fail(f"{where}.weights.type", w.get("type"), "int")
        if w.get("num_bits") not in (4, 8):
            raise _fail(f"{where}.weights.num_bits", w.get("num_bits"), "4 or 8")
        if w.get("strategy") not in ("group", "channel"):
            raise _fail(f"{where}.weights.strategy", w.get("strategy"), "group or channel")
        if w.get("strategy") == "group":
            _check_group(w, "group_size")
            if w.get("group_size") in (None, -1):
                raise _fail(
                    f"{where}.weights.group_size",
                    w.get("group_size"),
                    "a positive number of columns for the group strategy",
                )
        if w.get("dynamic"):
            raise _fail(f"{where}.weights.dynamic", w.get("dynamic"), "false")
        if scheme.get("input_activations") is not None:
            raise _fail(
                f"{where}.input_activations",
                "(quantized)",
                "null: integer weights with float activations (w4a16, w8a16)",
            )
        actorder = w.get("actorder")
        if actorder not in (None, False, "group", "weight", "static", "dynamic"):
            raise _fail(f"{where}.weights.actorder", actorder, "null, group or weight")
        desc_act = desc_act or actorder in ("group", "dynamic")
    return CheckpointLayout(
        "compressed",
        "compressed-tensors",
        ("weight_packed", "weight_scale", "weight_zero_point", "weight_shape", "weight_g_idx"),
        ("weight_packed", "weight_scale"),
        desc_act=desc_act,
    )
