"""GGUF and fp8 checkpoints of the hybrid models on a GPU, through the Triton kernels: a float32
``qwen35moe`` GGUF against transformers (32 greedy tokens; bfloat16 prompt logits), a Q8_0 ``qwen3next`` file through the engine with its blocks
kept (tallow-quant-gguf's CUDA kernels; a prompt past two chunks of the delta rule), and a block-wise fp8 Qwen3-Next checkpoint through the
engine (tallow-quant-fp8), each against transformers on the weights the file decodes to."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

transformers = pytest.importorskip("transformers", reason="transformers is the parity oracle")
pytest.importorskip("tallow_format_gguf", reason="tallow-format-gguf reads the files")

from tallow import SamplingParams  # noqa: E402
from tallow.plugin.testing.engine import offline_llm  # noqa: E402
from tallow.plugin.testing.gguf_files import write_gguf  # noqa: E402
from tallow.plugin.testing.model import hf_greedy  # noqa: E402
from tallow.plugin.testing.model_parity import (  # noqa: E402
    assert_cuda_parity,
    clear_routing_prompt,
    assert_greedy_parity,
    load_model,
    random_hf_model,
)
from tallow.plugin.testing.seeds import seed_of  # noqa: E402
from tallow_format_gguf.format import GGUFFormat  # noqa: E402

from tallow_model_qwen3_next.qwen3_5 import Qwen3_5MoeForCausalLM  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from gguf_convert import hybrid_gguf_tensors, hybrid_metadata  # noqa: E402
from tiny_config import GPU_CONFIG, LONG_PROMPT  # noqa: E402

#: PagedRunner's cache holds 64 tokens a sequence: 30 of prompt and 32 steps
SHORT_PROMPT = LONG_PROMPT[:30]
# every other layer full attention: a GGUF file states the pattern as one interval
PERIODIC = dict(
    GPU_CONFIG, layer_types=["linear_attention", "full_attention"] * 2, mlp_only_layers=[]
)


def test_qwen35moe_gguf_cuda_parity(tmp_path):
    cfg = {k: v for k, v in PERIODIC.items() if k != "mlp_only_layers"}
    hf = random_hf_model(
        transformers.Qwen3_5MoeTextConfig(**cfg), seed=seed_of("qwen3-next-gguf-gpu")
    )
    path = tmp_path / "qwen35moe.gguf"
    tensors = hybrid_gguf_tensors(hf, "qwen35moe")
    metadata = hybrid_metadata(hf.config, "qwen35moe")
    write_gguf(path, "qwen35moe", metadata, tensors, hf.config.vocab_size)
    ckpt = GGUFFormat().load(str(path))
    config = Qwen3_5MoeForCausalLM.config_from_gguf(ckpt.extra["gguf_metadata"], dict(ckpt.config))

    def load(**kw):
        return load_model(Qwen3_5MoeForCausalLM, ckpt, config=config, **kw)

    # prompts whose routing has no near-tie (the bfloat16 one none within 5e-2 of the
    # logits' scale): every token's experts are those of transformers' run
    model, vocab = load(), hf.config.vocab_size
    assert_cuda_parity(
        load,
        hf,
        clear_routing_prompt(model, len(SHORT_PROMPT), 1e-4, vocab),
        32,
        bf16_prompt=clear_routing_prompt(model, len(SHORT_PROMPT), 5e-2, vocab),
        what="qwen35moe GGUF",
    )


def test_q8_0_gguf_through_the_engine_on_cuda(tmp_path):
    pytest.importorskip("tallow_quant_gguf", reason="tallow-quant-gguf keeps the blocks")
    import test_gguf

    hf = random_hf_model(
        transformers.Qwen3NextConfig(**PERIODIC), seed=seed_of("qwen3-next-q8-gpu")
    )
    path, oracle = test_gguf.write_q8_0(tmp_path, hf)
    prompts = [LONG_PROMPT, [5, 9, 2], list(range(60, 83))]
    llm = offline_llm(
        str(path),
        plugins=["tallow-model-qwen3-next", "tallow-format-gguf", "tallow-quant-gguf"],
        config={
            "model": {"dtype": "float32", "max_model_len": 256, "device": "cuda"},
            "cache": {"num_blocks": 64},
        },
    )
    assert "Q8_0" in llm.engine.parts.loaded.quant.summary()
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    outs = llm.generate([list(p) for p in prompts], params)
    for prompt, out in zip(prompts, outs):
        assert list(out.outputs[0].token_ids) == hf_greedy(oracle, prompt, 16)[0]


def test_block_fp8_checkpoint_on_cuda(tmp_path):
    pytest.importorskip("tallow_quant_fp8", reason="tallow-quant-fp8 serves fp8 checkpoints")
    import test_fp8
    from tallow.config import config_from_mapping
    from tallow.engine.llm_engine import LLMEngine

    hf = random_hf_model(
        transformers.Qwen3NextConfig(**{**test_fp8.TINY, **test_fp8.SIZES}),
        seed=seed_of("qwen3-next-fp8-gpu"),
    )
    oracle = test_fp8.write_fp8_checkpoint(hf, tmp_path / "fp8")
    eng = LLMEngine.from_config(
        config_from_mapping(
            {
                "model": {
                    "source": str(tmp_path / "fp8"),
                    "device": "cuda",
                    "dtype": "float32",
                    "max_model_len": 64,
                },
                "cache": {"num_blocks": 32},
            }
        )
    )
    # at most 16 rows a step: weight-only fp8 linears, so the dequantized weights are the oracle
    assert_greedy_parity(
        eng.parts.loaded.model, oracle, test_fp8.PROMPT, test_fp8.STEPS, what="fp8 on cuda"
    )
