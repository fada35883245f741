"""What the driver tells its workers each step, and the channel that carries it.

A step is described by what the driver's model runner built on the host for it (the
:class:`~tallow.types.HostBatch`: token ids, positions, cache slots, the rows to
sample and to feed, query offsets, lengths, block tables), the KV blocks to copy before it
(copy-on-write of ``n > 1`` forks), the row ranges whose logits it computes for prompt
logprobs, and how the workers get its sampled tokens. Workers know nothing of requests,
sampling parameters or the scheduler: a worker uploads the same arrays and runs the same
forward and the same collectives as the driver.

Packed, a step is one ``uint8`` buffer: a header of :data:`HEADER_WORDS` int64 words, then the
int64 parts (the batch's ``i64``, the copies, the logit ranges), then the batch's ``i32``. The
:class:`ControlChannel` sends it over a gloo group (host to host: the driver never waits for its
device to describe a step, and a worker reads it while its device still runs the step before)
with one broadcast of a size both sides derive from the previous message
(:func:`next_capacity`: a power of two above it, so steady decoding sends one broadcast of about
its own size); a message larger than that (a long prompt after decode steps) sends the rest with
a second broadcast.
"""

from __future__ import annotations

import enum
import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from tallow.types import HostBatch


class MessageKind(enum.IntEnum):
    """What a message tells the workers (its value is the header word that carries it)."""

    STEP = 1  # run this step
    RELEASE = 2  # the engine went idle: release what is held for the next step
    STOP = 3  # shut down


class TokenSource(enum.IntEnum):
    """How the workers learn a step's sampled tokens (they need them when the next step,
    planned before they are known on any host, feeds on them: async scheduling)."""

    NONE = 0  # they do not: nothing feeds on this step
    ARGMAX = 1  # every row is plain greedy: each rank takes the argmax of the same logits
    BROADCAST = 2  # rank 0 samples and broadcasts the ids on the device group


STEP, RELEASE, STOP = MessageKind.STEP, MessageKind.RELEASE, MessageKind.STOP
TOKENS_NONE, TOKENS_ARGMAX, TOKENS_BROADCAST = (
    TokenSource.NONE,
    TokenSource.ARGMAX,
    TokenSource.BROADCAST,
)

_KIND_VALUES = frozenset(kind.value for kind in MessageKind)

HEADER_WORDS = 16
_MAGIC = 0x7A110  # first word of every message: a stream out of step shows at once
#: bounds of the first broadcast of a message, in bytes
MIN_CAPACITY = 4 * 1024
MAX_CAPACITY = 1 << 20


def next_capacity(size: int) -> int:
    """The first broadcast's size for the message after one of ``size`` bytes: the next power
    of two above ``1.25 * size`` (room for block tables to grow), within the bounds."""
    want = max(MIN_CAPACITY, size + size // 4)
    return min(MAX_CAPACITY, 1 << (want - 1).bit_length())


@dataclass(frozen=True)
class StepMessage:
    """One message of the driver (see the module docstring)."""

    kind: MessageKind
    number: int  # steps sent to this engine's workers before this one
    host: HostBatch | None = None  # None: nothing to run (a copy-only step, or not a step)
    copies: list[tuple[int, ...]] = field(default_factory=list)
    logit_rows: list[tuple[int, int]] = field(default_factory=list)
    tokens: TokenSource = TokenSource.NONE

    def pack(self) -> np.ndarray:
        """The message as one ``uint8`` array."""
        h = self.host
        header = np.zeros(HEADER_WORDS, np.int64)
        i64 = h.i64 if h is not None else np.zeros(0, np.int64)
        i32 = h.i32 if h is not None else np.zeros(0, np.int32)
        copies = np.asarray(self.copies, np.int64).reshape(-1)
        rows = np.asarray(self.logit_rows, np.int64).reshape(-1)
        header[:5] = (_MAGIC, self.kind, self.number, self.tokens, len(self.copies))
        header[5] = len(self.logit_rows)
        if h is not None:
            header[6:14] = (
                1,
                h.num_seqs,
                h.num_tokens,
                h.num_sampled,
                h.num_fed,
                h.width,
                h.max_query_len,
                h.max_seq_len,
            )
        header[14], header[15] = i64.size, i32.size
        return np.concatenate(
            [
                header.view(np.uint8),
                i64.view(np.uint8),
                copies.view(np.uint8),
                rows.view(np.uint8),
                i32.view(np.uint8),
            ]
        )

    @staticmethod
    def packed_size(header: np.ndarray) -> int:
        """Bytes of the message whose first :data:`HEADER_WORDS` words are ``header``."""
        words = HEADER_WORDS + int(header[14]) + 2 * int(header[4]) + 2 * int(header[5])
        return 8 * words + 4 * int(header[15])

    @classmethod
    def unpack(cls, data: np.ndarray) -> "StepMessage":
        """The message packed in ``data`` (``uint8``; copies are made of what is kept)."""
        header = data[: 8 * HEADER_WORDS].view(np.int64)
        if int(header[0]) != _MAGIC or int(header[1]) not in _KIND_VALUES:
            raise RuntimeError(
                "tensor-parallel worker received a malformed step message "
                f"(header {header[:3].tolist()}); the ranks are out of step"
            )
        if data.size != cls.packed_size(header):
            raise RuntimeError(
                f"step message of {data.size} bytes, its header says {cls.packed_size(header)}"
            )
        n64, n_copies, n_rows, n32 = (
            int(header[14]),
            int(header[4]),
            int(header[5]),
            int(header[15]),
        )
        words = data[8 * HEADER_WORDS : 8 * (HEADER_WORDS + n64 + 2 * (n_copies + n_rows))]
        words = words.view(np.int64)
        i64 = words[:n64].copy()
        copies = words[n64 : n64 + 2 * n_copies].reshape(-1, 2).tolist()
        rows = words[n64 + 2 * n_copies :].reshape(-1, 2).tolist()
        i32 = data[data.size - 4 * n32 :].view(np.int32).copy()
        host = None
        if header[6]:
            host = HostBatch(i64, i32, *(int(v) for v in header[7:14]))
        return cls(
            MessageKind(int(header[1])),
            int(header[2]),
            host,
            [(int(a), int(b)) for a, b in copies],
            [(int(a), int(b)) for a, b in rows],
            TokenSource(int(header[3])),
        )

    def describe(self) -> str:
        what = self.kind.name.lower()
        if self.host is None:
            return f"{what} #{self.number}"
        return (
            f"{what} #{self.number}: {self.host.num_seqs} sequences, {self.host.num_tokens} tokens"
        )


class ControlChannel:
    """Messages from rank 0 to every rank over a gloo group (see the module docstring).

    ``send`` (the driver) and ``receive`` (a worker) are called by one thread each; the lock
    keeps a second thread of the driver (shutting down) from interleaving a message with a
    step's."""

    def __init__(self, group: dist.ProcessGroup | None) -> None:
        self.group = group
        #: size of the next message's first broadcast: the same on every rank
        self.capacity = MIN_CAPACITY
        self._buffers: dict[int, torch.Tensor] = {}
        self.lock = threading.Lock()

    def _head(self) -> torch.Tensor:
        buf = self._buffers.get(self.capacity)
        if buf is None:
            buf = self._buffers[self.capacity] = torch.empty(self.capacity, dtype=torch.uint8)
        return buf

    def _broadcast(self, tensor: torch.Tensor) -> None:
        import torch.distributed as dist

        dist.broadcast(tensor, src=0, group=self.group)

    def send(self, message: StepMessage) -> None:
        data = message.pack()
        head, capacity = self._head(), self.capacity
        first = min(data.size, capacity)
        head.numpy()[:first] = data[:first]
        self._broadcast(head)
        if data.size > capacity:
            self._broadcast(torch.from_numpy(data[capacity:]))
        self.capacity = next_capacity(data.size)

    def receive(self) -> StepMessage:
        head, capacity = self._head(), self.capacity
        self._broadcast(head)
        data = head.numpy()
        size = StepMessage.packed_size(data[: 8 * HEADER_WORDS].view(np.int64))
        if size > capacity:
            rest = torch.empty(size - capacity, dtype=torch.uint8)
            self._broadcast(rest)
            data = np.concatenate([data, rest.numpy()])
        self.capacity = next_capacity(size)
        return StepMessage.unpack(data[:size])

    def send_object(self, obj: object) -> None:
        """A picklable object to every rank (start-up: the configuration and plugins)."""
        import torch.distributed as dist

        dist.broadcast_object_list([obj], src=0, group=self.group)

    def receive_object(self) -> Any:  # Any: what the driver sent (send_object)
        import torch.distributed as dist

        box: list[Any] = [None]
        dist.broadcast_object_list(box, src=0, group=self.group)
        return box[0]
