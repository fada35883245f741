"""One rank of the expert-parallel unit tests: ``python ep_ranks.py RANK WORLD RENDEZVOUS OUT``
joins a gloo group of WORLD processes (a file rendezvous at RENDEZVOUS), runs
:func:`run_rank` and saves what it computed to ``OUT/rank{RANK}.pt``.

Every input is drawn from fixed seeds, so the test process rebuilds them (the functions below)
for its single-process references."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

E, H, INTER, SHARED, TOP_K = 8, 16, 12, 8, 2
#: tokens each rank dispatches (rank 1 none), by group size
TOKENS = {2: [6, 0], 4: [5, 0, 9, 2]}
#: replicated token counts through the whole layer: fewer tokens than ranks leaves some
#: ranks without a share
LAYER_TOKENS = (1, 3, 11)


def expert_weights() -> dict[str, torch.Tensor]:
    """Every expert of the dispatch test, with biases (each added once per pair)."""
    g = torch.Generator().manual_seed(11)
    return {
        "w13": torch.randn(E, 2 * INTER, H, generator=g) * 0.3,
        "w2": torch.randn(E, H, INTER, generator=g) * 0.3,
        "w13_bias": torch.randn(E, 2 * INTER, generator=g) * 0.1,
        "w2_bias": torch.randn(E, H, generator=g) * 0.1,
    }


def rank_tokens(rank: int, world: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s tokens ``x [n, H]``, weights and expert ids ``[n, TOP_K]``. The loads are
    uneven on purpose: rank 0's tokens all go to rank 1's experts, rank 0's experts get no
    token at all, rank 1 has no tokens."""
    n = TOKENS[world][rank]
    per_rank = E // world
    g = torch.Generator().manual_seed(100 + rank)
    x = torch.randn(n, H, generator=g)
    if rank == 0:
        allowed = list(range(per_rank, 2 * per_rank))
    else:
        allowed = list(range(per_rank, E))
    ids = (
        torch.stack(
            [
                torch.tensor(allowed)[torch.randperm(len(allowed), generator=g)[:TOP_K]]
                for _ in range(n)
            ]
        )
        if n
        else torch.zeros(0, TOP_K, dtype=torch.int64)
    )
    weights = torch.rand(n, TOP_K, generator=g) + 0.1
    return x, weights, ids


def whole_layer(**overrides: object) -> torch.nn.Module:
    """A single-device FusedMoE (shared expert behind a gate, expert biases) with seeded random
    parameters; ``overrides`` go to its constructor (a BuildContext for a rank's layer)."""
    from tallow.layers import FusedMoE, RouterSpec

    kw: dict = dict(
        router=RouterSpec(top_k=TOP_K, renormalize=True),
        expert_bias=True,
        shared_intermediate_size=SHARED,
        shared_gate=True,
        prefix="mlp",
    )
    kw.update(overrides)
    layer = FusedMoE(E, H, INTER, **kw)
    g = torch.Generator().manual_seed(12)
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return layer


def layer_inputs(tokens: int) -> torch.Tensor:
    return torch.randn(tokens, H, generator=torch.Generator().manual_seed(tokens))


def load_from_whole(layer: torch.nn.Module, whole: torch.nn.Module) -> None:
    """Fill a rank's layer from the single-device one's parameters through the loaders the
    checkpoint loader calls (the experts from their stacked form)."""
    source = dict(whole.named_parameters())
    for name, param in layer.named_parameters():
        full = source[name].detach()
        loader = getattr(param, "weight_loader")
        if name == "shared_expert.gate_up_proj.weight":
            for shard, half in enumerate(full.chunk(2)):
                loader(param, half, shard)
        else:
            loader(param, full)


def run_rank(rank: int, world: int) -> dict[str, object]:
    from tallow.kernels import fused_moe
    from tallow.layers import BuildContext
    from tallow.layers.moe_dispatch import ExpertPlacement, dispatch_combine

    placement = ExpertPlacement(E, rank, world)
    w = expert_weights()
    local = slice(placement.start, placement.start + placement.num_local)
    received: list[int] = []

    def compute(xs: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        received.append(xs.shape[0])
        return fused_moe(
            xs,
            w["w13"][local],
            w["w2"][local],
            weights,
            ids,
            w13_bias=w["w13_bias"][local],
            w2_bias=w["w2_bias"][local],
        )

    x, weights, ids = rank_tokens(rank, world)
    capacity = max(TOKENS[world]) * TOP_K
    out: dict[str, object] = {
        "exact": dispatch_combine(x, weights, ids, placement, compute),
        "static": dispatch_combine(x, weights, ids, placement, compute, capacity=capacity),
    }
    out["received"] = received
    whole = whole_layer()
    layer = whole_layer(build=BuildContext(tp_rank=rank, tp_size=world, expert_parallel=True))
    load_from_whole(layer, whole)
    out["local_w13"] = layer.experts.w13_weight.detach().clone()
    with torch.no_grad():
        for tokens in LAYER_TOKENS:
            out[f"layer{tokens}"] = layer(layer_inputs(tokens))
    return out


def main(rank: int, world: int, rendezvous: str, out_dir: str) -> None:
    import torch.distributed as dist

    from tallow.distributed import state
    from tallow.distributed.topology import Topology

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world)
    topology = Topology(world, rank, rank, world, 1, 0, "127.0.0.1", None, True, "cpu", "gloo")
    # the default group carries the collectives (device_group None); no driver messages here
    state.set_current(
        state.ParallelState(topology, torch.device("cpu"), None, control=None, store=None)
    )  # type: ignore[arg-type]
    try:
        torch.save(run_rank(rank, world), Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4])
