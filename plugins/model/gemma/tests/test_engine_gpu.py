"""Gemma 3 4B's shape (``random:gemma-3-4b``, bfloat16) through the engine on a GPU: the
Triton attention backend with CUDA graphs, against transformers on the same weights and
against the torch reference backend, with prompts longer than the 1024-token window."""

from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.gpu_alone]
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from tallow import LLM, SamplingParams  # noqa: E402

SHAPE = "random:gemma-3-4b"
LENGTHS = [1500, 9, 300]  # the first outruns the window


def _llm(**kw) -> LLM:
    return LLM(
        model=SHAPE, dtype="bfloat16", device="cuda", max_model_len=4096, num_blocks=1024, **kw
    )


def _prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(0)
    return [torch.randint(10, 260000, (n,), generator=g).tolist() for n in LENGTHS]


def _forced_logprobs(llm: LLM, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    """Our log-probs of ``tokens`` after ``prompt``, teacher-forced."""
    out = llm.generate(
        [prompt + tokens], SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=1)
    )[0]
    return torch.tensor(
        [out.prompt_logprobs[len(prompt) + i][t].logprob for i, t in enumerate(tokens)]
    )


@pytest.fixture(scope="module")
def fast() -> LLM:
    return _llm()


def test_runs_on_triton_with_cuda_graphs(fast):
    parts = fast.engine.parts
    assert parts.attention_backend == "triton"
    assert fast.engine.core.runner.graphs is not None
    windows = {
        layer.self_attn.attn.layer.sliding_window for layer in parts.loaded.model.model.layers
    }
    assert windows == {1024, None}


@torch.inference_mode()
def test_parity_with_transformers_bf16(fast):
    from tallow.bench.hf_compare import hf_model_like

    hf = hf_model_like(fast.engine.parts)  # the engine now holds transformers' weights
    for prompt in _prompts():
        ids = torch.tensor([prompt], device="cuda")
        ref = hf.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=12,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
            pad_token_id=0,
        )
        tokens = ref.sequences[0, len(prompt) :].tolist()
        lp = torch.stack([torch.log_softmax(x[0].float(), -1) for x in ref.logits]).cpu()
        theirs = lp[torch.arange(len(tokens)), torch.tensor(tokens)]
        ours = _forced_logprobs(fast, prompt, tokens)
        assert torch.allclose(ours, theirs, atol=0.08), (len(prompt), (ours - theirs).abs().max())
    del hf
    torch.cuda.empty_cache()


def test_triton_matches_the_torch_reference(fast):
    ref = _llm(attention_backend="torch", disable_cuda_graph=True)
    ref.engine.parts.loaded.model.load_state_dict(fast.engine.parts.loaded.model.state_dict())
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    for prompt, out in zip(_prompts(), ref.generate(_prompts(), params)):
        tokens = out.outputs[0].token_ids
        a, b = _forced_logprobs(fast, prompt, tokens), _forced_logprobs(ref, prompt, tokens)
        assert torch.allclose(a, b, atol=0.08), (len(prompt), (a - b).abs().max())
