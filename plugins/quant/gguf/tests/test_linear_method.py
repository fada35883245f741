"""The ``gguf`` scheme's LinearMethod on CPU: a Llama GGUF file of mixed block types (merged
layers whose parts differ, llama.cpp's Q/K row interleaving, quantized embedding and head, a
tied head) computes exactly what the dequantize-at-load path computes; tensor-parallel shards
hold whole rows and whole blocks; bad input is refused clearly."""

from __future__ import annotations

import pytest
import torch

pytest_plugins = ["tallow.plugin.testing"]

from quant_blocks import random_blocks  # noqa: E402
from quant_engine_runs import engine, greedy  # noqa: E402
from quant_gguf_files import HIDDEN, VOCAB, write_llama_gguf  # noqa: E402
from tallow.layers import (  # noqa: E402
    ArchConfig,
    BuildContext,
    QKVParallelLinear,
    QuantizedWeight,
    RowParallelLinear,
    VocabEmbedding,
)
from tallow_quant_gguf import plugin  # noqa: E402
from tallow_quant_gguf.method import GGUFLinearMethod  # noqa: E402
from tallow_quant_gguf.packing import pack  # noqa: E402
from tallow_quant_gguf.qtypes import QUANT_TYPES  # noqa: E402
from tallow_quant_gguf.reference import dequantize_ref  # noqa: E402
from tallow_quant_gguf.scheme import GGUFQuantScheme, KernelPolicy  # noqa: E402


def _models(path, arch_cls):
    from tallow_format_gguf.format import GGUFFormat

    checkpoint = GGUFFormat().load(str(path))
    config = ArchConfig(
        arch_cls.config_from_gguf(checkpoint.extra["gguf_metadata"], dict(checkpoint.config))
    )
    dense = arch_cls(config, BuildContext())
    dense.load_weights(checkpoint.tensors(), naming="gguf")
    scheme = GGUFQuantScheme()
    quantized = arch_cls(config, BuildContext(quant=scheme))
    quantized.load_weights(checkpoint.tensors(), naming="gguf")
    return dense.eval(), quantized.eval(), scheme


@pytest.fixture(scope="module")
def llama_file(tmp_path_factory):
    return write_llama_gguf(tmp_path_factory.mktemp("q") / "mixed-llama.gguf")


@torch.no_grad()
def test_every_layer_equals_the_dequantized_model(llama_file):
    from tallow_model_llama.model import LlamaForCausalLM

    dense, quantized, scheme = _models(llama_file, LlamaForCausalLM)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, HIDDEN, generator=g)
    for d_layer, q_layer in zip(dense.model.layers, quantized.model.layers):
        for name in ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj"):
            d_mod, q_mod = d_layer.get_submodule(name), q_layer.get_submodule(name)
            assert isinstance(q_mod.quant_method, GGUFLinearMethod), name
            inp = torch.randn(5, q_mod.input_size, generator=g)
            assert torch.equal(q_mod(inp), d_mod(inp)), name
        gate_up = torch.randn(5, 2 * d_layer.mlp.down_proj.input_size, generator=g)
        act = d_layer.mlp.act_fn
        assert torch.equal(
            q_layer.mlp.down_proj(gate_up, act=act), d_layer.mlp.down_proj(gate_up, act=act)
        )
    ids = torch.tensor([0, 5, VOCAB - 1, 5])
    assert torch.equal(quantized.model.embed_tokens(ids), dense.model.embed_tokens(ids))
    assert torch.equal(quantized.compute_logits(x), dense.compute_logits(x))
    # the file's own types, stacked where neighbours share one
    types = lambda m: [p.type_name for p in m.quant_method.parts]  # noqa: E731
    layer0, layer1 = quantized.model.layers
    assert types(layer0.self_attn.qkv_proj) == ["Q4_K", "Q6_K", "Q8_0"]
    assert types(layer1.self_attn.qkv_proj) == ["IQ4_XS", "Q5_1"]  # q and k stacked
    assert types(layer0.mlp.gate_up_proj) == ["Q4_0"]
    assert types(layer1.mlp.gate_up_proj) == ["Q4_1", "IQ4_NL"]
    assert types(quantized.model.embed_tokens) == ["Q8_0"] and types(quantized.lm_head) == ["Q6_K"]
    assert "Q2_K x1" in scheme.summary()


@torch.no_grad()
def test_a_tied_head_multiplies_by_the_quantized_embedding(tmp_path):
    from tallow_model_llama.model import Qwen2ForCausalLM

    layers = [
        {
            "attn_q": "Q8_0",
            "attn_k": "Q8_0",
            "attn_v": "Q8_0",
            "attn_output": "Q4_K",
            "ffn_gate": "Q6_K",
            "ffn_up": "Q6_K",
            "ffn_down": "Q5_K",
        }
    ]
    path = write_llama_gguf(
        tmp_path / "tied.gguf",
        arch="qwen2",
        layer_types=layers,
        embed_type="Q4_K",
        head_type=None,
        seed=3,
    )
    dense, quantized, _ = _models(path, Qwen2ForCausalLM)
    assert quantized.lm_head.tied and quantized.lm_head.quant_method is None
    x = torch.randn(3, HIDDEN, generator=torch.Generator().manual_seed(1))
    assert torch.equal(quantized.compute_logits(x), dense.compute_logits(x))


def test_greedy_tokens_through_the_engine_equal_the_dequantized_model(llama_file):
    prompts = [[3, 17, 250, 9, 64], [128, 5, 77, 31, 200, 1, 42]]
    quantized = engine(str(llama_file), keep_quantized_on_cpu=True)
    dense = engine(str(llama_file), disable=("tallow-quant-gguf",))
    assert quantized.parts.loaded.quant is not None and dense.parts.loaded.quant is None
    assert greedy(quantized, prompts, 10) == greedy(dense, prompts, 10)
    assert quantized.parts.loaded.weight_bytes < 0.3 * dense.parts.loaded.weight_bytes


def test_on_a_cpu_a_gguf_file_is_dequantized_unless_asked(llama_file, caplog):
    import logging

    caplog.set_level(logging.INFO, logger="tallow.engine")
    assert engine(str(llama_file), max_model_len=64, num_blocks=8).parts.loaded.quant is None
    assert (
        "quant scheme 'gguf' (from tallow-quant-gguf) cannot serve (on a CPU it decodes "
        "every weight on every call" in caplog.text
    )
    assert "dequantizing them at load" in caplog.text


def _qweight(qtype: str, rows: int, cols: int, seed: int = 0) -> QuantizedWeight:
    from tallow_format_gguf.dequant import dequantize_blocks

    qt = QUANT_TYPES[qtype]
    blocks = torch.from_numpy(
        random_blocks(qtype, rows, cols // qt.block, seed=seed, extremes=False)
    )
    return QuantizedWeight("gguf", qtype, (rows, cols), blocks, dequantize_blocks)


def _held(layer) -> torch.Tensor:
    method = layer.quant_method
    method.process_weights_after_loading(layer)
    return torch.cat([dequantize_ref(p) for p in method.parts])


def test_tensor_parallel_shards_are_whole_rows_and_whole_blocks():
    scheme = GGUFQuantScheme()
    # rank 1 of 2; one KV head, so both ranks hold the same (replicated) k and v rows
    build = BuildContext(quant=scheme, tp_rank=1, tp_size=2)
    qkv = QKVParallelLinear(256, 16, 4, 1, build=build, prefix="qkv")
    full = {
        s: _qweight(t, rows, 256, seed=i)
        for i, (s, t, rows) in enumerate([("q", "Q4_K", 64), ("k", "Q8_0", 16), ("v", "Q6_K", 16)])
    }
    for shard, w in full.items():
        qkv.weight.weight_loader(qkv.weight, w, shard)
    expected = torch.cat(
        [full["q"].dequantize()[32:64], full["k"].dequantize(), full["v"].dequantize()]
    )
    assert torch.equal(_held(qkv), expected)

    row = RowParallelLinear(512, 32, build=build, prefix="down")
    w = _qweight("Q4_K", 32, 512, seed=5)
    row.weight.weight_loader(row.weight, w)
    assert torch.equal(_held(row), w.dequantize()[:, 256:512])  # the second super-block

    emb = VocabEmbedding(9, 64, build=build, prefix="embed")  # 5 rows per rank, 4 real ones
    w = _qweight("Q5_0", 9, 64, seed=6)
    emb.weight.weight_loader(emb.weight, w)
    held = _held(emb)
    assert held.shape == (5, 64) and torch.equal(held[:4], w.dequantize()[5:9])
    assert torch.count_nonzero(held[4]) == 0


def test_bad_checkpoint_tensors_are_refused_clearly():
    build = BuildContext(quant=GGUFQuantScheme(), tp_rank=1, tp_size=2)
    row = RowParallelLinear(768, 32, build=build, prefix="model.layers.0.mlp.down_proj")
    with pytest.raises(
        ValueError, match="columns 384:768 do not fall on 256-element block boundaries of Q4_K"
    ):
        row.weight.weight_loader(row.weight, _qweight("Q4_K", 32, 768))
    row = RowParallelLinear(512, 32, build=build, prefix="model.layers.0.mlp.down_proj")
    with pytest.raises(
        ValueError,
        match=r"down_proj: checkpoint tensor has shape \(32, 256\), "
        r"expected \(32, 512\)",
    ):
        row.weight.weight_loader(row.weight, _qweight("Q4_K", 32, 256))
    qkv = QKVParallelLinear(64, 16, 4, 2, prefix="qkv", build=BuildContext(quant=GGUFQuantScheme()))
    qkv.weight.weight_loader(qkv.weight, _qweight("Q8_0", 64, 64), "q")
    with pytest.raises(ValueError, match="partition 0 is loaded twice"):
        qkv.weight.weight_loader(qkv.weight, _qweight("Q8_0", 64, 64), "q")
    with pytest.raises(ValueError, match=r"partition\(s\) \[1, 2\] were never loaded"):
        qkv.quant_method.process_weights_after_loading(qkv)


def test_a_type_without_kernels_stays_dense():
    qkv = QKVParallelLinear(64, 16, 2, 2, prefix="qkv", build=BuildContext(quant=GGUFQuantScheme()))
    decoded = torch.randn(32, 64)
    other = QuantizedWeight(
        "gguf",
        "TQ2_0",
        (32, 64),
        torch.zeros(32, 16, dtype=torch.uint8),
        lambda data, qtype, shape: decoded,
    )
    for shard in "qkv":
        qkv.weight.weight_loader(qkv.weight, other, shard)
    assert torch.equal(_held(qkv), torch.cat([decoded] * 3))
    assert [p.type_name for p in qkv.quant_method.parts] == ["float32"]


def test_registration_is_lazy_and_light(tallow_plugin_manager):
    from tallow.plugin.testing import modules_imported_by_registration

    status = tallow_plugin_manager.add_plugin(plugin, "tallow-quant-gguf", "0.1.0")
    assert status.status == "ok", status.reason
    entry = tallow_plugin_manager.registries.quant_schemes.entry("gguf")
    assert entry.lazy and entry.load() is GGUFQuantScheme
    assert (
        modules_imported_by_registration(
            "tallow_quant_gguf.plugin",
            "tallow_register_quant_schemes",
            "QuantSchemeRegistry",
            watch=("torch", "triton"),
        )
        == []
    )


def test_settings_are_validated_with_their_key():
    from tallow.plugin.testing import make_config

    def scheme(settings):
        return GGUFQuantScheme(
            make_config({"plugins": {"settings": {"tallow-quant-gguf": settings}}})
        )

    assert scheme({"matmul": "dequant", "dequant_min_rows": 8}).policy == KernelPolicy("dequant", 8)
    with pytest.raises(ValueError, match=r"tallow-quant-gguf\.matmul: expected one of auto"):
        scheme({"matmul": "fast"})
    with pytest.raises(ValueError, match="unknown setting.*gemv_rows"):
        scheme({"gemv_rows": 4})
    with pytest.raises(ValueError, match="dequant_min_rows: expected a non-negative integer"):
        scheme({"dequant_min_rows": -1})
    with pytest.raises(ValueError, match="tuned_table: tuned table .*nowhere.json: cannot read"):
        scheme({"tuned_table": "/nowhere.json"})
    assert scheme({"moe_decode_max_tokens": 0}).policy.moe_decode_max_tokens == 0
    with pytest.raises(ValueError, match="moe_decode_max_tokens: expected a non-negative"):
        scheme({"moe_decode_max_tokens": True})


def test_isq_types_with_llama_cpp_shape_fallbacks():
    from tallow_quant_gguf.isq import quantize_rows

    def stored(isq: str, cols: int) -> str:
        return quantize_rows(
            torch.randn(2, cols), isq, torch.device("cpu"), torch.float32
        ).type_name

    assert stored("q4_k", 512) == "Q4_K"
    assert stored("q4_k", 896) == "Q5_0"  # 896 is not whole 256-element super-blocks
    assert stored("q6_k", 896) == "Q8_0"
    assert stored("q3_k", 896) == "Q4_0"
    assert stored("q4_0", 100) == "float32"  # not even 32-element blocks: stays dense
    with pytest.raises(ValueError, match="expected a 2-d float weight"):
        quantize_rows(torch.zeros(4, dtype=torch.int32), "q4_0", torch.device("cpu"), torch.float32)


def test_planes_live_on_the_layer_as_buffers():
    qkv = QKVParallelLinear(64, 16, 2, 2, prefix="qkv", build=BuildContext(quant=GGUFQuantScheme()))
    for shard in "qkv":
        qkv.weight.weight_loader(qkv.weight, _qweight("Q8_0", 32, 64), shard)
    qkv.quant_method.process_weights_after_loading(qkv)
    names = {n for n, _ in qkv.named_buffers()}
    assert names == {"weight_0_d", "weight_0_byte"}
    assert (
        sum(b.nbytes for b in qkv.buffers()) == pack(_qweight("Q8_0", 96, 64).data, "Q8_0").nbytes
    )
