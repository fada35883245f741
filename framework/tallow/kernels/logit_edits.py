"""One step's sparse logit edits (biases, masks, penalty counts) as unique ``(row, token)``
entries: what :func:`tallow.kernels.sampling.apply_logit_edits` applies, in its own module
because both the torch reference and the Triton kernel (:mod:`._sampling_triton`) take it."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from numpy.typing import ArrayLike

from .host import device_tensor


@dataclass
class LogitEdits:
    """Unique ``(row, token)`` entries [E] and the per-row penalties [N] they use."""

    rows: torch.Tensor  # [E] int64
    tokens: torch.Tensor  # [E] int64
    bias: torch.Tensor  # [E] float32
    masked: torch.Tensor  # [E] bool
    counts: torch.Tensor  # [E] float32, occurrences in the output tokens
    in_rep: torch.Tensor  # [E] bool, token in prompt+output and the row's penalty != 1
    repetition_penalty: torch.Tensor  # [N] float32
    frequency_penalty: torch.Tensor  # [N] float32
    presence_penalty: torch.Tensor  # [N] float32

    @property
    def num_entries(self) -> int:
        return int(self.rows.shape[0])

    @classmethod
    def from_parts(
        cls,
        vocab_size: int,
        device: torch.device,
        bias: tuple[np.ndarray, np.ndarray, np.ndarray],
        masked: tuple[np.ndarray, np.ndarray],
        counted: tuple[np.ndarray, np.ndarray],
        repeated: tuple[np.ndarray, np.ndarray],
        repetition_penalty: list[float],
        frequency_penalty: list[float],
        presence_penalty: list[float],
    ) -> "LogitEdits":
        """Merge per-source ``(rows, tokens[, values])`` int64 arrays into unique entries.

        ``bias``: (rows, tokens, float values), each (row, token) at most once. ``masked``:
        tokens to mask. ``counted``: one entry per output token of rows with frequency/presence
        penalties (repeats count). ``repeated``: prompt and output tokens of rows with a
        repetition penalty (repeats allowed). The merge (a sort) runs on ``device``.
        """
        parts = [bias[:2], masked, counted, repeated]
        sizes = [int(r.shape[0]) for r, _ in parts]
        keys = np.concatenate(
            [r.astype(np.int64) * vocab_size + t.astype(np.int64) for r, t in parts]
        )

        def t(values: ArrayLike, dtype: torch.dtype) -> torch.Tensor:
            return device_tensor(values, dtype, device)

        penalties = dict(
            repetition_penalty=t(repetition_penalty, torch.float32),
            frequency_penalty=t(frequency_penalty, torch.float32),
            presence_penalty=t(presence_penalty, torch.float32),
        )
        if keys.size == 0:
            empty_i, empty_f = t([], torch.int64), t([], torch.float32)
            return cls(
                rows=empty_i,
                tokens=empty_i,
                bias=empty_f,
                masked=t([], torch.bool),
                counts=empty_f,
                in_rep=t([], torch.bool),
                **penalties,
            )
        if device.type == "cpu":  # numpy's sort-based unique is much faster than torch's here
            u, inv = np.unique(keys, return_inverse=True)
            unique, inverse = torch.from_numpy(u), torch.from_numpy(inv.reshape(-1))
        else:
            unique, inverse = torch.unique(t(keys, torch.int64), sorted=True, return_inverse=True)
        n = unique.shape[0]
        inv_bias, inv_masked, inv_counted, inv_repeated = torch.split(inverse, sizes)
        bias_t = torch.zeros(n, dtype=torch.float32, device=device)
        bias_t[inv_bias] = t(bias[2], torch.float32)
        masked_t = torch.zeros(n, dtype=torch.bool, device=device)
        masked_t[inv_masked] = True
        counts = torch.zeros(n, dtype=torch.float32, device=device)
        # integer-valued float adds are exact in any order, so this is deterministic
        counts.index_add_(0, inv_counted, torch.ones(sizes[2], device=device))
        in_rep = torch.zeros(n, dtype=torch.bool, device=device)
        in_rep[inv_repeated] = True
        return cls(
            rows=torch.div(unique, vocab_size, rounding_mode="floor"),
            tokens=unique % vocab_size,
            bias=bias_t,
            masked=masked_t,
            counts=counts,
            in_rep=in_rep,
            **penalties,
        )
