"""The engine end to end on tiny random models, with transformers as the oracle."""

from __future__ import annotations

import pytest
import torch

from tallow import LLM, SamplingParams

PROMPTS = [
    "The quick brown fox",
    "def add(a, b):",
    "Paged attention stores keys and values in fixed-size blocks. Continuous batching",
    "日本語",
]


def hf_greedy(path, prompt_ids: list[int], n: int) -> tuple[list[int], torch.Tensor]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    out = model.generate(
        torch.tensor([prompt_ids]),
        max_new_tokens=n,
        min_new_tokens=n,
        do_sample=False,
        output_logits=True,
        return_dict_in_generate=True,
        pad_token_id=0,
    )
    tokens = out.sequences[0, len(prompt_ids) :].tolist()
    # raw logits: the scores are processed (min_new_tokens masks EOS)
    logprobs = torch.stack([torch.log_softmax(s[0].float(), -1) for s in out.logits])
    return tokens, logprobs


@pytest.fixture(scope="module", params=[True, False], ids=["async-scheduling", "sync"])
def llm(tiny_llama, request):
    return LLM(
        model=str(tiny_llama),
        dtype="float32",
        device="cpu",
        num_blocks=256,
        block_size=4,
        async_scheduling=request.param,
    )


def free_blocks(llm: LLM) -> int:
    return llm.engine.core.scheduler.block_manager.num_free_blocks


def test_greedy_20_steps_match_transformers(llm, tiny_llama):
    tok = llm.get_tokenizer()
    params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True, logprobs=2)
    for prompt in PROMPTS:
        ids = tok.encode(prompt)
        out = llm.generate(prompt, params)[0].outputs[0]
        expected, hf_logprobs = hf_greedy(tiny_llama, ids, 20)
        assert out.token_ids == expected, prompt
        ours = torch.tensor([out.logprobs[i][t].logprob for i, t in enumerate(out.token_ids)])
        theirs = hf_logprobs[torch.arange(20), torch.tensor(expected)]
        assert torch.allclose(ours, theirs, atol=1e-4), (ours - theirs).abs().max()
        assert out.finish_reason == "length"


def test_mixed_batch_with_small_prefill_chunks_equals_alone(tiny_llama):
    alone = LLM(model=str(tiny_llama), dtype="float32", device="cpu", num_blocks=256, block_size=4)
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    expected = [alone.generate(p, params)[0].outputs[0].token_ids for p in PROMPTS]
    chunked = LLM(
        model=str(tiny_llama),
        dtype="float32",
        device="cpu",
        num_blocks=256,
        block_size=4,
        prefill_chunk_size=3,
        max_num_batched_tokens=8,
    )
    got = [o.outputs[0].token_ids for o in chunked.generate(PROMPTS, params)]
    assert got == expected


def test_seeded_sampling_is_reproducible_across_batch_compositions(llm):
    params = SamplingParams(temperature=1.0, top_p=0.9, max_tokens=16, seed=1234, ignore_eos=True)
    alone = llm.generate(PROMPTS[0], params)[0].outputs[0].token_ids
    other = SamplingParams(temperature=0.8, max_tokens=10, seed=7, ignore_eos=True)
    batch = llm.generate([PROMPTS[2], PROMPTS[0], PROMPTS[1]], [other, params, other])
    assert batch[1].outputs[0].token_ids == alone
    unseeded = SamplingParams(temperature=1.0, max_tokens=16, ignore_eos=True)
    batch2 = llm.generate([PROMPTS[0], PROMPTS[0]], [unseeded, params])
    assert batch2[1].outputs[0].token_ids == alone


def test_preemption_resumes_with_identical_tokens(tiny_llama):
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    roomy = LLM(model=str(tiny_llama), dtype="float32", device="cpu", num_blocks=256, block_size=4)
    expected = [o.outputs[0].token_ids for o in roomy.generate(PROMPTS, params)]
    # 40 blocks of 4 tokens cannot hold four ~60-token sequences at once: preemption happens.
    tight = LLM(
        model=str(tiny_llama),
        dtype="float32",
        device="cpu",
        num_blocks=40,
        block_size=4,
        enable_prefix_caching=False,
        max_model_len=128,
    )
    start = free_blocks(tight)
    got = [o.outputs[0].token_ids for o in tight.generate(PROMPTS, params)]
    assert got == expected
    assert free_blocks(tight) == start


def test_n2_shares_prompt_and_frees_every_block(llm):
    start = free_blocks(llm)
    params = SamplingParams(n=2, temperature=1.0, max_tokens=12, seed=5, ignore_eos=True)
    out = llm.generate(PROMPTS[2], params)[0]
    assert len(out.outputs) == 2
    assert out.outputs[0].token_ids != out.outputs[1].token_ids
    again = llm.generate(PROMPTS[2], params)[0]
    assert [o.token_ids for o in again.outputs] == [o.token_ids for o in out.outputs]
    assert free_blocks(llm) == start


def test_stop_string_cuts_output(llm):
    base = llm.generate(
        PROMPTS[1], SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    )[0].outputs[0]
    text = base.text
    assert len(text) > 6
    stop = text[3:6]
    first = text.find(stop)
    out = llm.generate(
        PROMPTS[1], SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True, stop=[stop])
    )[0].outputs[0]
    assert out.text == text[:first]
    assert out.finish_reason == "stop" and out.stop_reason == stop
    incl = llm.generate(
        PROMPTS[1],
        SamplingParams(
            temperature=0.0,
            max_tokens=20,
            ignore_eos=True,
            stop=[stop],
            include_stop_str_in_output=True,
        ),
    )[0].outputs[0]
    assert incl.text == text[: first + len(stop)]


def test_stop_token_ids_and_max_tokens(llm):
    base = llm.generate(
        PROMPTS[0], SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    )[0].outputs[0]
    stop_id = base.token_ids[4]
    out = llm.generate(
        PROMPTS[0],
        SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True, stop_token_ids=[stop_id]),
    )[0].outputs[0]
    k = base.token_ids.index(stop_id)
    assert out.token_ids == base.token_ids[: k + 1]
    assert out.finish_reason == "stop" and out.stop_reason == stop_id


def test_prompt_logprobs_match_transformers(llm, tiny_llama):
    from transformers import AutoModelForCausalLM

    tok = llm.get_tokenizer()
    ids = tok.encode(PROMPTS[2])
    out = llm.generate(
        PROMPTS[2], SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=1)
    )[0]
    assert out.prompt_logprobs[0] is None
    model = AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32)
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0]
    ref = torch.log_softmax(logits.float(), -1)
    for pos in range(1, len(ids)):
        entry = out.prompt_logprobs[pos]
        assert entry[ids[pos]].logprob == pytest.approx(float(ref[pos - 1, ids[pos]]), abs=1e-4)


def test_prefix_cache_hits_on_repeated_prompt(llm):
    long_prompt = PROMPTS[2] * 3
    params = SamplingParams(temperature=0.0, max_tokens=4)
    first = llm.generate(long_prompt, params)[0]
    second = llm.generate(long_prompt, params)[0]
    assert second.num_cached_tokens > 0
    assert second.num_cached_tokens % 4 == 0
    assert second.outputs[0].token_ids == first.outputs[0].token_ids


def test_invalid_params_name_the_field():
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=-1)
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0)


def test_prompt_that_can_never_fit_is_refused(tiny_llama):
    llm = LLM(
        model=str(tiny_llama),
        dtype="float32",
        device="cpu",
        num_blocks=64,
        block_size=4,
        max_model_len=256,
    )
    with pytest.raises(ValueError, match="(?i)prompt"):
        llm.generate([5] * 300, SamplingParams(max_tokens=4))
    # the engine is still usable afterwards
    assert llm.generate([5, 6, 7], SamplingParams(max_tokens=2, ignore_eos=True))[0].finished


def test_qwen2_architecture_through_the_engine(tiny_qwen2):
    llm = LLM(model=str(tiny_qwen2), dtype="float32", device="cpu", num_blocks=128, block_size=8)
    tok = llm.get_tokenizer()
    ids = tok.encode(PROMPTS[0])
    out = llm.generate(PROMPTS[0], SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True))[
        0
    ].outputs[0]
    expected, _ = hf_greedy(tiny_qwen2, ids, 20)
    assert out.token_ids == expected
