"""The int4 scheme against tallow's quant-scheme conformance suite: a layer of every checkpoint
layout (GPTQ 4- and 8-bit, act-order, AWQ, compressed-tensors, Marlin) loaded through the
scheme's LinearMethod computes what the float weight the tensors stand for computes."""

from __future__ import annotations

import importlib.util

import torch

from int_weights import dense_of, random_unpacked
from tallow.plugin.testing import QuantizedLayer, QuantSchemeConformance
from tallow_quant_int4.formats import Unpacked, pack_awq, pack_gptq, pack_marlin


def gptq_config(
    bits: int = 4,
    group: int = 128,
    desc_act: bool = False,
    sym: bool = True,
    checkpoint_format: str = "gptq",
) -> dict:
    return {
        "quantization_config": {
            "quant_method": "gptq",
            "bits": bits,
            "group_size": group,
            "desc_act": desc_act,
            "sym": sym,
            "checkpoint_format": checkpoint_format,
        }
    }


def compressed_config(bits: int = 4, group: int | None = 128, symmetric: bool = True) -> dict:
    weights = {
        "num_bits": bits,
        "type": "int",
        "symmetric": symmetric,
        "strategy": "group" if group else "channel",
        "group_size": group,
        "dynamic": False,
        "actorder": None,
    }
    return {
        "quantization_config": {
            "quant_method": "compressed-tensors",
            "format": "pack-quantized",
            "quantization_status": "compressed",
            "ignore": ["lm_head"],
            "config_groups": {
                "group_0": {"targets": ["Linear"], "weights": weights, "input_activations": None}
            },
        }
    }


def compressed_tensors(u: Unpacked) -> dict[str, torch.Tensor]:
    """compressed-tensors' ``pack-quantized`` tensors of ``u`` (its packer: the codes as
    signed values, each row packed along the input)."""
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32

    half = 1 << (u.bits - 1)
    out = {
        "weight_packed": pack_to_int32((u.codes.to(torch.int16) - half).to(torch.int8), u.bits),
        "weight_scale": u.scales,
        "weight_shape": torch.tensor(list(u.codes.shape)),
    }
    if u.zeros is not None:
        zp = (u.zeros.to(torch.int16) - half).to(torch.int8)
        out["weight_zero_point"] = pack_to_int32(zp, u.bits, packed_dim=0)
    return out


def layer_cases(rows: int, cols: int) -> list[QuantizedLayer]:
    cases = []
    for bits, zeros, act in [(4, False, False), (4, True, True), (8, True, False)]:
        u = random_unpacked(rows, cols, bits=bits, group=64, zeros=zeros, act_order=act, seed=bits)
        u = Unpacked(
            u.codes,
            u.scales,
            None if u.zeros is None else u.zeros.clamp(min=1),
            bits,
            u.group_index,
        )
        cases.append(
            QuantizedLayer(
                f"gptq {bits}-bit{' act-order' if act else ''}",
                pack_gptq(u, zero_offset=1),
                dense_of(u),
                gptq_config(bits, 64, desc_act=act, sym=not zeros),
            )
        )
    u = random_unpacked(rows, cols, zeros=True, seed=11)
    cases.append(
        QuantizedLayer(
            "gptq_v2 asym",
            pack_gptq(u, zero_offset=0),
            dense_of(u),
            gptq_config(checkpoint_format="gptq_v2", sym=False),
        )
    )
    u = random_unpacked(rows, cols, zeros=True, seed=12)
    cases.append(
        QuantizedLayer(
            "awq",
            pack_awq(u),
            dense_of(u),
            {
                "quantization_config": {
                    "quant_method": "awq",
                    "bits": 4,
                    "group_size": 128,
                    "zero_point": True,
                    "version": "gemm",
                }
            },
        )
    )
    # compressed-tensors packs its cases (a test extra: a GPU machine may run without it)
    ct = [(4, True), (8, False)] if importlib.util.find_spec("compressed_tensors") else []
    for bits, symmetric in ct:
        u = random_unpacked(
            rows, cols, bits=bits, zeros=not symmetric, seed=20 + bits, scale_dtype=torch.bfloat16
        )
        cases.append(
            QuantizedLayer(
                f"compressed-tensors int{bits}",
                compressed_tensors(u),
                dense_of(u),
                compressed_config(bits, 128, symmetric),
            )
        )
    u = random_unpacked(rows, cols, seed=30)
    cases.append(
        QuantizedLayer(
            "marlin",
            pack_marlin(u),
            dense_of(u),
            {"quantization_config": {"quant_method": "marlin", "group_size": 128}},
        )
    )
    return cases


class TestIntSchemeConformance(QuantSchemeConformance):
    distribution = "tallow-quant-int4"
    component = "int4"
    light_modules = ("torch", "triton")

    def quantized_layers(self, rows: int, cols: int) -> list[QuantizedLayer]:
        return layer_cases(rows, cols)
