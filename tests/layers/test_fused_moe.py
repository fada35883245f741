"""tallow.layers.FusedMoE: each router variant and the whole block against plain per-token
torch, loading from per-expert and stacked checkpoint tensors, the tensor-parallel split
(two ranks' partial outputs sum to the single-device output) and the expert-parallel
placement (whole experts per rank)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tallow.layers import (
    BuildContext,
    FusedMoE,
    RouterSpec,
    WeightNameMap,
    WeightRule,
    select_experts,
)

E, H, INTER, SHARED = 8, 24, 16, 20


def _per_token_router(
    logits: torch.Tensor, spec: RouterSpec, bias: torch.Tensor | None = None
) -> list[dict[int, float]]:
    """Each token's {expert: weight}, computed one token at a time from the definitions."""
    out = []
    for row in logits.float():
        if spec.scoring == "softmax_selected":
            top = sorted(range(len(row)), key=lambda e: -float(row[e]))[: spec.top_k]
            w = torch.softmax(row[top], 0)
            chosen = dict(zip(top, w.tolist()))
        else:
            scores = row.softmax(0) if spec.scoring == "softmax" else row.sigmoid()
            choice = scores + (bias if bias is not None else 0)
            allowed = list(range(len(row)))
            if spec.num_groups > 1:
                size = len(row) // spec.num_groups
                groups = [list(range(g * size, (g + 1) * size)) for g in range(spec.num_groups)]
                per_group = 1 if spec.group_score == "max" else 2
                best = sorted(
                    groups,
                    key=lambda g: (
                        -sum(sorted((float(choice[e]) for e in g), reverse=True)[:per_group])
                    ),
                )
                allowed = [e for g in best[: spec.topk_groups] for e in g]
            top = sorted(allowed, key=lambda e: -float(choice[e]))[: spec.top_k]
            chosen = {e: float(scores[e]) for e in top}
            if spec.renormalize:
                total = sum(chosen.values())
                chosen = {e: w / total for e, w in chosen.items()}
        out.append({e: w * spec.routed_scaling_factor for e, w in chosen.items()})
    return out


ROUTERS = {
    "softmax": (RouterSpec(top_k=2), False),
    "softmax-renormalized": (RouterSpec(top_k=3, renormalize=True), False),
    "sigmoid-bias-grouped": (
        RouterSpec(
            top_k=2,
            scoring="sigmoid",
            renormalize=True,
            num_groups=4,
            topk_groups=2,
            routed_scaling_factor=2.5,
        ),
        True,
    ),
    "sigmoid-ungrouped": (RouterSpec(top_k=4, scoring="sigmoid"), True),
    # DeepSeek-V2's group-limited greedy routing: softmax, groups by their best expert
    "softmax-grouped-max": (
        RouterSpec(
            top_k=3, num_groups=4, topk_groups=2, routed_scaling_factor=1.5, group_score="max"
        ),
        False,
    ),
    "softmax-selected": (RouterSpec(top_k=4, scoring="softmax_selected"), False),
    "scaled": (RouterSpec(top_k=1, routed_scaling_factor=0.5), False),
}


@pytest.mark.parametrize("name", list(ROUTERS))
def test_router_variants(name):
    spec, with_bias = ROUTERS[name]
    g = torch.Generator().manual_seed(len(name))
    logits = torch.randn(12, E, generator=g) * 2
    bias = torch.randn(E, generator=g) * 0.3 if with_bias else None
    weights, ids = select_experts(logits, spec, bias)
    assert ids.dtype == torch.int64 and weights.dtype == torch.float32
    got = [dict(zip(i.tolist(), w.tolist())) for i, w in zip(ids, weights)]
    expected = _per_token_router(logits, spec, bias)
    for token, (ours, ref) in enumerate(zip(got, expected)):
        assert ours.keys() == ref.keys(), f"token {token}: experts {ours} != {ref}"
        for e in ref:
            assert ours[e] == pytest.approx(ref[e], rel=1e-5), f"token {token}, expert {e}"


def test_grouped_topk_keeps_to_the_best_groups():
    """With the other groups' experts far better alone, the grouped choice still stays inside
    the two groups whose two best experts sum highest."""
    spec = RouterSpec(top_k=2, scoring="sigmoid", num_groups=4, topk_groups=1)
    logits = torch.full((1, E), -5.0)
    logits[0, 0] = 5.0  # group 0: one very good expert...
    logits[0, 2:4] = 3.0  # group 1: two good ones, a better pair
    _, ids = select_experts(logits, spec)
    assert sorted(ids[0].tolist()) == [2, 3]


def test_group_score_max_takes_the_group_of_the_best_single_expert():
    """``group_score="max"`` (DeepSeek-V2) keeps the group of the one very good expert that
    the top-two sum (DeepSeek-V3) passes over; an unknown score is refused."""
    logits = torch.full((1, E), -5.0)
    logits[0, 0] = 5.0
    logits[0, 2:4] = 3.0
    _, ids = select_experts(
        logits, RouterSpec(top_k=2, num_groups=4, topk_groups=1, group_score="max")
    )
    assert sorted(ids[0].tolist()) == [0, 1]
    with pytest.raises(ValueError, match="group_score must be 'top2_sum' or 'max'"):
        RouterSpec(top_k=2, group_score="mean")


def _layer(build: BuildContext | None = None, **kw) -> FusedMoE:
    return FusedMoE(
        E,
        H,
        INTER,
        router=kw.pop("router", RouterSpec(top_k=2, renormalize=True)),
        build=build or BuildContext(),
        prefix="mlp",
        **kw,
    )


def _checkpoint(g: torch.Generator, *, shared: bool, bias: bool) -> dict[str, torch.Tensor]:
    t = {"mlp.gate.weight": torch.randn(E, H, generator=g) * 0.5}
    for e in range(E):
        for name, shape in (
            ("gate_proj", (INTER, H)),
            ("up_proj", (INTER, H)),
            ("down_proj", (H, INTER)),
        ):
            t[f"mlp.experts.{e}.{name}.weight"] = torch.randn(*shape, generator=g) * 0.3
            if bias:
                t[f"mlp.experts.{e}.{name}.bias"] = torch.randn(shape[0], generator=g) * 0.3
    if shared:
        t["mlp.shared_expert.gate_proj.weight"] = torch.randn(SHARED, H, generator=g) * 0.3
        t["mlp.shared_expert.up_proj.weight"] = torch.randn(SHARED, H, generator=g) * 0.3
        t["mlp.shared_expert.down_proj.weight"] = torch.randn(H, SHARED, generator=g) * 0.3
        t["mlp.shared_expert_gate.weight"] = torch.randn(1, H, generator=g) * 0.3
    return t


_RULES = WeightNameMap(
    [
        *FusedMoE.hf_weight_rules("mlp"),
        WeightRule("mlp.gate.weight", "mlp.gate.weight"),
        WeightRule("mlp.shared_expert_gate.weight", "mlp.shared_expert_gate.weight"),
        WeightRule(
            "mlp.shared_expert.gate_proj.weight", "mlp.shared_expert.gate_up_proj.weight", shard=0
        ),
        WeightRule(
            "mlp.shared_expert.up_proj.weight", "mlp.shared_expert.gate_up_proj.weight", shard=1
        ),
        WeightRule("mlp.shared_expert.down_proj.weight", "mlp.shared_expert.down_proj.weight"),
    ]
)


def _load(layer: FusedMoE, tensors: dict[str, torch.Tensor]) -> set:
    """What CausalLM.load_weights does for these names; returns the (param, shard) pairs."""
    params = {f"mlp.{n}": p for n, p in layer.named_parameters()}
    seen = set()
    for name, tensor in tensors.items():
        match = _RULES.match(name)
        assert match is not None, name
        param = params[match.target]
        if match.shard is None:
            param.weight_loader(param, tensor)
            seen.update((match.target, s) for s in getattr(param, "shard_ids", (None,)))
        else:
            param.weight_loader(param, tensor, match.shard)
            seen.add((match.target, match.shard))
    return seen


def _reference(
    t: dict[str, torch.Tensor],
    x: torch.Tensor,
    spec: RouterSpec,
    *,
    shared: bool,
    activation: str = "silu",
) -> torch.Tensor:
    """The block one token at a time, straight from the checkpoint tensors."""
    routes = _per_token_router(x @ t["mlp.gate.weight"].T, spec)
    out = torch.zeros_like(x)
    for token, chosen in enumerate(routes):
        for e, w in chosen.items():

            def lin(name: str, v: torch.Tensor) -> torch.Tensor:
                y = v @ t[f"mlp.experts.{e}.{name}.weight"].T
                b = t.get(f"mlp.experts.{e}.{name}.bias")
                return y if b is None else y + b

            gate, up = lin("gate_proj", x[token]), lin("up_proj", x[token])
            if activation == "silu":
                act = F.silu(gate) * up
            else:
                gate, up = gate.clamp(max=7.0), up.clamp(-7.0, 7.0)
                act = (up + 1) * gate * torch.sigmoid(1.702 * gate)
            out[token] += w * lin("down_proj", act)
        if shared:
            s = F.silu(x[token] @ t["mlp.shared_expert.gate_proj.weight"].T) * (
                x[token] @ t["mlp.shared_expert.up_proj.weight"].T
            )
            s = s @ t["mlp.shared_expert.down_proj.weight"].T
            out[token] += torch.sigmoid(x[token] @ t["mlp.shared_expert_gate.weight"].T) * s
    return out


@pytest.mark.parametrize("shared", [False, True])
def test_block_matches_per_token_reference(shared):
    g = torch.Generator().manual_seed(1)
    t = _checkpoint(g, shared=shared, bias=False)
    layer = _layer(shared_intermediate_size=SHARED if shared else 0, shared_gate=shared)
    seen = _load(layer, t)
    needed = {
        (f"mlp.{n}", s)
        for n, p in layer.named_parameters()
        for s in getattr(p, "shard_ids", None) or (None,)
    }
    assert needed <= seen, sorted(needed - seen)[:5]
    x = torch.randn(10, H, generator=g)
    expected = _reference(t, x, layer.router, shared=shared)
    torch.testing.assert_close(layer(x), expected, rtol=1e-5, atol=1e-5)
    # more than one expert is used, so the comparison covers the routing
    assert len(torch.unique(layer.route(x)[1])) > 2


def test_clamped_swiglu_with_expert_biases():
    g = torch.Generator().manual_seed(2)
    t = _checkpoint(g, shared=False, bias=True)
    spec = RouterSpec(top_k=2, scoring="softmax_selected")
    layer = _layer(router=spec, activation="swiglu_clamp", expert_bias=True)
    _load(layer, t)
    x = torch.randn(6, H, generator=g) * 4
    torch.testing.assert_close(
        layer(x),
        _reference(t, x, spec, shared=False, activation="swiglu_clamp"),
        rtol=1e-5,
        atol=1e-5,
    )


def test_stacked_checkpoint_tensors_load_like_per_expert_ones():
    g = torch.Generator().manual_seed(3)
    t = _checkpoint(g, shared=False, bias=False)
    per_expert = _layer()
    _load(per_expert, t)
    stacked = {
        "mlp.gate.weight": t["mlp.gate.weight"],
        "mlp.experts.gate_up_proj": torch.stack(
            [
                torch.cat(
                    [t[f"mlp.experts.{e}.gate_proj.weight"], t[f"mlp.experts.{e}.up_proj.weight"]]
                )
                for e in range(E)
            ]
        ),
        "mlp.experts.down_proj": torch.stack(
            [t[f"mlp.experts.{e}.down_proj.weight"] for e in range(E)]
        ),
    }
    fused = _layer()
    _load(fused, stacked)
    for name, p in per_expert.state_dict().items():
        assert torch.equal(p, fused.state_dict()[name]), name


def test_tensor_parallel_ranks_sum_to_the_whole():
    """Each of two ranks holds half of every expert's intermediate features (and of the shared
    expert's); their unreduced outputs add up to the single-device block."""
    g = torch.Generator().manual_seed(4)
    t = _checkpoint(g, shared=True, bias=True)
    kw = dict(shared_intermediate_size=SHARED, shared_gate=True, expert_bias=True)
    whole = _layer(**kw)
    _load(whole, t)
    x = torch.randn(7, H, generator=g)
    parts = []
    for rank in range(2):
        layer = _layer(BuildContext(tp_rank=rank, tp_size=2), reduce_results=False, **kw)
        assert layer.experts.w13_weight.shape == (E, INTER, H)
        _load(layer, t)
        parts.append(layer(x))
    torch.testing.assert_close(parts[0] + parts[1], whole(x), rtol=1e-5, atol=1e-5)


def test_expert_parallel_ranks_hold_and_load_their_whole_experts():
    """With ``expert_parallel`` each of two ranks stacks its 4 experts whole (no split of the
    intermediate size, every bias kept); of a per-expert checkpoint it copies those and passes
    over the others, and the completeness check still asks for every expert of the layer.
    (The all-to-all itself: tests/distributed/test_moe_dispatch.py.)"""
    g = torch.Generator().manual_seed(5)
    t = _checkpoint(g, shared=True, bias=True)
    kw = dict(shared_intermediate_size=SHARED, shared_gate=True, expert_bias=True)
    whole = _layer(**kw)
    _load(whole, t)
    for rank in range(2):
        layer = _layer(BuildContext(tp_rank=rank, tp_size=2, expert_parallel=True), **kw)
        assert layer.experts.placement.start == 4 * rank
        assert layer.experts.w13_weight.shape == (E // 2, 2 * INTER, H)
        # the shared expert stays split along its intermediate size
        assert layer.shared_expert.down_proj.weight.shape == (H, SHARED // 2)
        seen = _load(layer, t)
        needed = {
            (f"mlp.{n}", s)
            for n, p in layer.named_parameters()
            for s in getattr(p, "shard_ids", None) or (None,)
        }
        assert needed <= seen and ("mlp.experts.w2_weight", ("7", "down")) in needed
        mine = slice(4 * rank, 4 * rank + 4)
        for name in ("w13_weight", "w2_weight", "w13_bias", "w2_bias"):
            assert torch.equal(getattr(layer.experts, name), getattr(whole.experts, name)[mine]), (
                rank,
                name,
            )


def test_expert_parallel_needs_experts_that_divide_by_the_ranks():
    with pytest.raises(
        ValueError,
        match=r"mlp\.experts: 8 experts do not split evenly over 3 "
        "expert-parallel ranks",
    ):
        _layer(BuildContext(tp_rank=0, tp_size=3, expert_parallel=True))
    # one rank: nothing to place, the ordinary layer
    assert _layer(BuildContext(expert_parallel=True)).experts.w13_weight.shape[0] == E


def test_weight_loader_refuses_wrong_shapes():
    layer = _layer()
    with pytest.raises(ValueError, match="expert 3"):
        layer.experts.w13_weight.weight_loader(
            layer.experts.w13_weight, torch.zeros(INTER + 1, H), ("3", "gate")
        )
    with pytest.raises(ValueError, match="no part 'down'"):
        layer.experts.w13_weight.weight_loader(
            layer.experts.w13_weight, torch.zeros(INTER, H), ("0", "down")
        )
    with pytest.raises(ValueError, match="out of range"):
        layer.experts.w2_weight.weight_loader(
            layer.experts.w2_weight, torch.zeros(H, INTER), (str(E), "down")
        )


def test_weight_rule_fills_its_shard_from_the_name():
    rule = WeightNameMap(
        [WeightRule("x.{i}.experts.{e}.up_proj.{kind}", "x.{i}.w13_{kind}", shard=("{e}", "up"))]
    )
    match = rule.match("x.4.experts.17.up_proj.weight")
    assert match.target == "x.4.w13_weight" and match.shard == ("17", "up")
    with pytest.raises(ValueError, match="does not capture"):
        WeightRule("x.{i}.y", "x.{i}.z", shard=("{e}", "up"))


def test_one_part_of_every_expert_stacked_loads_and_covers_its_shards():
    """GGUF stores each part of every expert stacked (``ffn_gate_exps [E, I, H]``): shard
    ``("*", part)`` loads it like the per-expert tensors, and ``shard_cover`` tells the loader
    it filled that part of every expert (and nothing else)."""
    g = torch.Generator().manual_seed(5)
    t = _checkpoint(g, shared=False, bias=False)
    per_expert = _layer()
    _load(per_expert, t)
    layer = _layer()
    layer.gate.weight.data.copy_(t["mlp.gate.weight"])
    w13, w2 = layer.experts.w13_weight, layer.experts.w2_weight
    for part in ("gate", "up"):
        stacked = torch.stack([t[f"mlp.experts.{e}.{part}_proj.weight"] for e in range(E)])
        w13.weight_loader(w13, stacked, ("*", part))
    w2.weight_loader(
        w2, torch.stack([t[f"mlp.experts.{e}.down_proj.weight"] for e in range(E)]), None
    )
    for name, p in per_expert.state_dict().items():
        assert torch.equal(p, layer.state_dict()[name]), name
    assert w13.shard_cover(("*", "up")) == {(str(e), "up") for e in range(E)}
    assert w13.shard_cover(("3", "up")) == {("3", "up")}
    with pytest.raises(ValueError, match="does not hold 8 experts"):
        w13.weight_loader(w13, torch.zeros(E - 1, INTER, H), ("*", "gate"))


def test_a_quantized_stacked_tensor_gives_each_expert_its_rows_of_blocks():
    from tallow.layers import QuantizedWeight

    data = torch.arange(E * INTER * 6, dtype=torch.uint8).reshape(E, INTER, 6)
    weight = QuantizedWeight("gguf", "Q8_0", (E, INTER, 32), data, lambda *a: None)
    items = _layer().experts.expert_tensors(weight, ("*", "gate"))
    assert [(e, part) for e, part, _ in items] == [(e, "gate") for e in range(E)]
    third = items[3][2]
    assert third.shape == (INTER, 32) and torch.equal(third.data, data[3])
    with pytest.raises(ValueError, match="cannot select index 8"):
        weight.select(E)


def test_expert_tensors_gives_a_rank_its_own_experts_and_splits_projections():
    """Quantized expert loaders (fp8, int4, GGUF) ask ``expert_tensors`` which experts of a
    checkpoint tensor this rank holds: under expert parallelism rank 1 of 2 gets experts 4..7,
    numbered 0..3; ``projection`` splits a whole w13 into its gate and up halves and refuses a
    part the projection does not have."""
    layer = _layer(BuildContext(tp_rank=1, tp_size=2, expert_parallel=True))
    stacked = torch.arange(E * 2 * INTER * H, dtype=torch.float32).reshape(E, 2 * INTER, H)
    items = layer.experts.expert_tensors(stacked, None, "w13")
    assert [(e, part) for e, part, _ in items] == [(e, p) for e in range(4) for p in ("gate", "up")]
    assert torch.equal(items[0][2], stacked[4, :INTER]) and torch.equal(
        items[1][2], stacked[4, INTER:]
    )
    assert layer.experts.expert_tensors(torch.zeros(INTER, H), ("2", "gate"), "w13") == []
    [(e, part, _)] = layer.experts.expert_tensors(torch.zeros(INTER, H), ("6", "up"), "w13")
    assert (e, part) == (2, "up")
    with pytest.raises(ValueError, match="w2 has no part 'gate'"):
        layer.experts.expert_tensors(torch.zeros(INTER, H), ("6", "gate"), "w2")
