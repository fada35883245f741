"""Qwen3-Next through the whole engine on the CPU (the runner's state slots, the scheduler, the
cache manager), against transformers on the same tiny random weights: prompts prefilled in
several chunks, sequences preempted and recomputed, the ``random:`` shape, and a property test
that state slots stay balanced under random admissions, aborts and preemptions."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers", reason="transformers is the parity oracle")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from tallow import SamplingParams  # noqa: E402
from tallow.plugin.testing.engine import offline_llm  # noqa: E402
from tallow.plugin.testing.model import hf_greedy, random_hf_model  # noqa: E402
from tallow.plugin.testing.tokenizer import save_tokenizer  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from tiny_config import TINY  # noqa: E402

PLUGINS = ["tallow-model-qwen3-next", "tallow-format-safetensors"]
STEPS = 32
EOS = 2  # tallow.plugin.testing's tiny tokenizer's </s>
SHORT = 12  # tokens per request of the property test
PROMPTS = [
    [(37 * i + 11) % 128 for i in range(30)],
    [5, 9, 2],
    list(range(60, 83)),
    [77] * 9 + [3, 4],
]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """(transformers' model, the directory it is saved in with a tiny tokenizer)."""
    pytest.importorskip(
        "tallow_format_safetensors", reason="the saved model is read by tallow-format-safetensors"
    )
    hf = random_hf_model(transformers.Qwen3NextConfig(**TINY), seed=11)
    path = tmp_path_factory.mktemp("qwen3next")
    hf.save_pretrained(str(path), safe_serialization=True)
    save_tokenizer(path)
    return hf, path


@pytest.fixture(scope="module")
def expected(saved):
    tokens = [hf_greedy(saved[0], p, STEPS)[0] for p in PROMPTS]
    # no ignore_eos below (it would reserve every block at admission: no preemption), so
    # the prompts are ones whose greedy tokens never reach the tokenizer's EOS (id 2)
    assert not any(EOS in t for t in tokens)
    return tokens


def engine(path, **scheduler):
    cfg = {
        "model": {"dtype": "float32", "max_model_len": 64},
        "cache": {"num_blocks": scheduler.pop("num_blocks", 64), "block_size": 4},
        "scheduler": scheduler,
    }
    return offline_llm(str(path), plugins=PLUGINS, config=cfg)


def greedy(steps: int = STEPS) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=steps)


def assert_slots_free(llm) -> None:
    manager = llm.engine.core.scheduler.block_manager
    manager.check_invariants()
    assert manager.states, "the engine keeps no state group for the model"
    assert manager.num_free_state_slots() == manager.states[0].num_slots
    assert manager.num_free_blocks == manager.num_total_blocks


@pytest.mark.parametrize("budget", [5, 16], ids=["chunks-of-5", "chunks-of-16"])
def test_prompts_prefilled_in_chunks(saved, expected, budget):
    """A step budget smaller than the prompts: each is prefilled over several steps, beside
    the others' chunks and decodes, the state carried in its slot between them."""
    llm = engine(saved[1], max_num_batched_tokens=budget, prefill_chunk_size=budget)
    outs = llm.generate([list(p) for p in PROMPTS], greedy())
    assert [list(o.outputs[0].token_ids) for o in outs] == expected
    assert_slots_free(llm)


def test_preempted_sequences_are_recomputed(saved, expected):
    """Too few KV blocks for every sequence at once: some are preempted (their slot given
    back), then recomputed from the first token into a zeroed slot; the tokens do not
    change."""
    llm = engine(saved[1], num_blocks=20, max_num_batched_tokens=16, max_num_seqs=4)
    outs = llm.generate([list(p) for p in PROMPTS], greedy())
    assert llm.engine.core.scheduler.num_preemptions > 0, "nothing was preempted"
    assert [list(o.outputs[0].token_ids) for o in outs] == expected
    assert_slots_free(llm)


def test_prefix_caching_is_refused_with_a_reason(saved, caplog):
    with caplog.at_level(logging.WARNING, logger="tallow.engine"):
        llm = engine(saved[1])
    assert not llm.engine.core.scheduler.block_manager.enable_prefix_caching
    assert "recurrent state" in caplog.text


@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_state_slots_balanced_under_random_admission_abort_preemption(saved, expected, data):
    """Requests arrive at random steps, some are aborted at random, few KV blocks force
    preemptions: every finished request has transformers' tokens, every aborted one a prefix
    of them, and at the end every state slot and block is free."""
    budget = data.draw(st.sampled_from([4, 7, 16]), label="step budget")
    llm = engine(
        saved[1],
        num_blocks=data.draw(st.integers(16, 32), label="blocks"),
        max_num_batched_tokens=budget,
        prefill_chunk_size=budget,
        max_num_seqs=data.draw(st.integers(1, 3), label="max seqs"),
    )
    core = llm.engine.core
    order = data.draw(st.permutations(range(len(PROMPTS))), label="arrival order")
    arrive = {i: data.draw(st.integers(0, 12), label=f"arrival step of {i}") for i in order}
    abort_at = {
        i: data.draw(
            st.one_of(st.none(), st.integers(0, SHORT - 1)), label=f"abort {i} after tokens"
        )
        for i in order
    }
    got: dict[str, list[int]] = {}
    aborted: set[str] = set()
    step = 0
    while len(got) < len(order) or core.has_unfinished():
        for i in order:
            rid = f"r{i}"
            if rid not in got and arrive[i] <= step:
                core.add_request(rid, list(PROMPTS[i]), greedy(SHORT))
                got[rid] = []
        if core.has_unfinished():
            for update in core.step().updates:
                got[update.request_id].append(update.token.token_id)
        for i in order:
            rid = f"r{i}"
            limit = abort_at[i]
            if rid in got and limit is not None and len(got[rid]) >= limit:
                core.abort(rid)
                aborted.add(rid)
                abort_at[i] = None
        step += 1
        assert step < 2000, "the engine stopped making progress"
    for i in order:
        tokens = got[f"r{i}"]
        assert tokens == expected[i][: len(tokens)], f"request {i}"
        if f"r{i}" not in aborted:
            assert len(tokens) == SHORT, f"request {i} stopped early"
    assert_slots_free(llm)


def test_engine_runs_the_random_shape():
    """``random:tiny-qwen3-next`` builds, fills and generates through the engine."""
    from tallow import LLM

    llm = LLM(
        model="random:tiny-qwen3-next",
        device="cpu",
        dtype="float32",
        num_blocks=32,
        max_model_len=256,
    )
    assert type(llm.engine.core.runner.model).__name__ == "Qwen3NextForCausalLM"
    assert len(llm.engine.core.runner.state_groups) == 1
    outs = llm.generate(
        [[1, 2, 3, 4, 5], list(range(40, 80))],
        SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True),
    )
    assert [len(o.outputs[0].token_ids) for o in outs] == [8, 8]
