"""Loading and registration of the GPT-NeoX plugin: the per-head qkv layout, checkpoint
names, config errors, and a registration that imports no torch."""

from __future__ import annotations

from importlib.metadata import entry_points

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers writes the checkpoints")

from tallow.layers import ArchConfig, BuildContext, WeightLoadError  # noqa: E402
from tallow.plugin import ArchitectureRegistry  # noqa: E402
from tallow.plugin.testing import modules_imported_by_registration  # noqa: E402

from tallow_model_gptneox import plugin  # noqa: E402
from tallow_model_gptneox.model import GPTNeoXForCausalLM  # noqa: E402

CONFIG = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    vocab_size=64,
    rotary_pct=0.5,
)


@pytest.fixture
def neox_state():
    torch.manual_seed(0)
    config = transformers.GPTNeoXConfig(**CONFIG)
    hf = transformers.AutoModelForCausalLM.from_config(config)
    return config.to_dict(), {k: v.clone() for k, v in hf.state_dict().items()}


def fresh(config: dict, **build) -> GPTNeoXForCausalLM:
    return GPTNeoXForCausalLM(ArchConfig(config), BuildContext(**build))


def test_query_key_value_rows_are_regrouped_from_per_head_to_per_projection(neox_state):
    config, state = neox_state
    heads, head_dim, hidden = 4, 8, 32
    # row r of the checkpoint tensor holds the value r: head h, part p (q, k, v), feature f
    # sits at row (h * 3 + p) * head_dim + f
    state["gpt_neox.layers.0.attention.query_key_value.weight"] = torch.arange(
        3 * hidden, dtype=torch.float32
    )[:, None].expand(3 * hidden, hidden)
    model = fresh(config)
    model.load_weights(state.items())
    rows = model.gpt_neox.layers[0].attention.query_key_value.weight[:, 0]
    for part in range(3):
        for h in range(heads):
            got = rows[(part * heads + h) * head_dim : (part * heads + h + 1) * head_dim]
            start = (h * 3 + part) * head_dim
            assert got.tolist() == list(range(start, start + head_dim)), (part, h)


def test_tensor_parallel_ranks_take_their_own_heads(neox_state):
    config, state = neox_state
    whole = fresh(config)
    whole.load_weights(state.items())
    full = whole.gpt_neox.layers[1].attention.query_key_value.weight
    q, k, v = full.split(32)
    for rank in range(2):
        part = fresh(config, tp_rank=rank, tp_size=2)
        part.load_weights(state.items())
        attn = part.gpt_neox.layers[1].attention
        assert (attn.attn.layer.num_heads, attn.attn.layer.num_kv_heads) == (2, 2)
        mine = slice(rank * 16, (rank + 1) * 16)
        torch.testing.assert_close(
            attn.query_key_value.weight, torch.cat([q[mine], k[mine], v[mine]]), rtol=0, atol=0
        )


def test_pythia_head_name_and_old_buffers_load(neox_state):
    config, state = neox_state
    state["embed_out.weight"] = state.pop("lm_head.weight")
    state["gpt_neox.layers.0.attention.masked_bias"] = torch.tensor(-1e9)
    state["gpt_neox.layers.0.attention.rotary_emb.inv_freq"] = torch.ones(4)
    model = fresh(config)
    model.load_weights(state.items())
    torch.testing.assert_close(model.lm_head.weight, state["embed_out.weight"], rtol=0, atol=0)


def test_missing_and_unexpected_tensors_are_listed(neox_state):
    config, state = neox_state
    del state["gpt_neox.layers.1.post_attention_layernorm.bias"]
    state["gpt_neox.layers.0.mlp.gate_proj.weight"] = torch.zeros(1)
    with pytest.raises(WeightLoadError) as err:
        fresh(config).load_weights(state.items())
    msg = str(err.value)
    assert "missing parameters (1): gpt_neox.layers.1.post_attention_layernorm.bias" in msg
    assert "unexpected checkpoint tensors (1): gpt_neox.layers.0.mlp.gate_proj.weight" in msg


def test_a_misshaped_query_key_value_is_named(neox_state):
    config, state = neox_state
    state["gpt_neox.layers.0.attention.query_key_value.weight"] = torch.zeros(95, 32)
    with pytest.raises(ValueError, match="95 rows do not split into q, k and v of 4 heads"):
        fresh(config).load_weights(state.items())


@pytest.mark.parametrize(
    "drop,match",
    [
        ("intermediate_size", "'intermediate_size' is required"),
        ("vocab_size", "'vocab_size' is required"),
    ],
)
def test_missing_config_field_is_named(drop, match):
    with pytest.raises(ValueError, match=match):
        fresh({k: v for k, v in CONFIG.items() if k != drop})


def test_heads_must_divide_the_hidden_size():
    with pytest.raises(
        ValueError, match="hidden_size 32 is not a multiple of num_attention_heads 5"
    ):
        fresh(dict(CONFIG, num_attention_heads=5))


def test_rotary_fraction_defaults_to_a_quarter_like_transformers():
    config = {k: v for k, v in CONFIG.items() if k != "rotary_pct"}
    assert fresh(config).gpt_neox.rotary_emb.rotary_dim == 2  # head_dim 8 * 0.25
    assert fresh(dict(config, partial_rotary_factor=1.0)).gpt_neox.rotary_emb.rotary_dim == 8


def test_registration_is_lazy():
    eps = {ep.name: ep.value for ep in entry_points(group="tallow")}
    assert eps["tallow-model-gptneox"] == "tallow_model_gptneox.plugin"
    registry = ArchitectureRegistry()
    plugin.tallow_register_architectures(registry)
    assert [e.name for e in registry] == ["GPTNeoXForCausalLM", "StableLmForCausalLM"]
    assert all(e.lazy for e in registry)
    assert registry.get("GPTNeoXForCausalLM") is GPTNeoXForCausalLM
    from tallow_model_gptneox.stablelm import StableLmForCausalLM

    assert registry.get("StableLmForCausalLM") is StableLmForCausalLM


def test_registration_imports_no_torch():
    assert (
        modules_imported_by_registration(
            "tallow_model_gptneox.plugin", "tallow_register_architectures", "ArchitectureRegistry"
        )
        == []
    )
