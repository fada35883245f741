"""KV codecs through the engine: the fp8 caches of tallow-kvcache-fp8 against transformers
with its keys and values rounded the same way, the KV budget in blocks, a codec served only
through its reference, the errors for a codec that does not exist or that the attention
backend cannot serve, and the automatic choice of attention backend passing over one that
refuses the codec or the model."""

from __future__ import annotations

import logging
from typing import Any, ClassVar

import pytest
import torch

from tallow import LLM, SamplingParams
from tallow.engine.builder import EngineParts, build_engine
from tallow.engine.llm import config_from_kwargs
from tallow.kernels.kv_cache import to_cache_dtype
from tallow.kernels.kv_cast import CastKVCodec
from tallow.layers.torch_attention import TorchAttentionBackend
from tallow.plugin import AttentionBackend, SelectionError, hookimpl
from tallow.plugin.manager import load_plugins

PROMPT = "Paged attention stores keys and values in fixed-size blocks. Continuous batching"
STEPS = 12
CODECS = {"fp8": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}


def hf_model(path, cache_dtype: torch.dtype | None):
    """The transformers model of ``path``; with ``cache_dtype``, every attention sees its keys
    and values as a cache of that dtype holds them (tallow's own rounding function)."""
    from transformers import AttentionInterface, AutoModelForCausalLM
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if cache_dtype is None:
        return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)

    def rounded_kv_attention(module, query, key, value, attention_mask, **kwargs):
        key = to_cache_dtype(key, cache_dtype).to(key.dtype)
        value = to_cache_dtype(value, cache_dtype).to(value.dtype)
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)

    name = f"sdpa-kv-{str(cache_dtype).removeprefix('torch.')}"
    AttentionInterface.register(name, rounded_kv_attention)
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation=name)


def hf_run(model, ids: list[int]) -> tuple[torch.Tensor, list[int], torch.Tensor]:
    """(prompt log-probs [len-1], greedy tokens, their log-prob rows [STEPS, vocab])."""
    with torch.no_grad():
        prompt = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)
        out = model.generate(
            torch.tensor([ids]),
            max_new_tokens=STEPS,
            min_new_tokens=STEPS,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
            pad_token_id=0,
        )
    steps = torch.stack([torch.log_softmax(s[0].float(), -1) for s in out.logits])
    picked = prompt[torch.arange(len(ids) - 1), torch.tensor(ids[1:])]
    return picked, out.sequences[0, len(ids) :].tolist(), steps


@pytest.mark.parametrize("codec", list(CODECS))
def test_fp8_cache_matches_transformers_with_rounded_kv(tiny_llama, codec):
    llm = LLM(
        model=str(tiny_llama),
        dtype="float32",
        device="cpu",
        num_blocks=128,
        block_size=4,
        kv_codec=codec,
    )
    assert {c["k"].dtype for c in llm.engine.core.runner.kv_caches} == {CODECS[codec]}
    ids = llm.get_tokenizer().encode(PROMPT)
    out = llm.generate(
        [ids],
        SamplingParams(
            temperature=0.0, max_tokens=STEPS, ignore_eos=True, logprobs=0, prompt_logprobs=0
        ),
    )[0]
    got_prompt = torch.tensor([out.prompt_logprobs[p][ids[p]].logprob for p in range(1, len(ids))])
    completion = out.outputs[0]

    ref_prompt, ref_tokens, ref_steps = hf_run(hf_model(tiny_llama, CODECS[codec]), ids)
    torch.testing.assert_close(got_prompt, ref_prompt, atol=1e-4, rtol=0)
    assert completion.token_ids == ref_tokens
    got_steps = torch.tensor([completion.logprobs[i][t].logprob for i, t in enumerate(ref_tokens)])
    torch.testing.assert_close(
        got_steps, ref_steps[torch.arange(STEPS), ref_tokens], atol=1e-4, rtol=0
    )
    # The rounding is visible: the unrounded model is further away than the tolerance.
    plain_prompt, _, _ = hf_run(hf_model(tiny_llama, None), ids)
    assert float((plain_prompt - got_prompt).abs().max()) > 1e-3


def test_fp8_holds_four_times_the_blocks_of_a_float32_cache(tiny_llama):
    blocks = {}
    for codec in ("auto", "fp8"):
        llm = LLM(
            model=str(tiny_llama),
            dtype="float32",
            device="cpu",
            mem_mb=1,
            block_size=4,
            max_model_len=256,
            kv_codec=codec,
        )
        blocks[codec] = llm.engine.core.runner.kv_caches[0].num_blocks
        assert llm.engine.core.scheduler.block_manager.num_free_blocks == blocks[codec]
    assert blocks["fp8"] == 4 * blocks["auto"] > 0


def test_unknown_codec_names_the_field_and_the_choices(tiny_llama):
    with pytest.raises(SelectionError) as info:
        LLM(model=str(tiny_llama), dtype="float32", device="cpu", num_blocks=64, kv_codec="fp4")
    text = str(info.value)
    assert text.startswith("cache.kv_codec 'fp4': ")
    assert "fp8" in text and "auto" in text and "plugins" in text


class HalfStoredCodec(CastKVCodec):
    """A codec no backend implements in kernels of its own: K and V kept as float16."""

    name = "test-half"
    storage = torch.float16


class RegistersHalfStored:
    @hookimpl
    def tallow_register_kv_codecs(self, registry: Any) -> None:
        registry.register("test-half", HalfStoredCodec, bits=16)


def test_codec_served_through_its_reference_by_the_torch_backend(tiny_llama):
    """A codec that only has its torch reference runs on the torch backend, which reads any
    codec through ``encode``/``decode``; a backend that names the codecs it implements
    refuses it, by name, and an automatic choice passes it over."""
    parts = build_with_picky(tiny_llama, kv_codec="test-half", extra=RegistersHalfStored())
    assert parts.attention_backend == "torch" and parts.kv_codec == "test-half"
    assert {c["k"].dtype for c in parts.core.runner.kv_caches} == {torch.float16}
    with pytest.raises(SelectionError) as info:
        build_with_picky(
            tiny_llama, kv_codec="test-half", attention_backend="picky", extra=RegistersHalfStored()
        )
    assert str(info.value) == (
        "attention_backend 'picky' (from tallow-test-picky) cannot serve this configuration:\n"
        "  - cannot use kv codec 'test-half' (cache.kv_codec; k, v: float16): kv codec "
        "'test-half' is not implemented by this backend (it implements auto, fp8, fp8_e5m2)"
    )


# -- a backend above the torch reference that refuses e4m3 caches (as triton does below sm_89)
class RefusesE4M3(AttentionBackend):
    made: ClassVar[list[Any]] = []  # every instance, to see that the chosen one is built once
    fused_kv_codecs = frozenset({"auto", "fp8", "fp8_e5m2"})

    def __init__(self, config: Any = None) -> None:
        self.made.append(self)

    def supports_kv_codec(self, codec: Any, layout: list[Any]) -> list[str]:
        if any(spec.dtype == torch.float8_e4m3fn for spec in layout):
            return ["e4m3 needs compute capability 8.9"]
        return super().supports_kv_codec(codec, layout)


class RegistersRefusesE4M3:
    @hookimpl
    def tallow_register_attention_backends(self, registry: Any) -> None:
        registry.register("picky", RefusesE4M3, priority=50)


def build_with_picky(tiny_llama, extra: Any = None, **kwargs: Any) -> EngineParts:
    config = config_from_kwargs(
        model=str(tiny_llama), dtype="float32", device="cpu", num_blocks=64, **kwargs
    )
    pm = load_plugins(config.plugins)
    pm.add_plugin(RegistersRefusesE4M3(), "tallow-test-picky", "0.1")
    if extra is not None:
        pm.add_plugin(extra, "tallow-test-codec", "0.1")
    RefusesE4M3.made.clear()
    return build_engine(config, pm)


def test_auto_backend_passes_over_one_that_refuses_the_codec(tiny_llama, caplog):
    parts = build_with_picky(tiny_llama, kv_codec="fp8_e5m2")
    assert parts.attention_backend == "picky"
    assert RefusesE4M3.made == [parts.core.runner.backend]  # built once, during the check

    with caplog.at_level(logging.INFO, logger="tallow.plugin"):
        parts = build_with_picky(tiny_llama, kv_codec="fp8")
    assert parts.attention_backend == "torch"
    assert type(parts.core.runner.backend) is TorchAttentionBackend
    assert {c["k"].dtype for c in parts.core.runner.kv_caches} == {torch.float8_e4m3fn}
    assert (
        "picky: cannot use kv codec 'fp8' (cache.kv_codec; k, v: float8_e4m3fn): "
        "e4m3 needs compute capability 8.9"
    ) in caplog.text


def test_named_backend_that_refuses_the_codec_stops_start_up(tiny_llama):
    with pytest.raises(SelectionError) as info:
        build_with_picky(tiny_llama, kv_codec="fp8", attention_backend="picky")
    assert str(info.value) == (
        "attention_backend 'picky' (from tallow-test-picky) cannot serve this configuration:\n"
        "  - cannot use kv codec 'fp8' (cache.kv_codec; k, v: float8_e4m3fn): "
        "e4m3 needs compute capability 8.9"
    )


def test_backend_that_refuses_the_model_is_passed_over_or_stops_start_up(tiny_llama, monkeypatch):
    monkeypatch.setattr(
        RefusesE4M3,
        "supports_layer",
        staticmethod(lambda layer: [f"head_dim {layer.head_dim} is too small"]),
        raising=False,
    )
    assert build_with_picky(tiny_llama).attention_backend == "torch"
    with pytest.raises(
        SelectionError, match=r"'picky' .*:\n  - cannot run this model: head_dim \d+ is too small$"
    ):
        build_with_picky(tiny_llama, attention_backend="picky")
