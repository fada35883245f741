"""Tiny random Llama models quantized into each checkpoint format and written as real
checkpoints (``config.json`` with ``quantization_config``, ``model.safetensors``,
``tokenizer.json``), with the float model their weights decode to (the oracle)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from int_weights import dense_of
from tallow_quant_int4.formats import Unpacked, pack_awq, pack_gptq, pack_marlin

LINEARS = (
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
)
VOCAB = 320


def quantize(
    w: torch.Tensor, *, bits: int, group: int, zeros: bool, act_order: bool, seed: int
) -> Unpacked:
    """``w [N, K]`` rounded to ``bits``-bit codes per ``group`` columns (min-max with a zero
    point, or symmetric), the columns grouped in a random order under ``act_order`` (as
    GPTQ's ``desc_act`` groups them by its Hessian order)."""
    n, k = w.shape
    group = k if group == -1 else group
    order = (
        torch.randperm(k, generator=torch.Generator().manual_seed(seed))
        if act_order
        else torch.arange(k)
    )
    v = w[:, order].reshape(n, k // group, group).float()
    top = (1 << bits) - 1
    if zeros:
        lo, hi = v.amin(-1).clamp(max=0), v.amax(-1).clamp(min=0)
        scale = ((hi - lo) / top).clamp(min=1e-8).to(torch.float16)
        zero = torch.round(-lo / scale.float()).clamp(0, top).to(torch.uint8)
    else:
        scale = (v.abs().amax(-1) / ((1 << (bits - 1)) - 1)).clamp(min=1e-8).to(torch.float16)
        zero = torch.full_like(scale, 1 << (bits - 1), dtype=torch.uint8)
    q = torch.round(v / scale.float()[..., None] + zero.float()[..., None]).clamp(0, top)
    codes = torch.empty(n, k, dtype=torch.uint8)
    codes[:, order] = q.reshape(n, k).to(torch.uint8)
    group_index = None
    if act_order:
        group_index = torch.empty(k, dtype=torch.int64)
        group_index[order] = torch.arange(k) // group
    return Unpacked(codes, scale, zero if zeros else None, bits, group_index)


def compressed_tensors(u: Unpacked) -> dict[str, torch.Tensor]:
    """compressed-tensors' ``pack-quantized`` tensors of ``u``, packed by the package."""
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32

    half = 1 << (u.bits - 1)
    out = {
        "weight_packed": pack_to_int32((u.codes.to(torch.int16) - half).to(torch.int8), u.bits),
        "weight_scale": u.scales.to(torch.bfloat16).to(torch.float32).to(u.scales.dtype),
        "weight_shape": torch.tensor(list(u.codes.shape)),
    }
    if u.zeros is not None:
        zp = (u.zeros.to(torch.int16) - half).to(torch.int8)
        out["weight_zero_point"] = pack_to_int32(zp, u.bits, packed_dim=0)
    if u.group_index is not None:
        out["weight_g_idx"] = u.group_index.to(torch.int32)
    return out


#: format name -> (quantization_config, bits, group, zero points, act order)
FORMATS = {
    "gptq": (
        {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "sym": True},
        4,
        128,
        False,
        False,
    ),
    "gptq-act-order-asym": (
        {"quant_method": "gptq", "bits": 4, "group_size": 64, "desc_act": True, "sym": False},
        4,
        64,
        True,
        True,
    ),
    "gptq-8bit-v2": (
        {
            "quant_method": "gptq",
            "bits": 8,
            "group_size": -1,
            "desc_act": False,
            "sym": True,
            "checkpoint_format": "gptq_v2",
            "lm_head": True,
        },
        8,
        -1,
        False,
        False,
    ),
    "awq": (
        {
            "quant_method": "awq",
            "bits": 4,
            "group_size": 128,
            "zero_point": True,
            "version": "gemm",
            "modules_to_not_convert": None,
        },
        4,
        128,
        True,
        False,
    ),
    "compressed-tensors": (
        {
            "quant_method": "compressed-tensors",
            "format": "pack-quantized",
            "quantization_status": "compressed",
            "ignore": ["lm_head"],
            "config_groups": {
                "group_0": {
                    "targets": ["Linear"],
                    "input_activations": None,
                    "weights": {
                        "num_bits": 4,
                        "type": "int",
                        "symmetric": True,
                        "strategy": "group",
                        "group_size": 128,
                        "dynamic": False,
                        "actorder": None,
                    },
                }
            },
        },
        4,
        128,
        False,
        False,
    ),
    "compressed-tensors-8bit-asym": (
        {
            "quant_method": "compressed-tensors",
            "format": "pack-quantized",
            "quantization_status": "compressed",
            "ignore": ["lm_head"],
            "config_groups": {
                "group_0": {
                    "targets": ["Linear"],
                    "input_activations": None,
                    "weights": {
                        "num_bits": 8,
                        "type": "int",
                        "symmetric": False,
                        "strategy": "channel",
                        "group_size": None,
                        "dynamic": False,
                    },
                }
            },
        },
        8,
        -1,
        True,
        False,
    ),
    "marlin": ({"quant_method": "marlin", "group_size": 128}, 4, 128, False, False),
    "gptq-marlin-format": (
        {
            "quant_method": "gptq",
            "bits": 4,
            "group_size": 128,
            "desc_act": False,
            "sym": True,
            "is_marlin_format": True,
        },
        4,
        128,
        False,
        False,
    ),
}


def _layer_tensors(fmt: str, qcfg: dict, u: Unpacked) -> dict[str, torch.Tensor]:
    method = qcfg["quant_method"]
    if method == "marlin" or qcfg.get("is_marlin_format"):
        return pack_marlin(u)
    if method == "awq":
        return pack_awq(u)
    if method == "compressed-tensors":
        return compressed_tensors(u)
    offset = 0 if qcfg.get("checkpoint_format") == "gptq_v2" else 1
    if offset and u.zeros is not None:
        u = Unpacked(u.codes, u.scales, u.zeros.clamp(min=1), u.bits, u.group_index)
    return pack_gptq(u, zero_offset=offset)


def write_checkpoint(root: Path, fmt: str, seed: int = 0) -> tuple[Path, "torch.nn.Module"]:
    """The checkpoint of format ``fmt`` under ``root / fmt``, and the float32 transformers
    model whose weights are what it decodes to."""
    import transformers
    from safetensors.torch import save_file

    from tallow.engine.random_model import synthetic_tokenizer

    qcfg, bits, group, zeros, act_order = FORMATS[fmt]
    config = transformers.LlamaConfig(
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=VOCAB,
        max_position_embeddings=256,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(config).float().eval()
    tensors: dict[str, torch.Tensor] = {}
    decoded = {}
    for name, param in model.state_dict().items():
        stem = name.rsplit(".", 1)[0]
        if any(stem.endswith(lin) for lin in LINEARS) or (
            stem == "lm_head" and qcfg.get("lm_head")
        ):
            # layers that read the same input share GPTQ's act order (its Hessian's)
            layer = int(stem.split(".")[2]) if stem != "lm_head" else 99
            reads = {
                "q_proj": 0,
                "k_proj": 0,
                "v_proj": 0,
                "o_proj": 1,
                "gate_proj": 2,
                "up_proj": 2,
                "down_proj": 3,
                "lm_head": 4,
            }[stem.rsplit(".", 1)[-1]]
            u = _quantized(fmt, qcfg, param, bits, group, zeros, act_order, seed=10 * layer + reads)
            for suffix, t in _layer_tensors(fmt, qcfg, u).items():
                tensors[f"{stem}.{suffix}"] = t.contiguous()
            decoded[name] = dense_of(_as_stored(qcfg, u))
        else:
            tensors[name] = param.to(torch.float16).contiguous()
            decoded[name] = param.to(torch.float16).float()
    model.load_state_dict(decoded)
    out = root / fmt
    out.mkdir(parents=True)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    data = config.to_dict()
    data.update(architectures=["LlamaForCausalLM"], torch_dtype="float16", quantization_config=qcfg)
    (out / "config.json").write_text(json.dumps(data))
    synthetic_tokenizer(VOCAB).save(str(out / "tokenizer.json"))
    return out, model


def _quantized(fmt, qcfg, w, bits, group, zeros, act_order, seed):
    return quantize(
        w.detach().float(), bits=bits, group=group, zeros=zeros, act_order=act_order, seed=seed
    )


def _as_stored(qcfg: dict, u: Unpacked) -> Unpacked:
    """``u`` as the checkpoint stores it (GPTQ v1 cannot hold a zero point of 0;
    compressed-tensors here stores bfloat16-exact scales)."""
    if (
        qcfg["quant_method"] == "gptq"
        and qcfg.get("checkpoint_format", "gptq") == "gptq"
        and u.zeros is not None
        and not qcfg.get("is_marlin_format")
    ):
        return Unpacked(u.codes, u.scales, u.zeros.clamp(min=1), u.bits, u.group_index)
    if qcfg["quant_method"] == "compressed-tensors":
        scales = u.scales.to(torch.bfloat16).to(torch.float32).to(u.scales.dtype)
        return Unpacked(u.codes, scales, u.zeros, u.bits, u.group_index)
    return u
