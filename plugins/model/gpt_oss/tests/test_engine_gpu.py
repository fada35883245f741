"""gpt-oss on a GPU: float32 parity with transformers through the Triton kernels (attention
with sinks and windows, the experts' GEMV and GEMM paths), and ``random:gpt-oss-20b``
(bfloat16, MXFP4 experts) through the engine with CUDA graphs against eager steps."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

transformers = pytest.importorskip("transformers", reason="transformers is the parity oracle")

from tallow import SamplingParams  # noqa: E402
from tallow.plugin.testing.model_parity import (  # noqa: E402
    assert_cuda_parity,
    clear_routing_prompt,
    load_saved,
    random_hf_model,
)

from tallow_model_gpt_oss.model import GptOssForCausalLM  # noqa: E402

YARN = {
    "rope_type": "yarn",
    "factor": 4.0,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "truncate": False,
    "original_max_position_embeddings": 64,
    "rope_theta": 150000.0,
}
CONFIG = dict(
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=8,
    num_key_value_heads=2,
    head_dim=64,
    vocab_size=160,
    num_local_experts=8,
    num_experts_per_tok=4,
    sliding_window=6,
    max_position_embeddings=256,
    rope_parameters=YARN,
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=None,
)
PROMPT = [(37 * i + 11) % 160 for i in range(30)]


def test_cuda_parity(tmp_path):
    from tallow_format_safetensors.format import SafetensorsFormat

    hf = random_hf_model(transformers.GptOssConfig(**CONFIG), seed=8)

    def load(**kw):
        return load_saved(hf, tmp_path, GptOssForCausalLM, SafetensorsFormat().load, **kw)

    # prompts whose routing has no near-tie (the bfloat16 one none within 5e-2 of the
    # logits' scale): every token's experts are those of transformers' run
    model, vocab = load(), CONFIG["vocab_size"]
    assert_cuda_parity(
        load,
        hf,
        clear_routing_prompt(model, len(PROMPT), 1e-4, vocab),
        32,
        bf16_prompt=clear_routing_prompt(model, len(PROMPT), 5e-2, vocab),
        what="gpt-oss",
    )


def test_bfloat16_modules_on_cuda_match_the_cpu(tmp_path):
    """In bfloat16 every norm, linear layer and MoE block computes on the GPU (Triton
    kernels, cuBLAS) what our torch path computes on the CPU from the same inputs: both
    accumulate in float32 and round their outputs to bfloat16, so they differ by about one
    bfloat16 step (2^-8 of the scale); 2e-2 allows five. A layer past it is named (this
    localises a bfloat16 prompt-logit error of test_cuda_parity)."""
    from tallow.plugin.testing.module_parity import assert_modules_match
    from tallow_format_safetensors.format import SafetensorsFormat

    hf = random_hf_model(transformers.GptOssConfig(**CONFIG), seed=8)

    def load(**kw):
        return load_saved(hf, tmp_path, GptOssForCausalLM, SafetensorsFormat().load, **kw)

    gpu, cpu = load(dtype=torch.bfloat16, device="cuda"), load(dtype=torch.bfloat16)
    assert assert_modules_match(gpu, cpu, PROMPT, 2e-2, "gpt-oss bfloat16") > 0


@pytest.mark.gpu_alone
def test_random_20b_cuda_graphs_equal_eager():
    from tallow.config import config_from_mapping
    from tallow.engine.llm_engine import LLMEngine
    from tallow.plugin.testing.engine import replay_own_graph_sizes

    def engine(graphs: bool) -> LLMEngine:
        return LLMEngine.from_config(
            config_from_mapping(
                {
                    "model": {
                        "source": "random:gpt-oss-20b",
                        "device": "cuda",
                        "dtype": "bfloat16",
                        "max_model_len": 2048,
                    },
                    "cache": {"num_blocks": 2048},
                    "runner": {"disable_cuda_graph": not graphs, "max_cuda_graph_batch": 16},
                }
            )
        )

    def greedy(eng: LLMEngine, prompts: list[list[int]]) -> list[list[int]]:
        ids = []
        for p in prompts:
            ids.append(eng.next_request_id())
            eng.add_request(
                ids[-1], p, SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
            )
        done = {}
        while eng.has_unfinished():
            for out in eng.step():
                if out.finished:
                    done[out.request_id] = list(out.outputs[0].token_ids)
        return [done[i] for i in ids]

    graphs = engine(True)
    assert graphs.parts.attention_backend == "triton"
    assert "mxfp4 experts x24" in graphs.parts.loaded.quant.summary()
    replay_own_graph_sizes(graphs)
    eager = engine(False)  # the same random weights (one seed)
    g = torch.Generator().manual_seed(0)
    for n in (1, 4, 16):
        # prompts past the 128-token window, and short ones
        batch = [
            torch.randint(0, 200000, (int(L),), generator=g).tolist()
            for L in torch.randint(3, 400, (n,), generator=g)
        ]
        assert greedy(graphs, batch) == greedy(eager, batch), f"batch {n}"
