"""Which captured CUDA graph a decode batch replays (pure functions; the capture itself is
tested on a GPU in tests/gpu)."""

from __future__ import annotations

import pytest

from tallow.engine.cuda_graphs import fastest_graphs, graph_batch_sizes


def test_graph_batch_sizes_cover_every_batch_up_to_the_maximum() -> None:
    assert graph_batch_sizes(40) == [1, 2, 4, 8, 16, 32, 40]
    assert graph_batch_sizes(3) == [1, 2, 3]
    sizes = graph_batch_sizes(512)
    assert sizes[-1] == 512 and all(b <= 16 or b % 16 == 0 for b in sizes)


def test_a_larger_graph_is_replayed_only_when_clearly_faster() -> None:
    # 448 is slow (a poor matrix-product kernel for that shape); 464 is 25 % faster
    times = {416: 9.3, 432: 8.8, 448: 13.1, 464: 9.8, 480: 10.0, 512: 10.2}
    best = fastest_graphs(times)
    assert best == {416: 432, 432: 432, 448: 464, 464: 464, 480: 480, 512: 512}
    # within the margin the batch keeps its own graph (no padding for noise)
    assert fastest_graphs({16: 1.00, 32: 0.99})[16] == 16
    assert fastest_graphs({16: 1.00, 32: 0.90})[16] == 32


@pytest.mark.parametrize("times", [{1: 1.0}, {1: 2.0, 2: 1.0, 4: 3.0, 8: 0.5}])
def test_the_choice_is_never_smaller_than_the_batch(times) -> None:
    best = fastest_graphs(times)
    assert set(best) == set(times)
    assert all(choice >= size and choice in times for size, choice in best.items())
    assert best == {1: 8, 2: 8, 4: 8, 8: 8} if len(times) == 4 else best == {1: 1}
