"""One step's sampling state: the rows to sample, turned into tensors on the logits' device.

A row's parameters were validated once, when its :class:`SamplingParams` was built (and its
token ids against the vocabulary when the engine admitted the request), so building a batch
only converts: it reads each row's settings and lays them out as the sampler's tensors.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np
import torch

from tallow.kernels.gumbel import row_keys_array
from tallow.kernels.host import device_tensor
from tallow.kernels.sampling import LogitEdits

from .params import SamplingParams


@dataclass
class RowParams:
    """One row to sample: its request's params, its tokens so far, effective seed and step.

    ``seed`` None means unseeded; ``step`` is the index of the token being sampled in its
    sequence (``len(output_token_ids)``).
    """

    params: SamplingParams
    output_token_ids: list[int]
    prompt_token_ids: list[int]
    seed: int | None
    step: int


def _check_token(field: str, token: object, vocab_size: int) -> int:
    if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < vocab_size:
        raise ValueError(f"{field}: token id {token!r} is not an integer in [0, {vocab_size})")
    return token


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
    #: the packed token masks of the rows constrained by a grammar ([M, ceil(V / 32)] int32 on
    #: the logits' device, see :mod:`tallow.plugin.grammar`) and which rows they are ([M]
    #: int64, or None when every row has one, mask i for row i); set by the engine once the
    #: rows' grammars are up to date; no mask when no row is constrained
    grammar_bitmask: torch.Tensor | None = None
    grammar_rows: torch.Tensor | None = None

    @property
    def max_num_logprobs(self) -> int | None:
        asked = [k for k in self.num_logprobs if k is not None]
        return max(asked) if asked else None

    @property
    def filtered_rows(self) -> list[int]:
        """Rows that use top-k, top-p or min-p (and so take the torch filtering path)."""
        return sorted(set(self.top_k_rows) | set(self.top_p_rows) | set(self.min_p_rows))

    @classmethod
    def build(
        cls,
        rows: list[RowParams],
        vocab_size: int,
        device: torch.device | str,
        eos_token_ids: Iterable[int] | None = None,
        generator: torch.Generator | None = None,
    ) -> "SamplingBatch":
        """Turn per-row params into batch tensors on ``device``.

        ``eos_token_ids`` are masked (with each row's ``stop_token_ids``) while a row has fewer
        than ``min_tokens`` outputs, unless it sets ``ignore_eos``. Unseeded rows draw their seed
        for this step from ``generator`` (CPU; torch's default generator if None). Raises
        ValueError naming the field for a token id outside the vocabulary (``eos_token_ids``,
        the rows' output and prompt tokens) or a negative step.
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
            p = row.params
            is_greedy = p.greedy
            greedy.append(is_greedy)
            inv_temp.append(1.0 if is_greedy else 1.0 / p.temperature)
            top_k.append(vocab_size if p.top_k <= 0 or p.top_k >= vocab_size else p.top_k)
            top_p.append(p.top_p)
            min_p.append(p.min_p)
            rep.append(p.repetition_penalty)
            freq.append(p.frequency_penalty)
            pres.append(p.presence_penalty)
            num_logprobs.append(p.logprobs)
            if row.step < 0:
                raise ValueError(f"step: expected >= 0, got {row.step}")
            seeds.append(row.seed)
            steps.append(int(row.step))
            if p.logit_bias:
                for tok, b in p.logit_bias.items():
                    bias_rows.append(i)
                    bias_tokens.append(tok)
                    bias_values.append(b)
            if len(row.output_token_ids) < p.min_tokens:
                masked = list(p.stop_token_ids)
                if not p.ignore_eos:
                    masked.extend(eos)
                mask_rows.extend([i] * len(masked))
                mask_tokens.extend(masked)
            if p.frequency_penalty != 0.0 or p.presence_penalty != 0.0:
                counted_rows.append(i)
            if p.repetition_penalty != 1.0:
                repeated_rows.append(i)

        outputs = [rows[i].output_token_ids for i in counted_rows]
        repeated = [rows[i].prompt_token_ids for i in repeated_rows] + [
            rows[i].output_token_ids for i in repeated_rows
        ]
        dev = torch.device(device)
        edits = LogitEdits.from_parts(
            vocab_size,
            dev,
            bias=(
                np.array(bias_rows, dtype=np.int64),
                np.array(bias_tokens, dtype=np.int64),
                np.array(bias_values, dtype=np.float64),
            ),
            masked=(np.array(mask_rows, dtype=np.int64), np.array(mask_tokens, dtype=np.int64)),
            counted=_flatten("output_token_ids", counted_rows, outputs, vocab_size),
            repeated=_flatten("prompt_token_ids", repeated_rows * 2, repeated, vocab_size),
            repetition_penalty=rep,
            frequency_penalty=freq,
            presence_penalty=pres,
        )

        unseeded = [i for i, s in enumerate(seeds) if s is None]
        if unseeded:
            fresh = torch.randint(0, 2**62, (len(unseeded),), generator=generator).tolist()
            for i, s in zip(unseeded, fresh):
                seeds[i] = s
        mask64 = (1 << 64) - 1
        seeded = [s for s in seeds if s is not None]
        assert len(seeded) == len(seeds)  # every unseeded row drew a seed above
        keys1, keys2 = row_keys_array(
            np.array([s & mask64 for s in seeded], dtype=np.uint64),
            np.array(steps, dtype=np.uint64),
        )

        def t(values: Sequence[int] | Sequence[float], dtype: torch.dtype) -> torch.Tensor:
            return device_tensor(values, dtype, dev)

        sampled = [i for i in range(n) if not greedy[i]]
        top_k_rows = [i for i in sampled if top_k[i] < vocab_size]
        return cls(
            num_rows=n,
            vocab_size=vocab_size,
            greedy=t(greedy, torch.bool),
            inv_temperature=t(inv_temp, torch.float32),
            top_k=t(top_k, torch.int64),
            top_p=t(top_p, torch.float32),
            min_p=t(min_p, torch.float32),
            key1=device_tensor(keys1, torch.int64, dev),
            key2=device_tensor(keys2, torch.int64, dev),
            edits=edits,
            num_logprobs=num_logprobs,
            all_greedy=not sampled,
            top_k_rows=top_k_rows,
            max_top_k=max((top_k[i] for i in top_k_rows), default=0),
            top_p_rows=[i for i in sampled if top_p[i] < 1.0],
            min_p_rows=[i for i in sampled if min_p[i] > 0.0],
        )


def _flatten(
    field: str, row_ids: list[int], token_lists: list[list[int]], vocab_size: int
) -> tuple[np.ndarray, np.ndarray]:
    """(rows, tokens) int64 arrays: ``token_lists[j]`` belongs to row ``row_ids[j]``; token ids
    are checked against the vocabulary (the error names ``field``)."""
    lengths = [len(x) for x in token_lists]
    total = sum(lengths)
    tokens = np.fromiter(itertools.chain.from_iterable(token_lists), dtype=np.int64, count=total)
    if total and (int(tokens.min()) < 0 or int(tokens.max()) >= vocab_size):
        bad = tokens[(tokens < 0) | (tokens >= vocab_size)][0]
        raise ValueError(f"{field}: token id {int(bad)} is not in [0, {vocab_size})")
    return np.repeat(np.array(row_ids, dtype=np.int64), lengths), tokens
