"""The gated delta rule (Gated DeltaNet linear attention) over state slots.

Per value head, with a state ``S`` of ``[Dk, Dv]`` (float32), token ``t`` updates and reads::

    S <- exp(g_t) * S
    S <- S + k_t (beta_t * (v_t - k_t^T S))^T        (the delta rule: write the correction)
    o_t = S^T (q_t * Dk ** -0.5)

``q``/``k`` are L2-normalised first (``qk_l2norm``, as Qwen3-Next does: ``x * rsqrt(sum x^2 +
1e-6)`` in float32). With fewer key heads than value heads, value head ``h`` reads key head
``h // (Hv // Hk)`` (consecutive value heads share one key head).

The gating of Qwen3-Next (:func:`gdn_gating`): ``g = -exp(A_log) * softplus(a + dt_bias)``,
``beta = sigmoid(b)``, from the layer's projections ``a`` and ``b`` (``[T, Hv]``).

Sequences of a step are flat (``query_start_loc``, as attention metadata gives them); sequence
``i`` starts from ``state[slots[i]]`` and leaves its final state there (in place). The engine
zeroes a slot when a sequence takes it, so a first chunk starts from zero and later chunks of
a chunked prefill carry the state.

Entry points (the Triton kernels on CUDA tensors, the references elsewhere):

* :func:`chunk_gated_delta_rule`: prefill, any number of tokens per sequence;
* :func:`gated_delta_step`: decode, one token per sequence, its gating fused.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ._dispatch import triton_enabled

__all__ = [
    "gdn_gating",
    "l2_normalize",
    "chunk_gated_delta_rule",
    "chunk_gated_delta_rule_ref",
    "gated_delta_step",
    "gated_delta_step_ref",
    "recurrent_gated_delta_rule_ref",
]

#: the tokens of one chunk of the chunked form (its triangular solve is this size)
CHUNK = 64
#: the epsilon of Qwen3-Next's L2 normalisation of q and k
L2_EPS = 1e-6


def gdn_gating(
    a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Qwen3-Next's gates from ``a``, ``b`` ``[T, Hv]``: (``g`` log-decay, ``beta``), both
    float32 ``[T, Hv]``."""
    g = -A_log.float().exp() * F.softplus(a.float() + dt_bias.float())
    return g, b.float().sigmoid()


def l2_normalize(x: torch.Tensor) -> torch.Tensor:
    """``x * rsqrt(sum(x^2) + 1e-6)`` over the last dimension, in float32."""
    x = x.float()
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + L2_EPS)


def _check(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    gates: tuple[torch.Tensor, ...],
    state: torch.Tensor,
    slots: torch.Tensor,
    names: tuple[str, ...],
) -> None:
    if q.dim() != 3 or k.shape != q.shape:
        raise ValueError(
            f"q, k: expected [T, Hk, Dk] alike, got {tuple(q.shape)} and {tuple(k.shape)}"
        )
    t, hk, dk = q.shape
    if v.dim() != 3 or v.shape[0] != t or v.shape[1] % hk:
        raise ValueError(
            f"v: expected [{t}, Hv, Dv] with Hv a multiple of {hk}, got {tuple(v.shape)}"
        )
    hv, dv = v.shape[1], v.shape[2]
    for name, gate in zip(names, gates):
        if gate.shape != (t, hv):
            raise ValueError(f"{name}: expected [{t}, {hv}], got {tuple(gate.shape)}")
    if state.dim() != 4 or tuple(state.shape[1:]) != (hv, dk, dv) or state.dtype != torch.float32:
        raise ValueError(
            f"state: expected float32 [slots + 1, {hv}, {dk}, {dv}], got "
            f"{state.dtype} {tuple(state.shape)}"
        )
    if slots.dim() != 1 or slots.dtype != torch.int64:
        raise ValueError(
            f"slots: expected int64 [num_seqs], got {slots.dtype} {tuple(slots.shape)}"
        )


def _heads(x: torch.Tensor, hv: int) -> torch.Tensor:
    """Key heads repeated for the value heads that share them."""
    return x.repeat_interleave(hv // x.shape[-2], dim=-2) if x.shape[-2] != hv else x


def recurrent_gated_delta_rule_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    *,
    scale: float | None = None,
    qk_l2norm: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence token by token: ``q``/``k`` ``[L, Hk, Dk]``, ``v`` ``[L, Hv, Dv]``, ``g``/
    ``beta`` ``[L, Hv]`` from ``state`` ``[Hv, Dk, Dv]``; returns (outputs ``[L, Hv, Dv]`` in
    ``v``'s dtype, the final float32 state)."""
    hv = v.shape[1]
    if qk_l2norm:
        q, k = l2_normalize(q), l2_normalize(k)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    q, k = _heads(q.float(), hv) * scale, _heads(k.float(), hv)
    s = state.float().clone()
    out = torch.empty(v.shape, dtype=torch.float32, device=v.device)
    for t in range(v.shape[0]):
        s = s * g[t].float().exp()[:, None, None]
        read = torch.einsum("hkv,hk->hv", s, k[t])
        delta = (v[t].float() - read) * beta[t].float()[:, None]
        s = s + k[t][:, :, None] * delta[:, None, :]
        out[t] = torch.einsum("hkv,hk->hv", s, q[t])
    return out.to(v.dtype), s


def _chunked_one(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    s0: torch.Tensor,
    chunk: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The chunked form of one sequence (float32, heads first: ``q``/``k`` ``[H, L, Dk]``
    normalised and scaled, ``v`` ``[H, L, Dv]``, ``g``/``beta`` ``[H, L]``).

    Inside a chunk, with ``G_t`` the decay from the chunk's start to ``t`` and ``S0`` the state
    before it, the corrections ``u_t = beta_t (v_t - k_t^T S_{t-1})`` solve the unit lower
    triangular system ``(I + A) U = beta V - beta G K S0`` with ``A_tj = beta_t (G_t / G_j)
    k_t . k_j`` (``j < t``); then ``o_t = G_t q_t^T S0 + sum_{j<=t} (G_t / G_j) (q_t . k_j)
    u_j`` and ``S = G_C S0 + sum_j (G_C / G_j) k_j u_j^T``. Padding tokens (``g = beta = 0``,
    zero ``k``) change nothing."""
    h, length, dk = k.shape
    pad = -length % chunk
    if pad:
        q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
        g, beta = F.pad(g, (0, pad)), F.pad(beta, (0, pad))
    n = (length + pad) // chunk
    q, k, v = (x.reshape(h, n, chunk, x.shape[-1]) for x in (q, k, v))
    gc = g.reshape(h, n, chunk).cumsum(-1)
    beta = beta.reshape(h, n, chunk)
    causal = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril()
    # decay from j to t inside a chunk (t >= j); zero above the diagonal
    decay = (gc[..., :, None] - gc[..., None, :]).masked_fill(~causal, float("-inf")).exp()
    kk = k @ k.transpose(-1, -2)
    system = torch.eye(chunk, device=q.device) + (beta[..., None] * kk * decay).tril(-1)
    rhs_v = beta[..., None] * v
    rhs_k = (beta * gc.exp())[..., None] * k
    w_v = torch.linalg.solve_triangular(system, rhs_v, upper=False, unitriangular=True)
    w_k = torch.linalg.solve_triangular(system, rhs_k, upper=False, unitriangular=True)
    qk = (q @ k.transpose(-1, -2)) * decay
    s = s0
    out = torch.empty_like(v)
    for c in range(n):
        u = w_v[:, c] - w_k[:, c] @ s
        out[:, c] = (q[:, c] * gc[:, c, :, None].exp()) @ s + qk[:, c] @ u
        to_end = (gc[:, c, -1:] - gc[:, c]).exp()
        s = (
            s * gc[:, c, -1].exp()[:, None, None]
            + (k[:, c] * to_end[..., None]).transpose(-1, -2) @ u
        )
    return out.reshape(h, n * chunk, -1)[:, :length], s


def chunk_gated_delta_rule_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    slots: torch.Tensor,
    query_start_loc: torch.Tensor | list[int],
    *,
    scale: float | None = None,
    qk_l2norm: bool = True,
    chunk: int = CHUNK,
) -> torch.Tensor:
    """Plain-torch reference of :func:`chunk_gated_delta_rule` (same contract), in the chunked
    form (see :func:`_chunked_one`)."""
    _check(q, k, v, (g, beta), state, slots, ("g", "beta"))
    starts = (
        query_start_loc.tolist()
        if isinstance(query_start_loc, torch.Tensor)
        else list(query_start_loc)
    )
    hv = v.shape[1]
    if qk_l2norm:
        q, k = l2_normalize(q), l2_normalize(k)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    q, k = _heads(q.float(), hv) * scale, _heads(k.float(), hv)
    out = torch.zeros(v.shape, dtype=torch.float32, device=v.device)
    for i, slot in enumerate(slots.tolist()):
        a, e = starts[i], starts[i + 1]
        if e == a:
            continue
        o, s = _chunked_one(
            q[a:e].transpose(0, 1),
            k[a:e].transpose(0, 1),
            v[a:e].float().transpose(0, 1),
            g[a:e].float().T,
            beta[a:e].float().T,
            state[slot],
            chunk,
        )
        out[a:e] = o.transpose(0, 1)
        state[slot] = s
    return out.to(v.dtype)


def chunk_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    slots: torch.Tensor,
    query_start_loc: torch.Tensor,
    *,
    max_query_len: int | None = None,
    query_start_loc_cpu: list[int] | None = None,
    scale: float | None = None,
    qk_l2norm: bool = True,
) -> torch.Tensor:
    """The gated delta rule over a step's flat sequences (see the module docstring).

    ``q``/``k`` ``[T, Hk, Dk]``, ``v`` ``[T, Hv, Dv]``, ``g``/``beta`` ``[T, Hv]`` (from
    :func:`gdn_gating`), ``state`` float32 ``[slots + 1, Hv, Dk, Dv]`` updated in place at
    ``slots`` ``[N]`` (int64), ``query_start_loc`` ``[N + 1]`` (int32, on the device).
    ``max_query_len`` (the longest sequence) sizes the Triton grid; ``query_start_loc_cpu``
    spares the reference a copy from the device. Returns ``[T, Hv, Dv]`` in ``v``'s dtype
    (rows of no sequence are zero)."""
    _check(q, k, v, (g, beta), state, slots, ("g", "beta"))
    if triton_enabled(q) and q.shape[0]:
        from ._gated_delta_triton import chunk_gated_delta_rule_triton

        return chunk_gated_delta_rule_triton(
            q,
            k,
            v,
            g,
            beta,
            state,
            slots,
            query_start_loc,
            max_query_len=max_query_len or q.shape[0],
            scale=scale,
            qk_l2norm=qk_l2norm,
        )
    starts = query_start_loc_cpu if query_start_loc_cpu is not None else query_start_loc
    return chunk_gated_delta_rule_ref(
        q, k, v, g, beta, state, slots, starts, scale=scale, qk_l2norm=qk_l2norm
    )


def gated_delta_step_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    state: torch.Tensor,
    slots: torch.Tensor,
    *,
    scale: float | None = None,
    qk_l2norm: bool = True,
) -> torch.Tensor:
    """Plain-torch reference of :func:`gated_delta_step` (same contract)."""
    _check(q, k, v, (a, b), state, slots, ("a", "b"))
    g, beta = gdn_gating(a, b, A_log, dt_bias)
    hv = v.shape[1]
    if qk_l2norm:
        q, k = l2_normalize(q), l2_normalize(k)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    q, k = _heads(q.float(), hv) * scale, _heads(k.float(), hv)
    s = state.index_select(0, slots) * g.exp()[:, :, None, None]
    read = torch.einsum("nhkv,nhk->nhv", s, k)
    delta = (v.float() - read) * beta[:, :, None]
    s = s + k[..., None] * delta[:, :, None, :]
    state.index_copy_(0, slots, s)
    return torch.einsum("nhkv,nhk->nhv", s, q).to(v.dtype)


def gated_delta_step(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    state: torch.Tensor,
    slots: torch.Tensor,
    *,
    scale: float | None = None,
    qk_l2norm: bool = True,
) -> torch.Tensor:
    """One token per sequence (decode): row ``i`` of ``q``/``k`` ``[N, Hk, Dk]``, ``v`` ``[N,
    Hv, Dv]``, ``a``/``b`` ``[N, Hv]`` (the raw gate projections; the gating of
    :func:`gdn_gating` is applied here with ``A_log`` and ``dt_bias`` ``[Hv]``) updates
    ``state[slots[i]]`` in place. Padding rows of a CUDA graph point at the dummy slot.
    Returns ``[N, Hv, Dv]`` in ``v``'s dtype. No host synchronisation: capturable."""
    _check(q, k, v, (a, b), state, slots, ("a", "b"))
    if slots.shape[0] != q.shape[0]:
        raise ValueError(f"slots: expected one per row ({q.shape[0]}), got {slots.shape[0]}")
    if triton_enabled(q) and q.shape[0]:
        from ._gated_delta_triton import gated_delta_step_triton

        return gated_delta_step_triton(
            q, k, v, a, b, A_log, dt_bias, state, slots, scale=scale, qk_l2norm=qk_l2norm
        )
    return gated_delta_step_ref(
        q, k, v, a, b, A_log, dt_bias, state, slots, scale=scale, qk_l2norm=qk_l2norm
    )
