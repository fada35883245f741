"""Tiny random Llama models saved as real FP8 checkpoints, and the oracles that run them.

- :func:`write_compressed_tensors`: the ``compressed-tensors`` package quantizes the model with
  one of its preset schemes (``FP8``: per-tensor weights and a static activation scale;
  ``FP8_DYNAMIC``: per-channel weights, dynamic per-token activations; ``FP8_BLOCK``: 128 x 128
  blocks, dynamic per-token-group activations), computes the weight scales with its own
  ``calculate_qparams``, compresses the tensors and writes ``quantization_config`` (what
  llm-compressor does after calibration). The returned model is that package's decompressed
  model: its forward applies compressed-tensors' own fake quantization of the activations, an
  oracle for the W8A8 path independent of this plugin.
- :func:`write_hf_fp8`: the Hugging Face / vLLM ``quant_method: "fp8"`` format, written here
  from its definition (``FineGrainedFP8Config`` in transformers, DeepSeek-V3's and
  Qwen3-FP8's checkpoints): every linear layer but the head stores ``weight`` as
  ``float8_e4m3fn`` with either one float32 ``weight_scale`` (a 0-d tensor: ``w = q *
  weight_scale``) and, for ``activation_scheme: static``, a 0-d ``input_scale``; or, with
  ``weight_block_size: [128, 128]``, a float32 ``weight_scale_inv`` of shape
  ``[ceil(N/128), ceil(K/128)]`` multiplying each 128 x 128 block (``w[i, j] = q[i, j] *
  weight_scale_inv[i // 128, j // 128]``; "inv" because DeepSeek's quantizer divides by its
  reciprocal). Scales are ``amax / 448`` of the tensor or block.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import torch

transformers = __import__("pytest").importorskip(
    "transformers", reason="transformers builds the models"
)

VOCAB = 320
FP8 = torch.float8_e4m3fn


def tiny_llama(seed: int = 0) -> Any:
    """A float32 LlamaForCausalLM whose every projection holds whole 128 x 128 blocks."""
    from tallow.plugin.testing.paged_runner import randomize_

    config = transformers.LlamaConfig(
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=VOCAB,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(config).eval()
    randomize_(model, seed, std=0.06)
    return model


def save_tokenizer(directory: Path) -> None:
    from tallow.engine.random_model import synthetic_tokenizer

    synthetic_tokenizer(VOCAB).save(str(directory / "tokenizer.json"))


def _linear_names(model: Any) -> list[str]:
    return [
        n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and n != "lm_head"
    ]


def calibration_inputs(model: Any, ids: list[int]) -> dict[str, float]:
    """The largest |input| of every linear layer of ``model`` over one forward of ``ids``."""
    seen: dict[str, float] = {}
    hooks = []
    for name in _linear_names(model):
        module = model.get_submodule(name)

        def record(mod, args, name=name):
            seen[name] = max(seen.get(name, 0.0), float(args[0].abs().max()))

        hooks.append(module.register_forward_pre_hook(record))
    with torch.no_grad():
        model(torch.tensor([ids]))
    for h in hooks:
        h.remove()
    return seen


def write_compressed_tensors(
    model_float: Any, preset: str, out: Path, calibration: list[int]
) -> Any:
    """Save ``model_float`` quantized by compressed-tensors' preset ``preset`` into ``out``;
    returns the decompressed model (see the module docstring)."""
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import (
        QuantizationConfig,
        QuantizationStatus,
        apply_quantization_config,
        preset_name_to_scheme,
    )
    from compressed_tensors.quantization.utils import calculate_qparams

    amax_in = calibration_inputs(model_float, calibration)
    model = copy.deepcopy(model_float)
    config = QuantizationConfig(
        config_groups={"group_0": preset_name_to_scheme(preset, ["Linear"])}, ignore=["lm_head"]
    )
    apply_quantization_config(model, config)
    for name in _linear_names(model):
        module = model.get_submodule(name)
        scheme = module.quantization_scheme
        w = module.weight.data
        args = scheme.weights
        if args.strategy == "tensor":
            lo, hi = w.min().reshape(1), w.max().reshape(1)
        elif args.strategy == "channel":
            lo, hi = w.amin(dim=1, keepdim=True), w.amax(dim=1, keepdim=True)
        else:
            n, k = w.shape
            blocks = w.reshape(n // 128, 128, k // 128, 128)
            lo, hi = blocks.amin(dim=(1, 3)), blocks.amax(dim=(1, 3))
        scale, _ = calculate_qparams(lo, hi, args)
        module.weight_scale.data = scale.reshape(module.weight_scale.shape).float()
        inputs = scheme.input_activations
        if inputs is not None and not inputs.dynamic:
            a = torch.tensor([amax_in[name]])
            scale, _ = calculate_qparams(-a, a, inputs)
            module.input_scale.data = scale.reshape(module.input_scale.shape).float()
        module.quantization_status = QuantizationStatus.FROZEN
    compressor = ModelCompressor.from_pretrained_model(model, "float-quantized")
    compressor.compress_model(model)
    model.save_pretrained(out)
    compressor.update_config(str(out))
    save_tokenizer(out)
    compressor.decompress_model(model)
    return model


def _round(values: torch.Tensor) -> torch.Tensor:
    return values.clamp(-448.0, 448.0).to(FP8)


def write_hf_fp8(
    model_float: Any,
    out: Path,
    *,
    block: bool,
    static: bool = False,
    calibration: list[int] | None = None,
) -> dict[str, torch.Tensor]:
    """Save ``model_float`` in the HF ``fp8`` format (see the module docstring) into ``out``;
    returns the dequantized float32 weights of the quantized layers by HF name."""
    from safetensors.torch import save_file

    amax_in = calibration_inputs(model_float, calibration) if static else {}
    tensors: dict[str, torch.Tensor] = {}
    dequantized: dict[str, torch.Tensor] = {}
    quantized = set(_linear_names(model_float))
    for name, value in model_float.state_dict().items():
        layer = name.rsplit(".", 1)[0]
        if layer not in quantized or not name.endswith(".weight"):
            tensors[name] = value.contiguous()
            continue
        w = value.float()
        if block:
            n, k = w.shape
            blocks = w.reshape(n // 128, 128, k // 128, 128)
            scale = (blocks.abs().amax(dim=(1, 3)) / 448.0).clamp(min=1e-12)
            q = _round(blocks / scale[:, None, :, None]).reshape(n, k)
            tensors[f"{layer}.weight_scale_inv"] = scale
            expanded = scale.repeat_interleave(128, 0).repeat_interleave(128, 1)
        else:
            scale = (w.abs().amax() / 448.0).clamp(min=1e-12)
            q = _round(w / scale)
            tensors[f"{layer}.weight_scale"] = scale.reshape(())
            expanded = scale
            if static:
                tensors[f"{layer}.input_scale"] = torch.tensor(amax_in[layer] / 448.0)
        tensors[name] = q
        dequantized[name] = q.float() * expanded
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "model.safetensors"))
    config = model_float.config.to_dict()
    config["architectures"] = [type(model_float).__name__]
    config["quantization_config"] = {
        "quant_method": "fp8",
        "fmt": "e4m3",
        "activation_scheme": "static" if static else "dynamic",
        **({"weight_block_size": [128, 128]} if block else {}),
    }
    (out / "config.json").write_text(json.dumps(config, indent=2))
    save_tokenizer(out)
    return dequantized


class FakeQuantActivations:
    """Forward pre-hooks on a transformers model's quantized linear layers that quantize and
    dequantize their inputs as this plugin's W8A8 path does (per token, per token and 128
    columns, or with a static scale) whenever a call has more than ``gemv_max_rows`` rows;
    fewer rows pass unquantized (the weight-only GEMV). Written with plain torch operations,
    not the plugin's code."""

    def __init__(
        self,
        model: Any,
        mode: str,
        gemv_max_rows: int,
        static_scales: dict[str, float] | None = None,
        head: bool = False,
    ) -> None:
        self.hooks = []
        for name in _linear_names(model) + (["lm_head"] if head else []):
            module = model.get_submodule(name)
            static = (static_scales or {}).get(name)
            self.hooks.append(
                module.register_forward_pre_hook(
                    lambda mod, args, static=static: (
                        self._qdq(args[0], mode, gemv_max_rows, static),
                    )
                )
            )

    @staticmethod
    def _qdq(x: torch.Tensor, mode: str, rows: int, static: float | None) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1]).float()
        if flat.shape[0] <= rows:
            return x
        width = 128 if mode == "group" else flat.shape[1]
        g = flat.reshape(flat.shape[0], -1, width)
        if static is not None:
            scale = torch.full(g.shape[:2], static)
        else:
            scale = (g.abs().amax(dim=-1) / 448.0).clamp(min=1e-12)
        q = (g / scale[..., None]).clamp(-448.0, 448.0).to(FP8).float() * scale[..., None]
        return q.reshape(x.shape).to(x.dtype)

    def remove(self) -> None:
        for h in self.hooks:
            h.remove()


def oracle_logits(
    model: Any, prompt: list[int], steps: int
) -> tuple[list[int], torch.Tensor, list[torch.Tensor]]:
    """Greedy decoding of ``prompt`` by the transformers ``model``: (tokens, prompt logits,
    each step's logits), one token per forward after the prompt (as the engine decodes)."""
    tokens: list[int] = []
    with torch.no_grad():
        out = model(torch.tensor([prompt]), use_cache=True)
        prompt_logits = out.logits[0].float()
        past, last = out.past_key_values, prompt_logits[-1]
        step_logits = []
        for _ in range(steps):
            step_logits.append(last)
            tok = int(last.argmax())
            tokens.append(tok)
            out = model(torch.tensor([[tok]]), past_key_values=past, use_cache=True)
            past, last = out.past_key_values, out.logits[0, -1].float()
    return tokens, prompt_logits, step_logits
