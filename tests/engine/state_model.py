"""A test-only model with one recurrent-state layer: token embedding, one attention layer (no
positional encoding: the causal mask and the recurrence give order), one gated linear
recurrence with a short causal convolution, and a head.

The recurrence, per sequence and channel: ``c_t = sum_j w_j x_{t-K+1+j}`` (a causal
depthwise convolution of width ``K``; its state is the last ``K - 1`` inputs) and
``h_t = a * h_{t-1} + b_t * c_t`` with ``a = sigmoid(decay)``, ``b_t = sigmoid(W_b x_t)``; the
layer outputs ``W_o h_t``. Its state (conv inputs and ``h``) is a
:class:`tallow.layers.RecurrentStateSpec`, kept by the engine in one state slot per sequence.

:meth:`StateModel.reference_logits` computes the same model over a whole sequence with no
cache of any kind (plain causal attention, the recurrence from a zero state): the oracle.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from tallow.kernels.attention_ref import attention_ref
from tallow.layers import (
    Attention,
    RecurrentStateSpec,
    StateCache,
    StateTensorSpec,
    get_forward_context,
)

VOCAB, HIDDEN, HEADS, HEAD_DIM, CONV = 64, 32, 2, 16, 3


class GatedRecurrence(nn.Module):
    def __init__(self, hidden: int = HIDDEN, conv: int = CONV) -> None:
        super().__init__()
        self.hidden, self.conv = hidden, conv
        self.conv_weight = nn.Parameter(torch.randn(conv, hidden) * 0.5)
        self.decay = nn.Parameter(torch.randn(hidden))
        self.gate = nn.Linear(hidden, hidden, bias=False)
        self.out = nn.Linear(hidden, hidden, bias=False)
        self.cache: StateCache | None = None

    def cache_spec(self) -> RecurrentStateSpec:
        return RecurrentStateSpec(
            (
                StateTensorSpec("conv", (self.conv - 1, self.hidden)),
                StateTensorSpec("h", (self.hidden,)),
            )
        )

    def bind_cache(self, cache: StateCache, group: int) -> None:
        self.cache = cache

    def scan(
        self, x: torch.Tensor, conv: torch.Tensor, h: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The reference over one sequence's new inputs ``x`` [n, H] from state (``conv``
        [K-1, H], ``h`` [H]): (outputs [n, H], the new conv state, the new h)."""
        a = torch.sigmoid(self.decay)
        b = torch.sigmoid(self.gate(x))
        window = torch.cat([conv, x], 0)
        outs = []
        for t in range(x.shape[0]):
            c = (window[t : t + self.conv] * self.conv_weight).sum(0)
            h = a * h + b[t] * c
            outs.append(h)
        return self.out(torch.stack(outs)), window[-(self.conv - 1) :], h

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        meta = get_forward_context().meta
        cache = self.cache
        assert cache is not None, "the runner binds the state cache"
        slots = meta.state_slots[cache.group]
        if meta.is_decode_only:
            # one row per sequence: every sequence at once (capturable in a CUDA graph)
            n = slots.shape[0]
            x = x[:n]
            window = torch.cat([cache["conv"].index_select(0, slots), x[:, None]], 1)
            c = (window * self.conv_weight).sum(1)
            h = (
                torch.sigmoid(self.decay) * cache["h"].index_select(0, slots)
                + torch.sigmoid(self.gate(x)) * c
            )
            cache["conv"].index_copy_(0, slots, window[:, 1:])
            cache["h"].index_copy_(0, slots, h)
            return self.out(h)
        out = torch.zeros_like(x)
        qsl = meta.query_start_loc_cpu
        assert qsl is not None
        for i, slot in enumerate(slots.tolist()):
            start, end = qsl[i], qsl[i + 1]
            if end == start:
                continue
            y, conv, h = self.scan(x[start:end], cache["conv"][slot], cache["h"][slot])
            out[start:end] = y
            cache["conv"][slot] = conv
            cache["h"][slot] = h
        return out


class StateModel(nn.Module):
    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.embed = nn.Embedding(VOCAB, HIDDEN)
        self.qkv = nn.Linear(HIDDEN, 3 * HEADS * HEAD_DIM, bias=False)
        self.o = nn.Linear(HEADS * HEAD_DIM, HIDDEN, bias=False)
        self.attn = Attention(0, HEADS, HEADS, HEAD_DIM)
        self.recurrence = GatedRecurrence()
        self.head = nn.Linear(HIDDEN, VOCAB, bias=False)
        with torch.no_grad():
            for p in self.parameters():
                if p.dim() == 2:
                    p.normal_(0, 0.4)

    def _split(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.qkv(x).split(HEADS * HEAD_DIM, dim=-1)

    def forward(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        x = x + self.o(self.attn(*self._split(x)))
        return x + self.recurrence(x)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.head(hidden)

    @torch.no_grad()
    def reference_logits(self, ids: list[int]) -> torch.Tensor:
        """Logits of every position of ``ids`` computed from scratch, with no cache."""
        x = self.embed(torch.tensor(ids))
        n = x.shape[0]
        q, k, v = self._split(x)
        att = attention_ref(
            q.view(n, HEADS, HEAD_DIM),
            k.view(n, HEADS, HEAD_DIM),
            v.view(n, HEADS, HEAD_DIM),
            scale=HEAD_DIM**-0.5,
            context_len=n,
        )
        x = x + self.o(att.reshape(n, -1))
        rec = self.recurrence
        y, _, _ = rec.scan(x, torch.zeros(CONV - 1, HIDDEN), torch.zeros(HIDDEN))
        return self.head(x + y)

    def reference_greedy(self, prompt: list[int], steps: int) -> list[int]:
        ids, out = list(prompt), []
        for _ in range(steps):
            token = int(self.reference_logits(ids)[-1].argmax())
            ids.append(token)
            out.append(token)
        return out


def build_core(
    model: StateModel,
    *,
    num_blocks: int = 64,
    block_size: int = 4,
    max_num_seqs: int = 4,
    max_num_batched_tokens: int = 32,
    prefill_chunk_size: int | None = None,
    async_scheduling: bool = False,
    enable_prefix_caching: bool = False,
    device: str = "cpu",
    backend: Any = None,
    max_model_len: int = 256,
) -> Any:
    """The engine core (runner, cache manager, scheduler) over ``model``, as the builder makes
    it for a loaded model."""
    from tallow.engine.core import EngineCore
    from tallow.engine.kv_manager import KVCacheManager
    from tallow.engine.model_runner import ModelRunner
    from tallow.engine.scheduler import Scheduler
    from tallow.layers.torch_attention import TorchAttentionBackend

    dev = torch.device(device)
    model = model.to(dev)
    runner = ModelRunner(
        model,
        device=dev,
        dtype=torch.float32,
        num_blocks=num_blocks,
        block_size=block_size,
        attention_backend=backend or TorchAttentionBackend(),
        vocab_size=VOCAB,
        max_num_seqs=max_num_seqs,
        max_model_len=max_model_len,
    )
    manager = KVCacheManager(
        runner.group_sizes,
        block_size=block_size,
        enable_prefix_caching=enable_prefix_caching,
        state_slots=[max_num_seqs] * len(runner.state_groups),
        max_step_tokens=max_num_batched_tokens,
    )
    scheduler = Scheduler(
        manager,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        prefill_chunk_size=prefill_chunk_size,
        max_model_len=max_model_len,
    )
    return EngineCore(
        scheduler,
        runner,
        eos_token_ids=set(),
        max_model_len=max_model_len,
        async_scheduling=async_scheduling,
    )


def run_to_end(
    core: Any, requests: dict[str, tuple[list[int], Any]], abort_after: dict[str, int] | None = None
) -> dict[str, list[list[int]]]:
    """Add ``requests`` (id -> (prompt, SamplingParams)), step until done; the tokens of each
    completion. ``abort_after``: request id -> abort it once it has that many tokens."""
    outputs: dict[str, list[list[int]]] = {}
    for rid, (prompt, params) in requests.items():
        core.add_request(rid, prompt, params)
        outputs[rid] = [[] for _ in range(params.n)]
    abort_after = dict(abort_after or {})
    while core.has_unfinished():
        out = core.step()
        for update in out.updates:
            outputs[update.request_id][update.index].append(update.token.token_id)
        for rid, count in list(abort_after.items()):
            if len(outputs[rid][0]) >= count:
                core.abort(rid)
                del abort_after[rid]
    return outputs
