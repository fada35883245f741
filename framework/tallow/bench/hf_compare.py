"""`--compare hf`: the same config and the same weights through transformers, same process."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from tallow.layers import CausalLM

from .common import now, random_prompts, sync

if TYPE_CHECKING:
    from tallow.engine.builder import EngineParts

_MODEL_TYPES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Gemma2ForCausalLM": "gemma2",
    "Gemma3ForCausalLM": "gemma3_text",
    "Gemma4ForCausalLM": "gemma4_text",
}


def hf_model_like(parts: EngineParts) -> Any:  # Any: a transformers causal LM of any architecture
    """A transformers model of the same config, holding the engine model's weights.

    transformers builds its model (random init), then the engine model loads that model's state
    dict through its own HF-name mapping — so both hold identical weights.
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = dict(parts.loaded.config)
    arch = cfg["architectures"][0]
    if arch not in _MODEL_TYPES:
        raise ValueError(f"--compare hf: no transformers model type known for {arch}")
    keep = {k: v for k, v in cfg.items() if k not in ("model_type", "torch_dtype", "architectures")}
    hf_cfg = AutoConfig.for_model(_MODEL_TYPES[arch], **keep)
    device, dtype = parts.loaded.device, parts.loaded.dtype
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(hf_cfg, torch_dtype=dtype)
    model.eval()
    ours = parts.loaded.model
    assert isinstance(ours, CausalLM), type(ours)
    ours.load_weights(model.state_dict().items(), naming="hf")
    return model


@torch.inference_mode()
def hf_latency(
    parts: EngineParts, *, batch: int, input_len: int, output_len: int
) -> dict[str, Any]:
    model = hf_model_like(parts)
    device = parts.loaded.device
    vocab = parts.core.runner.vocab_size
    ids = torch.tensor(random_prompts(batch, [input_len] * batch, vocab, seed=3), device=device)
    mask = torch.ones_like(ids)

    def gen(n: int) -> float:
        sync(device)
        t = now()
        model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=n,
            min_new_tokens=n,
            do_sample=False,
            pad_token_id=0,
        )
        sync(device)
        return now() - t

    gen(4)  # warm-up
    ttft = gen(1)
    total = gen(output_len)
    decode = (total - ttft) / max(1, output_len - 1)
    model = None  # frees the copy (gen holds the name)
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return {"ttft_s": ttft, "decode_tok_s_per_seq": 1.0 / decode, "e2e_s": total}
