"""Expert parallelism's dispatch and combine over 2 and 4 gloo processes against one process.

Each rank (``ep_ranks.py``) sends its own tokens to the ranks of their experts and gets their
weighted outputs back (``tallow.layers.moe_dispatch.dispatch_combine``), both with exact split
sizes and with the fixed capacity of the CUDA-graph path. The loads are uneven: one rank has
no tokens, one rank's tokens all go to a single other rank, and the first rank's experts
receive nothing. Then a whole ``FusedMoE`` (shared expert behind a gate, expert biases) built with
``expert_parallel`` on each rank, loaded from a single-device layer's stacked experts, runs
replicated tokens (fewer than the ranks, too) and, after its all-reduce, equals that layer."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ep_ranks import (
    E,
    LAYER_TOKENS,
    TOKENS,
    TOP_K,
    expert_weights,
    layer_inputs,
    rank_tokens,
    whole_layer,
)
from tallow.kernels.moe import fused_moe_ref

HERE = Path(__file__).resolve().parent


def _run_ranks(world: int, tmp_path: Path, sessions: list[int]) -> list[dict]:
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(HERE / "ep_ranks.py"),
                str(rank),
                str(world),
                str(tmp_path / "rendezvous"),
                str(tmp_path),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        for rank in range(world)
    ]
    sessions.extend(p.pid for p in procs)
    for rank, proc in enumerate(procs):
        try:
            _, err = proc.communicate(timeout=180)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"rank {rank} of {world} ran over 180s") from None
        assert proc.returncode == 0, f"rank {rank} of {world}:\n{err[-4000:]}"
    return [torch.load(tmp_path / f"rank{rank}.pt") for rank in range(world)]


@pytest.mark.parametrize("world", [2, 4])
def test_dispatch_combine_and_layer_equal_one_process(world, tmp_path, sessions):
    results = _run_ranks(world, tmp_path, sessions)
    w = expert_weights()
    per_rank = E // world
    all_ids = torch.cat([rank_tokens(rank, world)[2] for rank in range(world)])
    capacity = max(TOKENS[world]) * TOP_K
    for rank, got in enumerate(results):
        x, weights, ids = rank_tokens(rank, world)
        want = fused_moe_ref(
            x, w["w13"], w["w2"], weights, ids, w13_bias=w["w13_bias"], w2_bias=w["w2_bias"]
        )
        assert got["exact"].shape == (TOKENS[world][rank], x.shape[1])
        torch.testing.assert_close(got["exact"], want, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(got["static"], want, rtol=1e-5, atol=1e-5)
        # the pairs this rank's experts took: exact counts (none: not computed at all), then
        # every row of the fixed-capacity exchange
        pairs = int((all_ids // per_rank == rank).sum())
        assert got["received"] == ([pairs] if pairs else []) + [world * capacity], rank
        # the layer holds whole experts: this rank's, and only those
        whole = whole_layer()
        assert torch.equal(
            got["local_w13"], whole.experts.w13_weight[rank * per_rank : (rank + 1) * per_rank]
        )
        with torch.no_grad():
            for tokens in LAYER_TOKENS:
                x = layer_inputs(tokens)
                torch.testing.assert_close(
                    got[f"layer{tokens}"],
                    whole(x),
                    rtol=1e-5,
                    atol=1e-5,
                    msg=lambda m: f"rank {rank}, {tokens} tokens: {m}",
                )
    # the uneven loads the case is built for did happen
    assert int((all_ids // per_rank == 0).sum()) == 0
    assert TOKENS[world][1] == 0
