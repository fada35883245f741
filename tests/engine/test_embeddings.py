"""Embeddings of decoder models (``model.task: embed``): last-token and mean pooling against
transformers' hidden states on a tiny random Qwen3, the Qwen3-Embedding checkpoint layout
(bare decoder weights, sentence-transformers files), and how the engine runs embedding
requests: many per step, whole, nothing kept after them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from tallow import LLM, SamplingParams
from tallow.engine.embedding import EmbeddingInfo

transformers = pytest.importorskip("transformers", reason="transformers is the parity oracle")

INPUTS = [[5, 17, 200, 9, 64, 128, 5, 77, 31], [42], [3, 3, 3, 250, 1, 0, 12], list(range(10, 50))]


@pytest.fixture(scope="module")
def tiny_qwen3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tiny_models import save_tiny

    return save_tiny(tmp_path_factory.mktemp("tiny-qwen3"), "qwen3", head_dim=16)


def _hf_states(path: Path, inputs: list[list[int]]) -> list[torch.Tensor]:
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    with torch.no_grad():
        return [model.model(torch.tensor([ids])).last_hidden_state[0] for ids in inputs]


def _llm(path: Path, **kw) -> LLM:
    return LLM(str(path), device="cpu", max_model_len=128, **kw)


@pytest.mark.parametrize("pooling", ["last", "mean"])
def test_decoder_pooling_matches_transformers(tiny_qwen3: Path, pooling: str) -> None:
    llm = _llm(tiny_qwen3, task="embed", pooling=pooling)
    outs = llm.embed(INPUTS)
    assert llm.engine.core.steps == 1, "the inputs should share one step"
    for ids, out, states in zip(INPUTS, outs, _hf_states(tiny_qwen3, INPUTS)):
        ref = states[-1] if pooling == "last" else states.mean(0)
        ref = torch.nn.functional.normalize(ref, dim=0)
        assert out.prompt_token_ids == ids
        torch.testing.assert_close(torch.tensor(out.embedding), ref, rtol=1e-4, atol=1e-5)
    assert llm.engine.model_name and llm.engine.parts.loaded.model.lm_head is None
    bm = llm.engine.core.scheduler.block_manager
    assert bm.num_free_blocks == bm.num_total_blocks


def test_unnormalized_embeddings_and_their_dimensions(tiny_qwen3: Path) -> None:
    llm = _llm(tiny_qwen3, task="embed", normalize_embeddings=False)
    (out,) = llm.embed([INPUTS[0]])
    ref = _hf_states(tiny_qwen3, INPUTS[:1])[0][-1]
    torch.testing.assert_close(torch.tensor(out.embedding), ref, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="dimensions: .*not normalized"):
        llm.embed([INPUTS[0]], dimensions=8)


def test_qwen3_embedding_layout_is_detected(tiny_qwen3: Path, tmp_path: Path) -> None:
    """Weights saved from the bare decoder (``layers.0...``, no head) with sentence-transformers
    files asking for last-token pooling and normalization, as Qwen3-Embedding ships: served for
    embeddings without any setting."""
    from safetensors.torch import load_file, save_file

    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny_qwen3 / name, tmp_path / name)
    tensors = load_file(str(tiny_qwen3 / "model.safetensors"))
    bare = {k.removeprefix("model."): v for k, v in tensors.items() if k != "lm_head.weight"}
    save_file(bare, str(tmp_path / "model.safetensors"))
    (tmp_path / "modules.json").write_text(
        json.dumps(
            [
                {
                    "idx": 0,
                    "name": "0",
                    "path": "",
                    "type": "sentence_transformers.models.Transformer",
                },
                {
                    "idx": 1,
                    "name": "1",
                    "path": "1_Pooling",
                    "type": "sentence_transformers.models.Pooling",
                },
                {
                    "idx": 2,
                    "name": "2",
                    "path": "2_Normalize",
                    "type": "sentence_transformers.models.Normalize",
                },
            ]
        )
    )
    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "1_Pooling" / "config.json").write_text(
        json.dumps(
            {
                "word_embedding_dimension": 64,
                "pooling_mode_cls_token": False,
                "pooling_mode_mean_tokens": False,
                "pooling_mode_lasttoken": True,
            }
        )
    )
    (tmp_path / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 32}))
    llm = LLM(str(tmp_path), device="cpu")
    assert llm.engine.task == "embed" and llm.engine.max_model_len == 32
    assert llm.engine.embedding == EmbeddingInfo(pooling="last", normalize=True, size=64)
    outs = llm.embed([INPUTS[0], INPUTS[2]])
    for ids, out, states in zip(
        [INPUTS[0], INPUTS[2]], outs, _hf_states(tiny_qwen3, [INPUTS[0], INPUTS[2]])
    ):
        ref = torch.nn.functional.normalize(states[-1], dim=0)
        torch.testing.assert_close(torch.tensor(out.embedding), ref, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="inputs\\[0\\]: the input has 40 tokens"):
        llm.embed([INPUTS[3]])
    (cut,) = llm.embed([INPUTS[3]], truncate_prompt_tokens=-1)
    assert cut.prompt_token_ids == INPUTS[3][:32]


def test_tasks_refuse_each_others_requests(tiny_qwen3: Path) -> None:
    generating = _llm(tiny_qwen3)
    assert generating.engine.task == "generate"
    with pytest.raises(ValueError, match="'generate' task"):
        generating.embed(["hello"])
    embedding = _llm(tiny_qwen3, task="embed")
    with pytest.raises(ValueError, match="'embed' task"):
        embedding.generate([[1, 2, 3]], SamplingParams(max_tokens=2))


def test_inputs_longer_than_a_step_get_a_step_of_their_own(tiny_qwen3: Path) -> None:
    """A step's budget is raised to the longest input; inputs that do not fit beside others
    wait for the next step, and each is still computed whole."""
    llm = _llm(tiny_qwen3, task="embed", max_num_batched_tokens=16, pooling="mean")
    assert llm.engine.core.scheduler.max_num_batched_tokens == 128
    inputs = [list(range(5, 105)), list(range(7, 67)), [9] * 30]
    outs = llm.embed(inputs)
    assert llm.engine.core.steps == 2  # 100 + 60 tokens do not share a 128-token step
    for ids, out, states in zip(inputs, outs, _hf_states(tiny_qwen3, inputs)):
        ref = torch.nn.functional.normalize(states.mean(0), dim=0)
        torch.testing.assert_close(torch.tensor(out.embedding), ref, rtol=1e-4, atol=1e-5)


def test_matryoshka_dimensions_from_the_config() -> None:
    info = EmbeddingInfo(pooling="last", normalize=False, size=64, matryoshka_dimensions=(16, 32))
    assert info.dimensions_problem(32) is None and info.dimensions_problem(64) is None
    assert "16, 32" in info.dimensions_problem(20)
    assert "more than the model's 64" in info.dimensions_problem(65)
    normalized = EmbeddingInfo(pooling="mean", normalize=True, size=64)
    assert normalized.dimensions_problem(20) is None


def test_async_engine_embeds_concurrently_and_cancels(tiny_qwen3: Path) -> None:
    """Concurrent AsyncEngine.embed calls share steps and give the offline engine's vectors;
    one cancelled at once (a client gone) leaves no request and no KV block behind."""
    import asyncio

    from tallow.engine.async_engine import AsyncEngine
    from tallow.engine.embedding import PoolingParams
    from tallow.engine.llm import config_from_kwargs

    settings = dict(model=str(tiny_qwen3), device="cpu", max_model_len=128, task="embed")
    expected = LLM.from_config(config_from_kwargs(**settings)).embed(INPUTS)

    async def main() -> list:
        engine = AsyncEngine.from_config(config_from_kwargs(**settings))
        try:
            calls = [
                asyncio.ensure_future(engine.embed(ids, PoolingParams(), f"e{i}"))
                for i, ids in enumerate(INPUTS)
            ]
            gone = asyncio.ensure_future(engine.embed(INPUTS[0], PoolingParams(), "gone"))
            await asyncio.sleep(0)
            gone.cancel()
            outs = await asyncio.gather(*calls)
            for _ in range(100):
                if not engine.core.has_unfinished():
                    break
                await asyncio.sleep(0.02)
            bm = engine.core.scheduler.block_manager
            assert not engine.core.has_unfinished()
            assert bm.num_free_blocks == bm.num_total_blocks
            return outs
        finally:
            await engine.shutdown()

    for got, want in zip(asyncio.run(main()), expected):
        assert got.prompt_token_ids == want.prompt_token_ids
        torch.testing.assert_close(
            torch.tensor(got.embedding), torch.tensor(want.embedding), rtol=1e-5, atol=1e-6
        )


def test_warm_up_of_an_embedding_engine_leaves_no_trace(tiny_qwen3: Path) -> None:
    """The start-up warm-up (run on GPUs) sends embedding steps, not generation ones."""
    llm = _llm(tiny_qwen3, task="embed")
    core = llm.engine.core
    core.warm_up()
    bm = core.scheduler.block_manager
    assert not core.has_unfinished() and core.steps == 0
    assert bm.num_free_blocks == bm.num_total_blocks
    assert len(llm.embed(INPUTS[:2])) == 2
