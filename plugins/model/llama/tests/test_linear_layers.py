"""tallow.layers linear, embedding, norm and activation layers: tensor-parallel slicing, shard
loading, the quantization seam, and the math against transformers' modules.

Tensor parallelism is checked without processes: each rank's layer is built and loaded from the
full checkpoint tensors, and the ranks' outputs are combined the way the collectives would
(concatenated for column-parallel, summed for row-parallel); the result must equal the plain
full-size computation.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tallow.layers import (
    BuildContext,
    ColumnParallelLinear,
    GeluTanhAndMul,
    LinearMethod,
    LMHead,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    ReplicatedLinear,
    RMSNorm,
    RowParallelLinear,
    SiluAndMul,
    VocabEmbedding,
    set_weight_attrs,
)

GEN = torch.Generator().manual_seed(0)


def rand(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=GEN)


def ranks(tp: int) -> list[BuildContext]:
    return [BuildContext(tp_rank=r, tp_size=tp) for r in range(tp)]


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_column_and_row_parallel_compose_to_the_full_product(tp):
    x = rand(5, 16)
    w1, b1, w2, b2 = rand(32, 16), rand(32), rand(16, 32), rand(16)
    ref = F.linear(F.linear(x, w1, b1), w2, b2)
    partial = []
    for build in ranks(tp):
        col = ColumnParallelLinear(16, 32, bias=True, build=build)
        row = RowParallelLinear(32, 16, bias=False, build=build)
        col.weight_loader(col.weight, w1)
        col.weight_loader(col.bias, b1)
        row.weight_loader(row.weight, w2)
        assert col.weight.shape == (32 // tp, 16) and row.weight.shape == (16, 32 // tp)
        partial.append(row.quant_method.apply(row, col(x)))
    torch.testing.assert_close(sum(partial) + b2, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("tp,kv_heads", [(1, 2), (2, 2), (4, 2), (4, 1)])
def test_qkv_shards_per_rank(tp, kv_heads):
    """q/k/v loaded by shard land in this rank's heads; KV heads replicate when tp > kv heads."""
    hidden, d, heads = 16, 4, 4
    wq, wk, wv = rand(heads * d, hidden), rand(kv_heads * d, hidden), rand(kv_heads * d, hidden)
    bq, bk, bv = rand(heads * d), rand(kv_heads * d), rand(kv_heads * d)
    x = rand(3, hidden)
    for build in ranks(tp):
        layer = QKVParallelLinear(hidden, d, heads, kv_heads, bias=True, build=build)
        for shard, w, b in (("q", wq, bq), ("k", wk, bk), ("v", wv, bv)):
            layer.weight_loader(layer.weight, w, shard)
            layer.weight_loader(layer.bias, b, shard)
        q, k, v = layer.split(layer(x))
        r = build.tp_rank
        hq = heads // tp
        hk = max(1, kv_heads // tp)
        kv_index = r // (tp // kv_heads) if tp > kv_heads else r
        rows_q = slice(r * hq * d, (r + 1) * hq * d)
        rows_k = slice(kv_index * hk * d, (kv_index + 1) * hk * d)
        torch.testing.assert_close(q, F.linear(x, wq[rows_q], bq[rows_q]))
        torch.testing.assert_close(k, F.linear(x, wk[rows_k], bk[rows_k]))
        torch.testing.assert_close(v, F.linear(x, wv[rows_k], bv[rows_k]))
        assert layer.weight.shard_ids == ("q", "k", "v")


def test_fused_checkpoint_tensor_loads_like_its_shards():
    hidden, d, heads, kv = 16, 4, 4, 2
    w = rand((heads + 2 * kv) * d, hidden)
    for build in ranks(2):
        by_shard = QKVParallelLinear(hidden, d, heads, kv, build=build)
        fused = QKVParallelLinear(hidden, d, heads, kv, build=build)
        q, k, v = w.split([heads * d, kv * d, kv * d])
        for shard, t in (("q", q), ("k", k), ("v", v)):
            by_shard.weight_loader(by_shard.weight, t, shard)
        fused.weight_loader(fused.weight, w)
        torch.testing.assert_close(fused.weight, by_shard.weight, rtol=0, atol=0)


@pytest.mark.parametrize("tp", [1, 2])
def test_merged_gate_up_with_silu(tp):
    x, wg, wu = rand(4, 8), rand(12, 8), rand(12, 8)
    ref = F.silu(F.linear(x, wg)) * F.linear(x, wu)
    outs = []
    for build in ranks(tp):
        layer = MergedColumnParallelLinear(8, [12, 12], build=build)
        layer.weight_loader(layer.weight, wg, 0)
        layer.weight_loader(layer.weight, wu, 1)
        outs.append(SiluAndMul()(layer(x)))
    torch.testing.assert_close(torch.cat(outs, dim=-1), ref)


def test_loader_errors_name_the_layer_and_the_shapes():
    layer = QKVParallelLinear(16, 4, 4, 2, prefix="model.layers.0.self_attn.qkv_proj")
    with pytest.raises(ValueError, match=r"qkv_proj shard 'k'.*shape \(16, 16\).*expected 8"):
        layer.weight_loader(layer.weight, rand(16, 16), "k")
    with pytest.raises(ValueError, match="unknown shard 'x'"):
        layer.weight_loader(layer.weight, rand(8, 16), "x")
    row = RowParallelLinear(8, 4, prefix="o_proj")
    with pytest.raises(ValueError, match=r"o_proj: checkpoint tensor has shape \(4, 9\)"):
        row.weight_loader(row.weight, rand(4, 9))
    rep = ReplicatedLinear(8, 4, prefix="proj")
    with pytest.raises(ValueError, match=r"proj: checkpoint tensor has shape"):
        rep.weight_loader(rep.weight, rand(3, 8))


def test_weights_are_converted_to_the_build_dtype():
    layer = ColumnParallelLinear(8, 4, build=BuildContext(dtype=torch.bfloat16))
    w = rand(4, 8)
    layer.weight_loader(layer.weight, w)
    assert layer.weight.dtype == torch.bfloat16
    torch.testing.assert_close(layer.weight.float(), w.bfloat16().float(), rtol=0, atol=0)


@pytest.mark.parametrize("tp", [1, 2, 3])
def test_vocab_parallel_embedding_and_head(tp):
    vocab, dim = 11, 6  # not a multiple of tp: the last rank is padded
    w = rand(vocab, dim)
    ids = torch.tensor([0, 3, 10, 7, 5])
    hidden = rand(2, dim)
    emb_sum, logits = 0, []
    for build in ranks(tp):
        emb = VocabEmbedding(vocab, dim, build=build)
        emb.weight_loader(emb.weight, w)
        # what the all-reduce sums: rows owned by this rank, zeros elsewhere
        mine = (ids >= emb.vocab_start) & (ids < emb.vocab_end)
        local = torch.where(mine, ids - emb.vocab_start, 0)
        emb_sum = emb_sum + F.embedding(local, emb.weight) * mine[:, None]
        head = LMHead(vocab, dim, build=build)
        head.weight_loader(head.weight, w)
        logits.append(F.linear(hidden, head.weight))
    torch.testing.assert_close(emb_sum, F.embedding(ids, w))
    torch.testing.assert_close(torch.cat(logits, -1)[:, :vocab], F.linear(hidden, w))


def test_tied_head_uses_the_embedding_weight():
    emb = VocabEmbedding(10, 4)
    head = LMHead(10, 4, tie_with=emb)
    w = rand(10, 4)
    emb.weight_loader(emb.weight, w)
    h = rand(3, 4)
    torch.testing.assert_close(head(h), h @ w.T)
    with pytest.raises(ValueError, match="cannot tie"):
        LMHead(10, 5, tie_with=emb)


def test_rmsnorm_matches_transformers_and_fuses_the_residual_add():
    pytest.importorskip("transformers", reason="transformers is the oracle")
    from transformers.models.gemma.modeling_gemma import GemmaRMSNorm
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    x, res, w = rand(5, 32), rand(5, 32), 1 + 0.3 * rand(32)
    ref = LlamaRMSNorm(32, eps=1e-5)
    ref.weight.data.copy_(w)
    ours = RMSNorm(32, 1e-5)
    ours.weight.data.copy_(w)
    torch.testing.assert_close(ours(x), ref(x))
    out, new_res = ours(x, res)
    torch.testing.assert_close(new_res, x + res)
    torch.testing.assert_close(out, ref(x + res))
    # Gemma stores weight so that the scale is 1 + weight
    gw = 0.3 * rand(32)
    gref = GemmaRMSNorm(32, eps=1e-6)
    gref.weight.data.copy_(gw)
    gemma = RMSNorm(32, 1e-6, offset=True)
    gemma.weight.data.copy_(gw)
    xb = x.bfloat16()
    torch.testing.assert_close(gemma(xb), gref.to(torch.bfloat16)(xb))
    assert torch.count_nonzero(RMSNorm(4, offset=True).weight) == 0


def test_gated_activations_match_transformers():
    pytest.importorskip("transformers", reason="transformers is the oracle")
    from transformers.activations import ACT2FN

    x = rand(3, 20)
    g, u = x[:, :10], x[:, 10:]
    torch.testing.assert_close(SiluAndMul()(x), ACT2FN["silu"](g) * u)
    torch.testing.assert_close(GeluTanhAndMul()(x), ACT2FN["gelu_pytorch_tanh"](g) * u)


@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("act", [SiluAndMul(), GeluTanhAndMul()])
def test_row_parallel_with_a_gated_input_equals_activation_then_layer(tp, act):
    """``down(gate_up, act=...)``: the merged column-parallel output goes straight into the row-
    parallel layer, which applies the activation (fused into its matmul where it can)."""
    x = rand(3, 16)
    w_gate_up, w_down, b_down = rand(2 * 32, 16), rand(16, 32), rand(16)
    ref = F.linear(act(F.linear(x, w_gate_up)), w_down, b_down)
    partial = []
    for build in ranks(tp):
        gate_up = MergedColumnParallelLinear(16, [32, 32], build=build)
        down = RowParallelLinear(32, 16, bias=True, build=build)
        gate_up.weight_loader(gate_up.weight, w_gate_up[:32], 0)
        gate_up.weight_loader(gate_up.weight, w_gate_up[32:], 1)
        down.weight_loader(down.weight, w_down)
        down.weight_loader(down.bias, b_down)
        if tp == 1:
            torch.testing.assert_close(down(gate_up(x), act=act), ref, rtol=1e-5, atol=1e-5)
        partial.append(down.quant_method.apply_gated(down, gate_up(x), act))
    torch.testing.assert_close(sum(partial) + b_down, ref, rtol=1e-5, atol=1e-5)
    unsliced = RowParallelLinear(32, 16, input_is_parallel=False, build=ranks(2)[0])
    with pytest.raises(ValueError, match="gated input must already be this rank's slice"):
        unsliced(rand(3, 64), act=act)


class Int8WeightOnly(LinearMethod):
    """A small real quantization method: int8 weights with one float scale per output row,
    quantized by its own loader as the float checkpoint tensors arrive."""

    def __init__(self) -> None:
        self.finished: list[str] = []

    def create_weights(self, layer, input_size, output_sizes, params_dtype, device):
        out = sum(output_sizes)
        weight = torch.nn.Parameter(
            torch.zeros(out, input_size, dtype=torch.int8), requires_grad=False
        )
        scale = torch.nn.Parameter(torch.zeros(out, 1), requires_grad=False)
        layer.register_parameter("weight", weight)
        layer.register_parameter("weight_scale", scale)
        set_weight_attrs(weight, output_dim=0, input_dim=1)
        set_weight_attrs(scale, output_dim=0, input_dim=None, from_checkpoint=False)

        def load(param, loaded, shard_id=None):
            # slice through the layer's own loader into a float staging copy, then requantize
            # (rows loaded earlier round-trip exactly: their scale does not change)
            staging = torch.nn.Parameter(
                layer.weight.float() * layer.weight_scale, requires_grad=False
            )
            set_weight_attrs(staging, output_dim=0, input_dim=1)
            if shard_id is None:
                layer.weight_loader(staging, loaded)
            else:
                layer.weight_loader(staging, loaded, shard_id)
            s = staging.abs().amax(dim=1, keepdim=True).clamp(min=1e-8) / 127
            layer.weight.data.copy_(torch.round(staging / s).to(torch.int8))
            layer.weight_scale.data.copy_(s)

        weight.weight_loader = load

    def apply(self, layer, x, bias=None):
        return F.linear(x, layer.weight.float() * layer.weight_scale, bias)

    def process_weights_after_loading(self, layer):
        self.finished.append(layer.prefix)


class Int8Scheme:
    """A QuantScheme-like object: quantizes every linear layer but the attention output."""

    def __init__(self) -> None:
        self.methods: list[Int8WeightOnly] = []

    def linear_method(self, prefix: str):
        if prefix.endswith("o_proj"):
            return None
        method = Int8WeightOnly()
        self.methods.append(method)
        return method


def test_quant_scheme_supplies_the_linear_method(tmp_path, kit):
    transformers = pytest.importorskip("transformers", reason="transformers is the oracle")
    from tallow.layers import ArchConfig
    from tallow_format_safetensors.format import SafetensorsFormat

    from tallow_model_llama.model import LlamaForCausalLM

    config = transformers.LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=256,
    )
    hf = kit.build_hf(config, tmp_path)
    ckpt = SafetensorsFormat().load(str(tmp_path))
    scheme = Int8Scheme()
    model = LlamaForCausalLM(ArchConfig(ckpt.config), BuildContext(quant=scheme))
    attn = model.model.layers[0].self_attn
    assert isinstance(attn.qkv_proj.quant_method, Int8WeightOnly)
    assert attn.qkv_proj.weight.dtype == torch.int8
    assert type(attn.o_proj.quant_method).__name__ == "UnquantizedLinearMethod"
    model.load_weights(ckpt.tensors())
    assert sorted(p for m in scheme.methods for p in m.finished) == sorted(
        f"model.layers.{i}.{n}"
        for i in range(2)
        for n in ("self_attn.qkv_proj", "mlp.gate_up_proj", "mlp.down_proj")
    )
    logits = kit.PagedRunner(model).greedy(0, [1, 2, 3, 4, 5, 6], 0)[2]
    with torch.no_grad():
        ref = hf(torch.tensor([[1, 2, 3, 4, 5, 6]])).logits[0]
    err = float((logits - ref).abs().max())
    # int8 rounding moves the logits a little, never a lot
    assert 0 < err < 0.05 * float(ref.abs().max())
