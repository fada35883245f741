"""Parity with transformers on tiny random BERT, RoBERTa and XLM-RoBERTa encoders.

Each model is saved by transformers as safetensors and read back through tallow-format-safetensors.
Hidden states of every token must match transformers' ``last_hidden_state`` (several sequences
in one flat step, bidirectional attention over the paged cache), and the engine's pooled
embeddings (mean and CLS, normalized) must match the same pooling of transformers' states.
"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is the parity oracle")

SMALL = dict(
    vocab_size=120,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    type_vocab_size=2,
)
CONFIGS = {
    "bert": lambda: transformers.BertConfig(**SMALL, max_position_embeddings=64),
    "bert-tanh-gelu": lambda: transformers.BertConfig(
        **SMALL, max_position_embeddings=64, hidden_act="gelu_new", layer_norm_eps=1e-5
    ),
    "roberta": lambda: transformers.RobertaConfig(
        **{**SMALL, "type_vocab_size": 1}, max_position_embeddings=66, pad_token_id=1
    ),
    "xlm-roberta": lambda: transformers.XLMRobertaConfig(
        **{**SMALL, "type_vocab_size": 1}, max_position_embeddings=66, pad_token_id=1
    ),
}
INPUTS = [
    [2, 17, 55, 9, 101, 3],
    [2, 3],
    [2, 88, 11, 64, 64, 12, 7, 99, 45, 30, 6, 3],
    [2, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 3],
]


def _hf_hidden(hf, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf(torch.tensor([ids])).last_hidden_state[0]


@pytest.mark.parametrize("name", list(CONFIGS))
def test_hidden_states_match_transformers(name, tmp_path, kit):
    hf = kit.build_hf(CONFIGS[name](), tmp_path, seed=len(name))
    model = kit.load_tallow(tmp_path)
    runner = kit.runner(model)
    for i in range(3):
        runner.add(i)
    got = runner.hidden_states([(i, ids) for i, ids in enumerate(INPUTS[:3])])
    for ids, ours in zip(INPUTS, got):
        torch.testing.assert_close(ours, _hf_hidden(hf, ids), rtol=1e-4, atol=1e-4)


def test_attention_is_bidirectional(tmp_path, kit):
    """The first token's state depends on the tokens after it (a causal mask would not)."""
    kit.build_hf(CONFIGS["bert"](), tmp_path)
    model = kit.load_tallow(tmp_path)
    runner = kit.runner(model)
    runner.add(0)
    runner.add(1)
    a, b = runner.hidden_states([(0, [2, 10, 11, 3]), (1, [2, 10, 12, 3])])
    assert not torch.allclose(a[0], b[0], atol=1e-3)


@pytest.mark.parametrize(
    ("name", "pooling"), [("bert", "mean"), ("bert", "cls"), ("roberta", "mean")]
)
def test_engine_embeddings_match_transformers(name, pooling, tmp_path, kit):
    """All inputs in one engine step; pooled and normalized as sentence-transformers does."""
    from tallow import LLM

    hf = kit.build_hf(CONFIGS[name](), tmp_path, seed=3)
    llm = LLM(str(tmp_path), device="cpu", pooling=pooling, max_num_seqs=8)
    assert llm.engine.task == "embed"  # an encoder: detected without model.task
    outs = llm.embed(INPUTS)
    assert llm.engine.core.steps == 1, "the inputs should share one step"
    for ids, out in zip(INPUTS, outs):
        states = _hf_hidden(hf, ids)
        ref = states.mean(0) if pooling == "mean" else states[0]
        ref = torch.nn.functional.normalize(ref, dim=0)
        assert out.prompt_token_ids == ids
        torch.testing.assert_close(torch.tensor(out.embedding), ref, rtol=1e-4, atol=1e-5)
    bm = llm.engine.core.scheduler.block_manager
    assert bm.num_free_blocks == bm.num_total_blocks, "embedding requests keep no KV"


def test_prefixed_checkpoint_with_task_heads_loads(tmp_path, kit):
    """A checkpoint saved from a task model (``bert.`` prefix, masked-LM head, pooler) loads
    the encoder and passes the heads over."""
    from safetensors.torch import load_file, save_file

    hf = kit.build_hf(CONFIGS["bert"](), tmp_path)
    tensors = load_file(str(tmp_path / "model.safetensors"))
    renamed = {f"bert.{k}": v for k, v in tensors.items()}
    renamed["cls.predictions.bias"] = torch.zeros(SMALL["vocab_size"])
    renamed["cls.predictions.transform.dense.weight"] = torch.zeros(64, 64)
    renamed["bert.pooler.dense.weight"] = torch.zeros(64, 64)
    save_file(renamed, str(tmp_path / "model.safetensors"))
    model = kit.load_tallow(tmp_path)
    torch.testing.assert_close(
        model.embeddings.word_embeddings.weight,
        hf.embeddings.word_embeddings.weight,
        rtol=0,
        atol=0,
    )


def test_input_longer_than_the_position_table_is_refused(tmp_path, kit):
    from tallow import LLM

    kit.build_hf(CONFIGS["roberta"](), tmp_path)
    with pytest.raises(ValueError, match="64 position embeddings"):
        LLM(str(tmp_path), device="cpu", max_model_len=65)
    llm = LLM(str(tmp_path), device="cpu")
    assert llm.engine.max_model_len == 64  # 66 rows, counted from pad_token_id + 1


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_engine_embeddings_on_cuda(dtype, tmp_path, kit):
    """The Triton backend's bidirectional prefill (and one-token inputs through its decode
    kernel) against transformers on the CPU."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from tallow import LLM

    hf = kit.build_hf(CONFIGS["bert"](), tmp_path, seed=5)
    llm = LLM(str(tmp_path), device="cuda", dtype=str(dtype).removeprefix("torch."))
    assert llm.engine.parts.attention_backend == "triton"
    inputs = INPUTS + [[5], [2, *range(4, 60), 3]]
    outs = llm.embed(inputs)
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-4
    for ids, out in zip(inputs, outs):
        ref = torch.nn.functional.normalize(_hf_hidden(hf, ids).mean(0), dim=0)
        cos = torch.nn.functional.cosine_similarity(torch.tensor(out.embedding), ref, dim=0)
        assert float(cos) > 1 - tol, (ids, float(cos))
