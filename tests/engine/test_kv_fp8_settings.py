"""The fp8 codecs' settings through the engine: checkpoint scales and centred keys.

KV-cache scales read from a checkpoint (``self_attn.k_scale``/``v_scale`` of FP8-KV
checkpoints): with ``plugins.settings.tallow-kvcache-fp8.scales: checkpoint`` the fp8 cache
stores each layer's keys and values divided by them, which the engine's prompt log-probs show
against transformers whose attention sees K and V rounded the same way; without the setting
they are ignored; a checkpoint without them, or with scales of the wrong size, stops start-up
with the layer named. With ``center_keys`` the cache stores keys less each head's calibrated
mean key."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from tallow.config import config_from_mapping
from tallow.engine.llm_engine import LLMEngine
from tallow import SamplingParams
from tallow.kernels.kv_cache import to_cache_dtype

PROMPT = "Paged attention stores keys and values in fixed-size blocks. Continuous batching"
#: per layer: a scale for all heads (a 0-d tensor, as FP8-KV checkpoints store it) and one per
#: KV head; small enough that rounding K/s and V/s to e4m3 differs from rounding K and V
K_SCALES = [torch.tensor(0.011), torch.tensor([0.004, 0.023])]
V_SCALES = [torch.tensor([0.0035, 0.017]), torch.tensor(0.009)]


def with_tensors(src: Path, dst: Path, extra: dict[str, torch.Tensor]) -> Path:
    """A copy of the checkpoint at ``src`` with ``extra`` tensors added to its weights."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    weights = load_file(str(dst / "model.safetensors"))
    weights.update(extra)
    save_file(weights, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


@pytest.fixture(scope="module")
def scaled_llama(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    extra = {}
    for i, (k, v) in enumerate(zip(K_SCALES, V_SCALES)):
        extra[f"model.layers.{i}.self_attn.k_scale"] = k
        extra[f"model.layers.{i}.self_attn.v_scale"] = v
    return with_tensors(tiny_llama, tmp_path_factory.mktemp("scaled") / "m", extra)


def engine(
    path: Path, scales: str | None = None, codec: str = "fp8", device: str = "cpu", **runner: Any
) -> LLMEngine:
    mapping: dict[str, Any] = {
        "model": {"source": str(path), "dtype": "float32", "device": device},
        "cache": {"num_blocks": 128, "block_size": 4, "kv_codec": codec},
        "runner": runner,
        "plugins": {"settings": {"tallow-attention-triton": {"num_splits": 3}}},
    }
    if scales is not None:
        mapping["plugins"]["settings"]["tallow-kvcache-fp8"] = {"scales": scales}
    return LLMEngine.from_config(config_from_mapping(mapping, origin="test"))


def run(eng: LLMEngine, ids: list[int], params: SamplingParams) -> Any:
    eng.add_request(eng.next_request_id(), ids, params, stream=False)
    out = None
    while eng.has_unfinished():
        for o in eng.step():
            if o.finished:
                out = o
    assert out is not None
    return out


def prompt_logprobs(eng: LLMEngine, ids: list[int]) -> torch.Tensor:
    out = run(eng, ids, SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0))
    return torch.tensor([out.prompt_logprobs[p][ids[p]].logprob for p in range(1, len(ids))])


def hf_prompt_logprobs(
    path: Path,
    ids: list[int],
    k_scales: list[torch.Tensor] | None,
    v_scales: list[torch.Tensor] | None,
) -> torch.Tensor:
    """transformers' prompt log-probs when every attention sees its K and V as an e4m3 cache
    holds them: divided by the layer's scales (per KV head), rounded, multiplied back."""
    from transformers import AttentionInterface, AutoModelForCausalLM
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    def as_cached(x: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
        s = torch.ones(()) if scale is None else scale.float().reshape(-1)
        s = s.reshape(-1, 1, 1) if s.numel() > 1 else s  # x: [B, Hkv, T, D]
        return (to_cache_dtype(x / s, torch.float8_e4m3fn).float() * s).to(x.dtype)

    def rounded(module, query, key, value, attention_mask, **kwargs):
        i = module.layer_idx
        key = as_cached(key, k_scales[i] if k_scales else None)
        value = as_cached(value, v_scales[i] if v_scales else None)
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)

    name = "sdpa-e4m3-" + ("scaled" if k_scales else "plain")
    AttentionInterface.register(name, rounded)
    model = AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation=name
    )
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float()
    logp = torch.log_softmax(logits, -1)
    return logp[torch.arange(len(ids) - 1), torch.tensor(ids[1:])]


def test_fp8_cache_uses_the_checkpoint_scales(scaled_llama: Path) -> None:
    eng = engine(scaled_llama, scales="checkpoint")
    caches = eng.core.runner.kv_caches
    for i, cache in enumerate(caches):
        assert torch.equal(cache["k_scale"], K_SCALES[i].expand(2))
        assert torch.equal(cache["v_scale"], V_SCALES[i].expand(2))
    ids = eng.tokenizer.encode(PROMPT)
    got = prompt_logprobs(eng, ids)
    scaled = hf_prompt_logprobs(scaled_llama, ids, K_SCALES, V_SCALES)
    torch.testing.assert_close(got, scaled, atol=1e-4, rtol=0)
    # the scales matter: the same cache without them is further away than the tolerance
    plain = hf_prompt_logprobs(scaled_llama, ids, None, None)
    assert float((plain - got).abs().max()) > 1e-3


def test_scales_are_ignored_unless_the_setting_asks(scaled_llama: Path) -> None:
    eng = engine(scaled_llama)
    assert all(set(c.tensors) == {"k", "v"} for c in eng.core.runner.kv_caches)
    ids = eng.tokenizer.encode(PROMPT)
    torch.testing.assert_close(
        prompt_logprobs(eng, ids),
        hf_prompt_logprobs(scaled_llama, ids, None, None),
        atol=1e-4,
        rtol=0,
    )
    # the default codec loads the same checkpoint (the scales are known tensors)
    assert set(engine(scaled_llama, codec="auto").core.runner.kv_caches[0].tensors) == {"k", "v"}


def test_checkpoint_without_scales_stops_start_up(tiny_llama: Path) -> None:
    with pytest.raises(
        ValueError,
        match=r"kv codec 'fp8' stores K and V divided by the "
        r"checkpoint's KV-cache scales, but the checkpoint has no k_scale or "
        r"v_scale for layer 0",
    ):
        engine(tiny_llama, scales="checkpoint")


def test_scales_of_the_wrong_size_name_the_layer(tiny_llama: Path, tmp_path: Path) -> None:
    extra = {
        f"model.layers.{i}.self_attn.{n}_scale": torch.tensor(0.5) for i in range(2) for n in "kv"
    }
    extra["model.layers.1.self_attn.v_scale"] = torch.tensor([0.5, 0.5, 0.5])
    bad = with_tensors(tiny_llama, tmp_path / "m", extra)
    with pytest.raises(
        ValueError,
        match=r"layer 1: the checkpoint's v_scale has 3 values, "
        r"expected 1 or one per KV head \(2\)",
    ):
        engine(bad, scales="checkpoint")


def test_unknown_scales_setting_names_the_key(tiny_llama: Path) -> None:
    with pytest.raises(Exception, match=r"plugins\.settings\.tallow-kvcache-fp8\.scales"):
        engine(tiny_llama, scales="calibrated")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_triton_backend_with_checkpoint_scales_matches_the_torch_backend(
    scaled_llama: Path,
) -> None:
    """The Triton backend on a scaled fp8 cache (the store divides, queries and output carry
    the scales outside the attention kernels) with CUDA graphs, against the torch backend over
    the codec's reference: the prompt log-probs of a long prompt (prefill kernel, chunks of
    blocks) and the log-probs of 24 greedy tokens (decode kernels, split contexts)."""
    fast = engine(scaled_llama, scales="checkpoint", device="cuda")
    assert fast.parts.attention_backend == "triton" and fast.core.runner.graphs is not None
    assert "k_scale" in fast.core.runner.kv_caches[0]
    ref = engine(
        scaled_llama,
        scales="checkpoint",
        device="cuda",
        attention_backend="torch",
        disable_cuda_graph=True,
    )
    ids = fast.tokenizer.encode(PROMPT * 3)
    torch.testing.assert_close(
        prompt_logprobs(fast, ids), prompt_logprobs(ref, ids), atol=2e-3, rtol=0
    )
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, logprobs=0)
    ours, theirs = (run(e, ids, params).outputs[0] for e in (fast, ref))
    assert ours.token_ids == theirs.token_ids
    torch.testing.assert_close(
        torch.tensor([ours.logprobs[i][t].logprob for i, t in enumerate(ours.token_ids)]),
        torch.tensor([theirs.logprobs[i][t].logprob for i, t in enumerate(theirs.token_ids)]),
        atol=2e-3,
        rtol=0,
    )


def test_fp8_with_centred_keys_matches_transformers_through_the_codec(tiny_qwen2: Path) -> None:
    """``center_keys``: the engine calibrates each layer's mean key at start-up (Qwen2's key
    biases make it far from zero) and its prompt log-probs are transformers' with K/V through
    the same codec; the offsets matter (a plain fp8 cast is further away)."""
    from codec_oracle import hf_model_through

    mapping: dict[str, Any] = {
        "model": {"source": str(tiny_qwen2), "dtype": "float32", "device": "cpu"},
        "cache": {"num_blocks": 128, "block_size": 4, "kv_codec": "fp8"},
        "plugins": {"settings": {"tallow-kvcache-fp8": {"center_keys": True}}},
    }
    eng = LLMEngine.from_config(config_from_mapping(mapping, origin="test"))
    caches = eng.core.runner.kv_caches
    assert all(float(c["k_offset"].abs().max()) > 0 for c in caches)  # calibrated
    ids = eng.tokenizer.encode(PROMPT)
    got = prompt_logprobs(eng, ids)
    model = hf_model_through(tiny_qwen2, caches, "fp8-centred")
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)
    torch.testing.assert_close(
        got, logp[torch.arange(len(ids) - 1), torch.tensor(ids[1:])], atol=1e-4, rtol=0
    )
    plain = hf_prompt_logprobs(tiny_qwen2, ids, None, None)
    assert float((plain - got).abs().max()) > 1e-3
