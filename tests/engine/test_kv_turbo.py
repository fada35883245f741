"""The turbo KV codecs of tallow-kvcache-turboquant through the engine on CPU (the torch
reference attention reading the cache through the codec): against transformers whose
attention sees its keys and values passed through the same codec, and through the engine's
paths that move blocks around — chunked prefill, partial blocks, prefix-cache hits,
copy-on-write and preemption — which must give the same tokens as a plain run."""

from __future__ import annotations

import pytest
import torch

from codec_oracle import hf_model_through
from tallow import LLM, SamplingParams

PROMPT = "Paged attention stores keys and values in fixed-size blocks. Continuous batching"
PROMPTS = ["The quick brown fox", "def add(a, b):", PROMPT, PROMPT * 2]
STEPS = 10
CODECS = ["turbo8", "turbo4", "turbo3"]


@pytest.mark.parametrize("codec", CODECS)
def test_turbo_cache_matches_transformers_through_the_same_codec(tiny_qwen2, codec):
    """Qwen2 has key biases, so its keys share an offset that the codecs' calibration
    removes: prompt log-probs, greedy tokens and their log-probs as transformers computes
    them with K/V through the codec (with the engine's calibrated tensors)."""
    llm = LLM(
        model=str(tiny_qwen2),
        dtype="float32",
        device="cpu",
        num_blocks=128,
        block_size=4,
        kv_codec=codec,
    )
    caches = llm.engine.core.runner.kv_caches
    assert {c.codec.name for c in caches} == {codec}
    assert all(float(c["k_offset"].abs().max()) > 0 for c in caches)  # calibrated
    ids = llm.get_tokenizer().encode(PROMPT)
    out = llm.generate(
        [ids],
        SamplingParams(
            temperature=0.0, max_tokens=STEPS, ignore_eos=True, logprobs=0, prompt_logprobs=0
        ),
    )[0]
    got_prompt = torch.tensor([out.prompt_logprobs[p][ids[p]].logprob for p in range(1, len(ids))])
    model = hf_model_through(tiny_qwen2, caches, codec)
    with torch.no_grad():
        prompt = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)
        # no end-of-sequence token: the engine ignores EOS, so transformers must neither stop
        # at it nor mask it (min_new_tokens would) where it is the greedy choice
        ref = model.generate(
            torch.tensor([ids]),
            max_new_tokens=STEPS,
            eos_token_id=None,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
            pad_token_id=0,
        )
    ref_prompt = prompt[torch.arange(len(ids) - 1), torch.tensor(ids[1:])]
    torch.testing.assert_close(got_prompt, ref_prompt, atol=1e-4, rtol=0)
    ref_tokens = ref.sequences[0, len(ids) :].tolist()
    completion = out.outputs[0]
    assert completion.token_ids == ref_tokens
    steps = torch.stack([torch.log_softmax(s[0].float(), -1) for s in ref.logits])
    got_steps = torch.tensor([completion.logprobs[i][t].logprob for i, t in enumerate(ref_tokens)])
    torch.testing.assert_close(got_steps, steps[torch.arange(STEPS), ref_tokens], atol=1e-4, rtol=0)


def greedy(
    llm: LLM, prompts: list[str], n: int = 1, ignore_eos: bool = True
) -> list[list[list[int]]]:
    params = SamplingParams(
        temperature=0.0 if n == 1 else 1.0, seed=3, n=n, max_tokens=24, ignore_eos=ignore_eos
    )
    return [[c.token_ids for c in o.outputs] for o in llm.generate(prompts, params)]


@pytest.fixture(scope="module")
def plain_turbo4(tiny_qwen2) -> tuple[LLM, list[list[list[int]]]]:
    llm = LLM(
        model=str(tiny_qwen2),
        dtype="float32",
        device="cpu",
        num_blocks=256,
        block_size=4,
        kv_codec="turbo4",
        enable_prefix_caching=False,
    )
    return llm, [greedy(llm, [p])[0] for p in PROMPTS]


def test_chunked_prefill_and_batching_store_the_same_codes(tiny_qwen2, plain_turbo4):
    """Each token's codes depend on that token alone: prompts cut into chunks of 3 tokens,
    in one batch, give the tokens of each prompt run alone."""
    _, expected = plain_turbo4
    chunked = LLM(
        model=str(tiny_qwen2),
        dtype="float32",
        device="cpu",
        num_blocks=256,
        block_size=4,
        kv_codec="turbo4",
        prefill_chunk_size=3,
        max_num_batched_tokens=8,
    )
    assert greedy(chunked, PROMPTS) == expected


def test_prefix_cache_hits_and_copy_on_write_keep_the_tokens(tiny_qwen2, plain_turbo4):
    """A prompt served from cached blocks (full blocks of an earlier one, the last partial
    block recomputed) and n=2 completions that share the prompt's blocks until they
    diverge."""
    _, expected = plain_turbo4
    llm = LLM(
        model=str(tiny_qwen2),
        dtype="float32",
        device="cpu",
        num_blocks=256,
        block_size=4,
        kv_codec="turbo4",
    )
    start = llm.engine.core.scheduler.block_manager.num_free_blocks
    first = llm.generate(
        PROMPTS[3], SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    )[0]
    again = llm.generate(
        PROMPTS[3], SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    )[0]
    assert again.num_cached_tokens > 0
    assert first.outputs[0].token_ids == again.outputs[0].token_ids == expected[3][0]
    forked = greedy(llm, [PROMPTS[2]], n=2)[0]
    assert forked[0] != forked[1]
    plain = plain_turbo4[0]
    assert greedy(plain, [PROMPTS[2]], n=2)[0] == forked
    assert llm.engine.core.scheduler.block_manager.num_free_blocks == start


def test_preemption_resumes_with_identical_tokens(tiny_qwen2, plain_turbo4):
    """Sequences of unknown length reserve nothing, so a small cache preempts some of them;
    they are recomputed into fresh blocks and continue with the same tokens."""
    plain, _ = plain_turbo4
    prompts = [PROMPT, PROMPT + " again", "So: " + PROMPT, PROMPT.upper()]
    expected = greedy(plain, prompts, ignore_eos=False)
    tight = LLM(
        model=str(tiny_qwen2),
        dtype="float32",
        device="cpu",
        num_blocks=40,
        block_size=4,
        kv_codec="turbo4",
        enable_prefix_caching=False,
        max_model_len=128,
    )
    assert greedy(tight, prompts, ignore_eos=False) == expected
    assert tight.engine.core.scheduler.num_preemptions > 0
