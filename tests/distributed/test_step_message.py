"""The step description the driver sends its workers, and the watchdog's verdicts (a fake
store and fake processes: no group is started)."""

from __future__ import annotations

import numpy as np
import pytest

from tallow.distributed.step_message import (
    HEADER_WORDS,
    MAX_CAPACITY,
    MIN_CAPACITY,
    RELEASE,
    STEP,
    TOKENS_BROADCAST,
    StepMessage,
    next_capacity,
)
from tallow.distributed.watchdog import FAILURE_KEY, Watchdog, heartbeat_key
from tallow.types import HostBatch


def _batch(num_seqs: int, num_tokens: int, width: int) -> HostBatch:
    rng = np.random.default_rng(num_tokens)
    i64 = rng.integers(-1, 1 << 40, size=3 * num_tokens + num_seqs + 2 * num_seqs, dtype=np.int64)
    i32 = rng.integers(0, 1 << 30, size=2 * num_seqs + 1 + num_seqs * width, dtype=np.int32)
    return HostBatch(
        i64,
        i32,
        num_seqs=num_seqs,
        num_tokens=num_tokens,
        num_sampled=num_seqs,
        num_fed=1,
        width=width,
        max_query_len=7,
        max_seq_len=99,
    )


@pytest.mark.parametrize("num_seqs,num_tokens,width", [(1, 1, 1), (3, 40, 5), (2, 3000, 200)])
def test_a_step_survives_packing(num_seqs, num_tokens, width) -> None:
    message = StepMessage(
        STEP,
        17,
        _batch(num_seqs, num_tokens, width),
        [(1, 2), (5, 9)],
        [(0, 3), (3, 40)],
        TOKENS_BROADCAST,
    )
    data = message.pack()
    assert data.dtype == np.uint8 and data.size == StepMessage.packed_size(
        data[: 8 * HEADER_WORDS].view(np.int64)
    )
    back = StepMessage.unpack(data.copy())
    assert (back.kind, back.number, back.copies, back.logit_rows, back.tokens) == (
        STEP,
        17,
        [(1, 2), (5, 9)],
        [(0, 3), (3, 40)],
        TOKENS_BROADCAST,
    )
    h, b = message.host, back.host
    assert np.array_equal(h.i64, b.i64) and np.array_equal(h.i32, b.i32)
    assert (
        b.num_seqs,
        b.num_tokens,
        b.num_sampled,
        b.num_fed,
        b.width,
        b.max_query_len,
        b.max_seq_len,
    ) == (num_seqs, num_tokens, num_seqs, 1, width, 7, 99)


def test_the_first_broadcast_follows_the_message_sizes() -> None:
    decode = StepMessage(STEP, 0, _batch(64, 64, 128)).pack().size
    capacity = next_capacity(decode)
    assert decode < capacity <= 2 * decode + MIN_CAPACITY  # the next decode step: one broadcast
    assert StepMessage(STEP, 0, _batch(1, 8192, 1)).pack().size > capacity  # a long prompt
    assert next_capacity(0) == MIN_CAPACITY and next_capacity(1 << 30) == MAX_CAPACITY


def test_messages_without_a_batch_and_garbage() -> None:
    back = StepMessage.unpack(StepMessage(RELEASE, 3).pack())
    assert (back.kind, back.number, back.host) == (RELEASE, 3, None)
    with pytest.raises(RuntimeError, match="out of step"):
        StepMessage.unpack(np.zeros(8 * HEADER_WORDS, np.uint8))


class FakeStore:
    def __init__(self) -> None:
        self.values: dict[str, int | bytes] = {}

    def add(self, key: str, n: int) -> int:
        self.values[key] = int(self.values.get(key, 0)) + n
        return self.values[key]

    def check(self, keys: list[str]) -> bool:
        return all(k in self.values for k in keys)

    def get(self, key: str) -> bytes:
        return self.values[key]

    def set(self, key: str, value: str) -> None:
        self.values[key] = value.encode()


class FakeProcess:
    pid = 4242
    exitcode: int | None = None


def test_the_driver_sees_dead_children_stale_heartbeats_and_reports() -> None:
    store, child = FakeStore(), FakeProcess()
    dog = Watchdog(rank=0, store=store, heartbeat_timeout_s=2.0, children={1: child}, remote=[2])
    assert dog.check(0.0) is None  # rank 2 has not beaten yet: it may still be starting
    store.add(heartbeat_key(2), 1)
    assert dog.check(1.0) is None and dog.check(2.9) is None
    assert "rank 2 has sent no heartbeat for 2.5s" in dog.check(3.5)[0]
    store.add(heartbeat_key(2), 1)
    assert dog.check(3.6) is None  # it beat again
    child.exitcode = -9
    assert dog.check(3.7) == ("tensor-parallel rank 1 (pid 4242) was killed by SIGKILL", True)
    store.set(FAILURE_KEY, "tensor-parallel rank 3 failed: boom")
    assert dog.check(3.8) == ("tensor-parallel rank 3 failed: boom", False)


def test_a_failure_is_acted_on_once() -> None:
    calls = []
    dog = Watchdog(
        rank=0,
        store=FakeStore(),
        heartbeat_timeout_s=1.0,
        on_failure=lambda reason, own: calls.append((reason, own)),
    )
    dog.fail("first", True)
    dog.fail("second")
    assert dog.failure == "first" and calls == [("first", True)]
    assert dog.diagnose(0.0) == "first"
