"""Per-head statistics that make keys and values cheaper to quantize, computed from a
model's queries, keys and values over the engine's calibration text.

Both transforms are exact for attention, so the only cost of a poor calibration is accuracy:

- **Key offset** ``m`` (mean key of the head): a key is stored less ``m``. Every key of the
  head then differs from the original by the same ``m``, which adds ``q . m`` to all of a
  query's scores; the softmax cancels it. (Not under a logit softcap, which is not
  shift-invariant: there the offset stays zero.)
- **Key smoothing** ``s`` (per channel): a key is stored divided by ``s`` and the query
  multiplied by it, which leaves ``q . k`` unchanged. The error of a score is
  ``sum_c q_c s_c e_c`` for an error ``e`` that a rotation spreads evenly over the stored
  channels; for channel energies ``a_c = E[q_c^2]`` and key variances ``b_c``, the expected
  squared error ``(sum_c a_c s_c^2)(sum_c b_c / s_c^2)`` is least at
  ``s_c = (b_c / a_c) ** 0.25`` (Cauchy–Schwarz). It moves precision to the channels that
  queries read, which matters most where keys are large and scores sharp (Qwen2.5-0.5B's
  first layer).
- **Value offset** ``m_v``: a value is stored less ``m_v`` and ``m_v`` is added back to the
  attention output (the weights of a softmax sum to one).
"""

from __future__ import annotations

import torch

#: channels' smoothing factors are kept within this factor of their root mean square
SMOOTH_RANGE = 100.0


def key_offset(k: torch.Tensor) -> torch.Tensor:
    """Mean key [Hkv, D] of ``k`` [N, Hkv, D]."""
    return k.float().mean(dim=0)


def key_smoothing(q: torch.Tensor, k: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
    """Per-channel factors ``s`` [Hkv, D] for queries ``q`` [N, Hq, D] and keys ``k``
    [N, Hkv, D] less ``offset``: ``(var(k_c) / E[q_c^2]) ** 0.25`` over the query heads that
    read each KV head, scaled to a root mean square of 1 and kept within
    :data:`SMOOTH_RANGE` of it (channels with no variance or no query energy stay finite)."""
    n, hkv, d = k.shape
    group = q.shape[1] // hkv
    energy = q.float().reshape(n, hkv, group, d).pow(2).mean(dim=(0, 2))
    variance = (k.float() - offset).pow(2).mean(dim=0)
    tiny = torch.finfo(torch.float32).tiny
    energy = torch.maximum(energy, energy.mean(dim=-1, keepdim=True) * 1e-8 + tiny)
    variance = torch.maximum(variance, variance.mean(dim=-1, keepdim=True) * 1e-8 + tiny)
    s = (variance / energy).pow(0.25)
    s = s / s.pow(2).mean(dim=-1, keepdim=True).sqrt()
    return s.clamp(1 / SMOOTH_RANGE, SMOOTH_RANGE)


def value_offset(v: torch.Tensor) -> torch.Tensor:
    """Mean value [Hkv, D] of ``v`` [N, Hkv, D]."""
    return v.float().mean(dim=0)
