"""Sampling on tensors: the same code on CPU and GPU.

Per row, in this order: logit bias → min_tokens mask of EOS/stop tokens → repetition penalty
(prompt+output tokens; positive logits divided, negative multiplied) → frequency/presence
penalties (output tokens, OpenAI semantics) → greedy rows take the argmax → temperature →
top-k → top-p → min-p → sample.

Sampling is the Gumbel-max trick with noise hashed from ``(seed, step, token index)``
(``tallow.kernels.gumbel``): a seeded row samples the same token whatever the rest of the batch
is, on any device. Unseeded rows get a fresh random seed per step.

Reported logprobs are those of the model's raw distribution (log_softmax of the logits before
any processing), like vLLM v1 by default.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Iterable

import numpy as np
import torch

from tallow.kernels.gumbel import row_keys_array
from tallow.kernels.host import device_tensor
from tallow.kernels.sampling import LogitEdits, apply_logit_edits, gumbel_argmax, gumbel_noise

# Temperatures below this are greedy (as in vLLM).
_GREEDY_EPS = 1e-5
# First try top-p over this many most likely tokens; a full sort only if they hold too little.
_TOP_P_CANDIDATES = 1024


@dataclass
class RowParams:
    """One row to sample: its request's params, its tokens so far, effective seed and step.

    ``seed`` None means unseeded; ``step`` is the index of the token being sampled in its
    sequence (``len(output_token_ids)``).
    """

    params: Any  # SamplingParams (duck-typed: vLLM attribute names)
    output_token_ids: list[int]
    prompt_token_ids: list[int]
    seed: int | None
    step: int


@dataclass
class SamplerOutput:
    """``token_ids`` [N] int64. When any row asked for logprobs: ``logprobs`` [N] (of the
    sampled token, raw distribution), ``ranks`` [N] (1-based rank of the sampled token) and
    ``top_ids``/``top_logprobs`` [N, k] with k the largest ``logprobs`` asked for in the batch
    (k may be 0); otherwise these are None."""

    token_ids: torch.Tensor
    logprobs: torch.Tensor | None = None
    top_ids: torch.Tensor | None = None
    top_logprobs: torch.Tensor | None = None
    ranks: torch.Tensor | None = None


def _get(params: Any, name: str, default: Any) -> Any:
    value = getattr(params, name, default)
    return default if value is None else value


def _is_greedy(params: Any) -> bool:
    greedy = getattr(params, "greedy", None)
    if greedy is not None:
        return bool(greedy)
    return float(_get(params, "temperature", 1.0)) < _GREEDY_EPS


def _check_token(field: str, token: Any, vocab_size: int) -> int:
    if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < vocab_size:
        raise ValueError(f"{field}: token id {token!r} is not an integer in [0, {vocab_size})")
    return token


def _check_range(field: str, value: float, lo: float, hi: float, lo_open: bool = False) -> float:
    value = float(value)
    ok = (lo < value if lo_open else lo <= value) and value <= hi
    if not ok:
        bracket = "(" if lo_open else "["
        raise ValueError(f"{field}: expected a value in {bracket}{lo}, {hi}], got {value}")
    return value


@dataclass(frozen=True)
class _StaticRow:
    """The per-request part of a row: the same every step, so checked and converted once."""

    greedy: bool
    inv_temperature: float
    top_k: int  # vocab_size where off
    top_p: float
    min_p: float
    repetition_penalty: float
    frequency_penalty: float
    presence_penalty: float
    logprobs: int | None
    bias: tuple[tuple[int, float], ...]
    min_tokens: int
    stop_token_ids: tuple[int, ...]
    ignore_eos: bool


# (id(params), vocab_size) -> (params, row). Holding ``params`` keeps its id from being reused
# while the entry lives; the cache is emptied when it grows past a bound.
_STATIC_ROWS: dict[tuple[int, int], tuple[Any, _StaticRow]] = {}
_STATIC_ROWS_MAX = 8192


def _static_row(p: Any, vocab_size: int) -> _StaticRow:
    key = (id(p), vocab_size)
    hit = _STATIC_ROWS.get(key)
    if hit is not None and hit[0] is p:
        return hit[1]
    is_greedy = _is_greedy(p)
    temperature = float(_get(p, "temperature", 1.0))
    if temperature < 0:
        raise ValueError(f"temperature: expected >= 0, got {temperature}")
    k = int(_get(p, "top_k", 0))
    if k < -1:
        raise ValueError(f"top_k: expected -1, 0 (off) or a positive int, got {k}")
    r = float(_get(p, "repetition_penalty", 1.0))
    if not r > 0:
        raise ValueError(f"repetition_penalty: expected > 0, got {r}")
    lp = getattr(p, "logprobs", None)
    if lp is not None and (not isinstance(lp, int) or lp < 0):
        raise ValueError(f"logprobs: expected None or an int >= 0, got {lp!r}")
    row = _StaticRow(
        greedy=is_greedy, inv_temperature=1.0 if is_greedy else 1.0 / temperature,
        top_k=vocab_size if k <= 0 or k >= vocab_size else k,
        top_p=_check_range("top_p", _get(p, "top_p", 1.0), 0.0, 1.0, lo_open=True),
        min_p=_check_range("min_p", _get(p, "min_p", 0.0), 0.0, 1.0),
        repetition_penalty=r, frequency_penalty=float(_get(p, "frequency_penalty", 0.0)),
        presence_penalty=float(_get(p, "presence_penalty", 0.0)), logprobs=lp,
        bias=tuple((_check_token("logit_bias", tok, vocab_size), float(b))
                   for tok, b in (_get(p, "logit_bias", {}) or {}).items()),
        min_tokens=int(_get(p, "min_tokens", 0)),
        stop_token_ids=tuple(_get(p, "stop_token_ids", []) or []),
        ignore_eos=bool(_get(p, "ignore_eos", False)))
    if len(_STATIC_ROWS) >= _STATIC_ROWS_MAX:
        _STATIC_ROWS.clear()
    _STATIC_ROWS[key] = (p, row)
    return row


@dataclass
class SamplingBatch:
    """Everything the sampler needs for one step, as tensors on the logits' device, plus the
    host-side flags that let it skip work nobody asked for. Build it with ``build``."""

    num_rows: int
    vocab_size: int
    greedy: torch.Tensor  # [N] bool
    inv_temperature: torch.Tensor  # [N] float32 (1 for greedy rows)
    top_k: torch.Tensor  # [N] int64, vocab_size where off
    top_p: torch.Tensor  # [N] float32, 1 where off
    min_p: torch.Tensor  # [N] float32, 0 where off
    key1: torch.Tensor  # [N] int64 noise keys (see tallow.kernels.gumbel.row_keys)
    key2: torch.Tensor
    edits: LogitEdits
    num_logprobs: list[int | None]  # per row, None = not asked
    all_greedy: bool
    top_k_rows: list[int]
    max_top_k: int  # largest top_k among top_k_rows (0 if none)
    top_p_rows: list[int]
    min_p_rows: list[int]

    @property
    def max_num_logprobs(self) -> int | None:
        asked = [k for k in self.num_logprobs if k is not None]
        return max(asked) if asked else None

    @property
    def filtered_rows(self) -> list[int]:
        """Rows that use top-k, top-p or min-p (and so take the torch filtering path)."""
        return sorted(set(self.top_k_rows) | set(self.top_p_rows) | set(self.min_p_rows))

    @classmethod
    def build(cls, rows: list[RowParams], vocab_size: int, device: torch.device | str,
              eos_token_ids: Iterable[int] | None = None,
              generator: torch.Generator | None = None) -> "SamplingBatch":
        """Turn per-row params into batch tensors on ``device``.

        What is derived from a params object is cached by its identity, so a params object must
        not change once it has been used (the engine gives each request a private copy).

        ``eos_token_ids`` are masked (with each row's ``stop_token_ids``) while a row has fewer
        than ``min_tokens`` outputs, unless it sets ``ignore_eos``. Unseeded rows draw their seed
        for this step from ``generator`` (CPU; torch's default generator if None). Raises
        ValueError naming the field for out-of-range values.
        """
        if not isinstance(vocab_size, int) or vocab_size <= 0:
            raise ValueError(f"vocab_size: expected a positive int, got {vocab_size!r}")
        eos = [_check_token("eos_token_ids", t, vocab_size) for t in (eos_token_ids or ())]
        n = len(rows)
        greedy: list[bool] = []
        inv_temp: list[float] = []
        top_k: list[int] = []
        top_p: list[float] = []
        min_p: list[float] = []
        rep: list[float] = []
        freq: list[float] = []
        pres: list[float] = []
        num_logprobs: list[int | None] = []
        seeds: list[int | None] = []
        steps: list[int] = []
        bias_rows: list[int] = []
        bias_tokens: list[int] = []
        bias_values: list[float] = []
        mask_rows: list[int] = []
        mask_tokens: list[int] = []
        counted_rows: list[int] = []  # rows with frequency/presence penalties
        repeated_rows: list[int] = []  # rows with a repetition penalty
        for i, row in enumerate(rows):
            st = _static_row(row.params, vocab_size)
            greedy.append(st.greedy)
            inv_temp.append(st.inv_temperature)
            top_k.append(st.top_k)
            top_p.append(st.top_p)
            min_p.append(st.min_p)
            rep.append(st.repetition_penalty)
            freq.append(st.frequency_penalty)
            pres.append(st.presence_penalty)
            num_logprobs.append(st.logprobs)
            if row.step < 0:
                raise ValueError(f"step: expected >= 0, got {row.step}")
            seeds.append(row.seed)
            steps.append(int(row.step))
            for tok, b in st.bias:
                bias_rows.append(i)
                bias_tokens.append(tok)
                bias_values.append(b)
            if len(row.output_token_ids) < st.min_tokens:
                masked = list(st.stop_token_ids)
                if not st.ignore_eos:
                    masked.extend(eos)
                for tok in masked:
                    mask_rows.append(i)
                    mask_tokens.append(_check_token("stop_token_ids", tok, vocab_size))
            if st.frequency_penalty != 0.0 or st.presence_penalty != 0.0:
                counted_rows.append(i)
            if st.repetition_penalty != 1.0:
                repeated_rows.append(i)

        outputs = [rows[i].output_token_ids for i in counted_rows]
        repeated = ([rows[i].prompt_token_ids for i in repeated_rows]
                    + [rows[i].output_token_ids for i in repeated_rows])
        dev = torch.device(device)
        edits = LogitEdits.from_parts(
            vocab_size, dev,
            bias=(np.array(bias_rows, dtype=np.int64), np.array(bias_tokens, dtype=np.int64),
                  np.array(bias_values, dtype=np.float64)),
            masked=(np.array(mask_rows, dtype=np.int64), np.array(mask_tokens, dtype=np.int64)),
            counted=_flatten("output_token_ids", counted_rows, outputs, vocab_size),
            repeated=_flatten("prompt_token_ids", repeated_rows * 2, repeated, vocab_size),
            repetition_penalty=rep, frequency_penalty=freq, presence_penalty=pres)

        unseeded = [i for i, s in enumerate(seeds) if s is None]
        if unseeded:
            fresh = torch.randint(0, 2**62, (len(unseeded),), generator=generator).tolist()
            for i, s in zip(unseeded, fresh):
                seeds[i] = s
        mask64 = (1 << 64) - 1
        keys1, keys2 = row_keys_array(np.array([s & mask64 for s in seeds], dtype=np.uint64),
                                      np.array(steps, dtype=np.uint64))

        def t(values: list, dtype: torch.dtype) -> torch.Tensor:
            return device_tensor(values, dtype, dev)

        sampled = [i for i in range(n) if not greedy[i]]
        top_k_rows = [i for i in sampled if top_k[i] < vocab_size]
        return cls(
            num_rows=n, vocab_size=vocab_size, greedy=t(greedy, torch.bool),
            inv_temperature=t(inv_temp, torch.float32), top_k=t(top_k, torch.int64),
            top_p=t(top_p, torch.float32), min_p=t(min_p, torch.float32),
            key1=device_tensor(keys1, torch.int64, dev),
            key2=device_tensor(keys2, torch.int64, dev),
            edits=edits, num_logprobs=num_logprobs, all_greedy=not sampled,
            top_k_rows=top_k_rows, max_top_k=max((top_k[i] for i in top_k_rows), default=0),
            top_p_rows=[i for i in sampled if top_p[i] < 1.0],
            min_p_rows=[i for i in sampled if min_p[i] > 0.0])


def _flatten(field: str, row_ids: list[int], token_lists: list[list[int]],
             vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(rows, tokens) int64 arrays: ``token_lists[j]`` belongs to row ``row_ids[j]``; token ids
    are checked against the vocabulary (the error names ``field``)."""
    lengths = [len(x) for x in token_lists]
    total = sum(lengths)
    tokens = np.fromiter(itertools.chain.from_iterable(token_lists), dtype=np.int64,
                         count=total)
    if total and (int(tokens.min()) < 0 or int(tokens.max()) >= vocab_size):
        bad = tokens[(tokens < 0) | (tokens >= vocab_size)][0]
        raise ValueError(f"{field}: token id {int(bad)} is not in [0, {vocab_size})")
    return np.repeat(np.array(row_ids, dtype=np.int64), lengths), tokens


# ---------------------------------------------------------------------------------------------
# Filters on scaled logits (logits * inv_temperature); removed tokens become -inf.

def apply_top_k(scores: torch.Tensor, k: torch.Tensor, kmax: int | None = None) -> torch.Tensor:
    """Keep, per row, the tokens scoring at least the row's k-th best (ties at the boundary are
    kept). scores [n, V]; k [n] int64 in [1, V]; ``kmax`` = max(k) when the caller knows it
    (saves a device sync)."""
    if kmax is None:
        kmax = int(k.max())
    top = torch.topk(scores, kmax, dim=-1).values  # [n, kmax], descending
    threshold = top.gather(1, (k - 1).unsqueeze(1))
    return scores.masked_fill(scores < threshold, float("-inf"))


def _top_p_threshold(sorted_probs: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """The smallest kept probability per row, given descending probabilities: a token is kept
    when the mass strictly before it is < p (so at least one is always kept)."""
    cum = sorted_probs.cumsum(dim=-1)
    before = cum - sorted_probs
    n_keep = (before < p.unsqueeze(1)).sum(dim=-1).clamp(min=1)
    return sorted_probs.gather(1, (n_keep - 1).unsqueeze(1))


def apply_top_p(scores: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """Nucleus filter: keep the most likely tokens until their mass reaches p. scores [n, V];
    p [n] in (0, 1]. Looks at the best ``_TOP_P_CANDIDATES`` tokens first and sorts the whole
    row only for rows whose candidates hold less than p."""
    probs = torch.softmax(scores, dim=-1)
    vocab = scores.shape[-1]
    n_cand = min(vocab, _TOP_P_CANDIDATES)
    cand = torch.topk(probs, n_cand, dim=-1).values
    threshold = _top_p_threshold(cand, p)
    # Rows whose candidates hold less than p may keep tokens beyond them.
    short = cand.sum(dim=-1) < p if n_cand < vocab else torch.zeros_like(p, dtype=torch.bool)
    if bool(short.any()):
        rows = short.nonzero().flatten()
        full = torch.sort(probs[rows], dim=-1, descending=True).values
        threshold[rows] = _top_p_threshold(full, p[rows])
    return scores.masked_fill(probs < threshold, float("-inf"))


def apply_min_p(scores: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Keep tokens whose probability is at least ``min_p`` times the row's largest."""
    probs = torch.softmax(scores, dim=-1)
    threshold = probs.max(dim=-1, keepdim=True).values * min_p.unsqueeze(1)
    return scores.masked_fill(probs < threshold, float("-inf"))


# ---------------------------------------------------------------------------------------------

class Sampler:
    """Samples one token per row of logits. Stateless; one instance serves every step.

    On CUDA, rows without top-k/top-p/min-p go through the fused Triton Gumbel-argmax kernel
    (same tokens as the torch path); filtered rows and every row on CPU use torch.
    """

    def __call__(self, logits: torch.Tensor, batch: SamplingBatch) -> SamplerOutput:
        if logits.dim() != 2 or logits.shape != (batch.num_rows, batch.vocab_size):
            raise ValueError(f"logits: expected shape ({batch.num_rows}, {batch.vocab_size}), "
                             f"got {tuple(logits.shape)}")
        if logits.dtype != torch.float32:
            raise ValueError(f"logits: expected float32, got {logits.dtype}")
        raw = logits
        processed = logits
        if batch.edits.num_entries:
            processed = logits.clone()
            apply_logit_edits(processed, batch.edits)

        filtered = batch.filtered_rows
        if not filtered:
            token_ids = gumbel_argmax(processed, batch.inv_temperature, batch.greedy,
                                      batch.key1, batch.key2)
        else:
            token_ids = torch.empty(batch.num_rows, dtype=torch.int64, device=logits.device)
            skip = set(filtered)
            plain = [i for i in range(batch.num_rows) if i not in skip]
            if plain:
                idx = device_tensor(plain, torch.int64, logits.device)
                token_ids[idx] = gumbel_argmax(processed[idx], batch.inv_temperature[idx],
                                               batch.greedy[idx], batch.key1[idx],
                                               batch.key2[idx])
            token_ids[filtered] = self._sample_filtered(processed, batch, filtered)

        out = SamplerOutput(token_ids=token_ids)
        k = batch.max_num_logprobs
        if k is not None:
            self._fill_logprobs(out, raw, k)
        return out

    @staticmethod
    def _sample_filtered(processed: torch.Tensor, batch: SamplingBatch,
                         rows: list[int]) -> torch.Tensor:
        idx = device_tensor(rows, torch.int64, processed.device)
        scores = processed[idx] * batch.inv_temperature[idx, None]
        pos = {r: j for j, r in enumerate(rows)}

        def top_k(scores: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
            return apply_top_k(scores, k, batch.max_top_k)

        for which, values, fn in ((batch.top_k_rows, batch.top_k, top_k),
                                  (batch.top_p_rows, batch.top_p, apply_top_p),
                                  (batch.min_p_rows, batch.min_p, apply_min_p)):
            if not which:
                continue
            sub = device_tensor([pos[r] for r in which], torch.int64, processed.device)
            orig = device_tensor(which, torch.int64, processed.device)
            scores[sub] = fn(scores[sub], values[orig])
        scores = scores + gumbel_noise(batch.key1[idx], batch.key2[idx], batch.vocab_size)
        return scores.argmax(dim=-1)

    @staticmethod
    def _fill_logprobs(out: SamplerOutput, raw: torch.Tensor, k: int) -> None:
        logprobs = torch.log_softmax(raw, dim=-1)
        chosen = logprobs.gather(1, out.token_ids.unsqueeze(1))
        out.logprobs = chosen.squeeze(1)
        out.ranks = (logprobs > chosen).sum(dim=-1) + 1
        top = torch.topk(logprobs, k, dim=-1)
        out.top_logprobs = top.values
        out.top_ids = top.indices
