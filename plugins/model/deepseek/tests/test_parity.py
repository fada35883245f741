"""Parity with transformers beyond the conformance suite's configs (YaRN with its softmax
mscale, rotate-half rope, greedy V2 routing with a low-rank query), the engine on the latent
cache (chunked prefill, prefix caching, an fp8 latent cache) and what the latent
cache costs per token against the K/V it replaces."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is the parity oracle")

from tallow import SamplingParams  # noqa: E402
from tallow.engine.cache_groups import find_cache_groups, group_block_bytes  # noqa: E402
from tallow.engine.random_model import shape_config  # noqa: E402
from tallow.kernels.kv_cast import AutoKVCodec  # noqa: E402
from tallow.layers import ArchConfig, BuildContext, LatentCacheSpec, MLAAttention  # noqa: E402
from tallow.plugin.testing.engine import offline_llm  # noqa: E402
from tallow.plugin.testing.model_parity import (  # noqa: E402
    assert_cuda_parity,
    assert_greedy_parity,
    load_saved,
    random_hf_model,
)

from deepseek_configs import PROMPT, SMALL, randomize_correction_bias  # noqa: E402
from tallow_model_deepseek.model import (  # noqa: E402
    DeepseekV2ForCausalLM,
    DeepseekV3ForCausalLM,
    softmax_scale,
)

STEPS = 32
YARN = {
    "rope_type": "yarn",
    "rope_theta": 10000.0,
    "factor": 8.0,
    "original_max_position_embeddings": 32,
    "beta_fast": 32,
    "beta_slow": 1,
    "mscale": 0.707,
    "mscale_all_dim": 0.707,
}


def _safetensors():
    return pytest.importorskip(
        "tallow_format_safetensors.format",
        reason="the saved model is read by tallow-format-safetensors",
    )


def _v3_yarn_config():
    return transformers.DeepseekV3Config(
        **SMALL,
        q_lora_rank=24,
        n_group=2,
        topk_group=1,
        routed_scaling_factor=2.5,
        rope_interleave=False,
        rope_parameters=YARN,
    )


def test_v3_yarn_mscale_and_rotate_half(tmp_path):
    """YaRN x8 over an original context of 32 (the prompt and the greedy steps run past it),
    ``mscale_all_dim`` folded into the softmax scale, rope_interleave False (rotate-half)."""
    config = _v3_yarn_config()
    cfg = ArchConfig(config.to_dict())
    assert softmax_scale(cfg) == pytest.approx(
        24**-0.5 * (0.0707 * torch.log(torch.tensor(8.0)).item() + 1) ** 2
    )
    hf = random_hf_model(config, seed=21)
    randomize_correction_bias(hf, 22)
    model = load_saved(hf, tmp_path, DeepseekV3ForCausalLM, _safetensors().SafetensorsFormat().load)
    assert model.rope_neox_style
    assert_greedy_parity(model, hf, PROMPT, STEPS, what="deepseek-v3 yarn")


def test_v2_greedy_routing_with_a_low_rank_query(tmp_path):
    config = transformers.DeepseekV2Config(
        **SMALL, q_lora_rank=20, topk_method="greedy", rope_parameters=YARN
    )
    hf = random_hf_model(config, seed=23)
    model = load_saved(hf, tmp_path, DeepseekV2ForCausalLM, _safetensors().SafetensorsFormat().load)
    assert not model.rope_neox_style
    assert_greedy_parity(model, hf, PROMPT, STEPS, what="deepseek-v2 greedy")


def test_skips_multi_token_prediction_layers():
    """V3 checkpoints carry the MTP module as ``model.layers.{num_hidden_layers}``: passed
    over; a tensor no rule knows is still reported."""
    config = transformers.DeepseekV3Config(**SMALL, q_lora_rank=24, n_group=4, topk_group=2)
    hf = random_hf_model(config, seed=24)
    state = dict(hf.state_dict())
    state["model.layers.3.eh_proj.weight"] = torch.zeros(64, 128)
    state["model.layers.3.self_attn.kv_b_proj.weight"] = torch.zeros(4 * 28, 32)
    model = DeepseekV3ForCausalLM(ArchConfig(config.to_dict()), BuildContext())
    model.load_weights(iter(state.items()), naming="hf")
    state["model.layers.1.mlp.oddity.weight"] = torch.zeros(2)
    with pytest.raises(
        ValueError,
        match=r"unexpected checkpoint tensors \(1\): "
        r"model\.layers\.1\.mlp\.oddity\.weight",
    ):
        DeepseekV3ForCausalLM(ArchConfig(config.to_dict()), BuildContext()).load_weights(
            iter(state.items()), naming="hf"
        )


def _engine(codec: str = "auto", **cache):
    plugins = ["tallow-model-deepseek"] + (["tallow-kvcache-fp8"] if codec != "auto" else [])
    return offline_llm(
        "random:tiny-deepseek-v3",
        plugins=plugins,
        config={
            "model": {"dtype": "float32", "max_model_len": 64},
            "cache": {"block_size": 4, "num_blocks": 20, "kv_codec": codec, **cache},
            "scheduler": {"max_num_batched_tokens": 32, "prefill_chunk_size": 8, "max_num_seqs": 6},
        },
    )


def _prompts() -> list[list[int]]:
    shared = [(13 * j) % 500 + 3 for j in range(24)]
    return [shared + [(7 * i + j) % 500 + 3 for j in range(3 + 4 * i)] for i in range(5)]


def test_engine_latent_cache_chunks_and_prefix_hits():
    """Five prompts sharing a 24-token prefix, prefilled in chunks of 8 into a small cache
    (20 blocks of 4): each completion equals the one the same engine gives the prompt alone,
    and the prefix cache was hit (preemption is exercised by the two-rank test,
    tests/distributed/test_mla_parallel.py)."""
    llm = _engine()
    runner = llm.engine.core.runner
    (group,) = runner.paged_groups
    assert isinstance(group.spec, LatentCacheSpec) and len(group.layers) == 3
    assert runner.caches.paged[0][0].shape == (20, 4, 48)  # kv_lora_rank 32 + rope 16
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    together = [o.outputs[0].token_ids for o in llm.generate(_prompts(), params)]
    stats = llm.engine.stats()
    assert stats["prefix_cache_hit_rate"] > 0.2, stats
    alone = [llm.generate([p], params)[0].outputs[0].token_ids for p in _prompts()]
    assert together == alone
    assert len({tuple(t) for t in together}) == 5


def test_engine_fp8_latent_cache():
    """``cache.kv_codec: fp8`` keeps the latent rows in float8 (half the bytes of bfloat16
    rows, a quarter of float32); greedy tokens stay close to the float32 cache's."""
    fp8 = _engine("fp8")
    cache = fp8.engine.core.runner.caches.paged[0][0]
    assert cache.dtype == torch.float8_e4m3fn
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    prompts = _prompts()[:2]
    low = [o.outputs[0].token_ids for o in fp8.generate(prompts, params)]
    ref = [o.outputs[0].token_ids for o in _engine().generate(prompts, params)]
    same = sum(a == b for x, y in zip(low, ref) for a, b in zip(x, y))
    assert same >= 24, f"fp8 latent cache: only {same} of 32 greedy tokens agree: {low} {ref}"
    assert cache.abs().float().max() > 0  # rows were stored


def _latent_bytes_per_token(shape: str) -> tuple[float, float]:
    """(latent cache bytes per token, bytes per token of the per-head K and V the same
    attention would cache without the latent: H x (Dn + Dr) keys and H x Dv values), in
    bfloat16, built on the meta device from the ``random:`` shape."""
    config = ArchConfig(shape_config(shape))
    cls = {
        "DeepseekV2ForCausalLM": DeepseekV2ForCausalLM,
        "DeepseekV3ForCausalLM": DeepseekV3ForCausalLM,
    }[config["architectures"][0]]
    with torch.device("meta"):
        model = cls(config, BuildContext(dtype=torch.bfloat16, device=torch.device("meta")))
    groups = find_cache_groups(model)
    assert [type(g.spec) for g in groups] == [LatentCacheSpec]
    latent = (
        group_block_bytes(groups[0], AutoKVCodec(), block_size=16, model_dtype=torch.bfloat16) / 16
    )
    layers = sum(isinstance(m, MLAAttention) for m in model.modules())
    heads = int(config.num_attention_heads)
    per_head = config.qk_nope_head_dim + config.qk_rope_head_dim + config.v_head_dim
    return latent, layers * heads * per_head * 2


def test_latent_cache_bytes_per_token():
    """DeepSeek-V2-Lite's latent cache costs 27 layers x 576 x 2 bytes = 31,104 bytes per
    token, about 1/9 of the 276,480 of its 16 heads' own K and V; for a 128-head V3 layer the
    ratio is 1/71."""
    latent, full = _latent_bytes_per_token("random:deepseek-v2-lite")
    assert latent == 27 * 576 * 2 and full == 276_480
    assert latent / full < 0.115
    v3_layer = 576 * 2 / (128 * (128 + 64 + 128) * 2)
    assert v3_layer < 1 / 70


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_parity(tmp_path):
    """On the GPU (Triton latent decode, FusedMoE kernels): float32 greedy parity with
    transformers, bfloat16 prompt logits close to it."""
    hf = random_hf_model(_v3_yarn_config(), seed=25)
    randomize_correction_bias(hf, 26)
    read = _safetensors().SafetensorsFormat().load
    assert_cuda_parity(
        lambda **kw: load_saved(hf, tmp_path, DeepseekV3ForCausalLM, read, **kw),
        hf,
        PROMPT,
        STEPS,
        what="deepseek-v3",
    )


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_engine_with_graphs_matches_eager():
    """The engine on the GPU with the Triton backend: CUDA-graph decode of the latent cache
    gives the tokens of eager decode."""

    def run(disable: bool) -> list[list[int]]:
        llm = offline_llm(
            "random:tiny-deepseek-v3",
            plugins=["tallow-model-deepseek", "tallow-attention-triton"],
            config={
                "model": {"device": "cuda", "dtype": "float32"},
                "runner": {"disable_cuda_graph": disable},
            },
        )
        assert (llm.engine.core.runner.graphs is not None) != disable
        outs = llm.generate(
            _prompts(), SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
        )
        return [o.outputs[0].token_ids for o in outs]

    assert run(False) == run(True)


def test_a_codec_without_a_latent_form_is_refused():
    """The turbo codecs quantize K and V per head; they keep no latent rows: start-up stops
    naming the setting."""
    pytest.importorskip("tallow_kvcache_turboquant", reason="the turbo codecs' plugin")
    with pytest.raises(ValueError, match="cache.kv_codec 'turbo4' cannot keep a latent"):
        offline_llm(
            "random:tiny-deepseek-v3",
            plugins=["tallow-model-deepseek", "tallow-kvcache-turboquant"],
            config={
                "model": {"dtype": "float32", "max_model_len": 64},
                "cache": {"kv_codec": "turbo4", "num_blocks": 20},
            },
        )
