"""Qwen3-Next and Qwen3.5 from llama.cpp's GGUF files (``qwen3next``, ``qwen35``,
``qwen35moe``): the config from the metadata, and the tensors as llama.cpp's converter changed
them put back in the Hugging Face layout the model holds.

Metadata → config (``<arch>.`` keys; the generic GGUF mapping has already read the sizes,
heads, norm epsilon, RoPE base and rotated features):

=================================== ==========================================================
``ssm.group_count``                 ``linear_num_key_heads``
``ssm.time_step_rank``              ``linear_num_value_heads``
``ssm.state_size``                  ``linear_key_head_dim``
``ssm.inner_size``                  ``linear_value_head_dim`` × ``linear_num_value_heads``
``ssm.conv_kernel``                 ``linear_conv_kernel_dim``
``full_attention_interval``         ``layer_types``: every interval-th layer full attention
                                    (llama.cpp's default 4 when absent)
``block_count``,                    ``num_hidden_layers``: the blocks past the main ones are
``nextn_predict_layers``            multi-token-prediction layers, skipped
``expert_count``, ``expert_used_count``, ``expert_feed_forward_length``,
``expert_shared_feed_forward_length`` the experts (every layer), top-k renormalised unless
                                    ``expert_weights_norm`` says otherwise
=================================== ==========================================================

What the converter changed, undone here: RMSNorm weights of the ``1 + weight`` form are stored
with the 1 added (every norm but the linear-attention layer's gated one); ``A_log`` is stored
as ``-exp(A_log)`` (``ssm_a``); the convolution's ``[C, 1, K]`` as ``[C, K]``; and in ``qwen35``
/ ``qwen35moe`` files the value heads of the linear-attention layers are tiled (``[v0 of every
key head, v1 of every key head, ...]``) instead of grouped by key head, along the rows of
``attn_qkv`` (its value part), ``attn_gate``, ``ssm_beta``, ``ssm_alpha``, along ``ssm_a``,
``ssm_dt``, the value channels of ``ssm_conv1d`` and the columns of ``ssm_out``.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

import torch

from tallow.layers import QuantizedWeight, WeightLoadError, WeightNameMap

from .naming import MainBlockNames


def _value(metadata: Mapping[str, Any], key: str) -> Any:
    arch = metadata.get("general.architecture")
    return metadata.get(f"{arch}.{key}")


def _count(metadata: Mapping[str, Any], key: str, *, required: bool = True) -> int | None:
    value = _value(metadata, key)
    if value is None:
        if required:
            arch = metadata.get("general.architecture")
            raise ValueError(f"GGUF metadata '{arch}.{key}' is missing; the model needs it")
        return None
    if isinstance(value, list):  # a per-layer list that must hold one value
        if len(set(value)) != 1:
            raise ValueError(f"GGUF metadata '{key}': per-layer values {value} are not supported")
        value = value[0]
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"GGUF metadata '{key}': {value!r} is not a count")
    return value


def hybrid_config_from_gguf(
    metadata: Mapping[str, Any],
    config: Mapping[str, Any],
    *,
    hf_architecture: str,
    model_type: str,
    experts: bool | None,
) -> dict[str, Any]:
    """The HF-style config of a hybrid GGUF file (see the module docstring). ``experts``:
    True when the family always has them (``qwen35moe``), False when never (``qwen35``),
    None when the file decides (``qwen3next``)."""
    cfg = dict(config)
    cfg["architectures"] = [hf_architecture]
    cfg["model_type"] = model_type
    blocks = _count(metadata, "block_count")
    assert blocks is not None
    nextn = _count(metadata, "nextn_predict_layers", required=False) or 0
    layers = blocks - nextn
    if layers < 1:
        raise ValueError(
            f"GGUF metadata: block_count {blocks} leaves no decoder layer beside "
            f"nextn_predict_layers {nextn}"
        )
    cfg["num_hidden_layers"] = layers
    value_heads = _count(metadata, "ssm.time_step_rank")
    inner = _count(metadata, "ssm.inner_size")
    assert value_heads is not None and inner is not None
    if not value_heads or inner % value_heads:
        raise ValueError(
            f"GGUF metadata: ssm.inner_size {inner} is not a multiple of "
            f"ssm.time_step_rank {value_heads} (the value heads)"
        )
    cfg["linear_num_key_heads"] = _count(metadata, "ssm.group_count")
    cfg["linear_num_value_heads"] = value_heads
    cfg["linear_key_head_dim"] = _count(metadata, "ssm.state_size")
    cfg["linear_value_head_dim"] = inner // value_heads
    cfg["linear_conv_kernel_dim"] = _count(metadata, "ssm.conv_kernel")
    interval = _count(metadata, "full_attention_interval", required=False) or 4
    cfg["full_attention_interval"] = interval
    cfg["layer_types"] = [
        "full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(layers)
    ]
    n_experts = _count(metadata, "expert_count", required=False) or 0
    if experts is True and not n_experts:
        raise ValueError(
            "GGUF metadata expert_count is missing or zero: not a mixture-of-experts file"
        )
    if experts is False and n_experts:
        raise ValueError(
            f"GGUF metadata expert_count is {n_experts}: a file with experts is "
            "architecture qwen35moe, not qwen35"
        )
    cfg.pop("num_experts", None)
    if n_experts:
        cfg["num_experts"] = n_experts
        cfg["num_experts_per_tok"] = _count(metadata, "expert_used_count")
        cfg["moe_intermediate_size"] = _count(metadata, "expert_feed_forward_length")
        cfg["shared_expert_intermediate_size"] = _count(
            metadata, "expert_shared_feed_forward_length"
        )
        norm = _value(metadata, "expert_weights_norm")
        cfg["norm_topk_prob"] = True if norm is None else bool(norm)
        cfg["decoder_sparse_step"] = 1
        cfg["mlp_only_layers"] = []
    elif not cfg.get("intermediate_size"):
        raise ValueError(
            "GGUF metadata feed_forward_length is missing; the dense MLP needs it "
            "(intermediate_size)"
        )
    return cfg


def _untile(t: torch.Tensor, dim: int, key_heads: int, head: int) -> torch.Tensor:
    """Heads of size ``head`` along ``dim`` from tiled ``[per key head, key heads]`` order to
    grouped ``[key heads, per key head]`` order."""
    shape = list(t.shape)
    per_key = shape[dim] // (key_heads * head)
    split = shape[:dim] + [per_key, key_heads, head] + shape[dim + 1 :]
    return t.reshape(split).transpose(dim, dim + 1).reshape(shape)


#: per linear-attention layer, the tensors a file must hold: each entry one name or a tuple of
#: alternatives (each alternative one name or several that go together)
_LINEAR = (
    "ssm_a",
    "ssm_dt.bias",
    "ssm_conv1d.weight",
    "ssm_norm.weight",
    "ssm_out.weight",
    ("ssm_in.weight", "attn_qkv.weight attn_gate.weight"),
    ("ssm_ba.weight", "ssm_beta.weight ssm_alpha.weight"),
)
_FULL = (
    "attn_q.weight",
    "attn_k.weight",
    "attn_v.weight",
    "attn_output.weight",
    "attn_q_norm.weight",
    "attn_k_norm.weight",
)
_MOE = (
    "ffn_gate_inp.weight",
    ("ffn_gate_exps.weight ffn_up_exps.weight", "ffn_gate_up_exps.weight"),
    "ffn_down_exps.weight",
    "ffn_gate_shexp.weight",
    "ffn_up_shexp.weight",
    "ffn_down_shexp.weight",
    "ffn_gate_inp_shexp.weight",
)
_DENSE = ("ffn_gate.weight", "ffn_up.weight", "ffn_down.weight")


def missing_gguf_tensors(
    names: set[str], layer_types: list[str], moe_layers: list[bool]
) -> list[str]:
    """The tensors (or ``a | b c`` alternatives) a hybrid GGUF file lacks for its layers."""
    missing = [n for n in ("token_embd.weight", "output_norm.weight") if n not in names]
    for i, (kind, moe) in enumerate(zip(layer_types, moe_layers)):
        wanted: tuple[Any, ...] = ("attn_norm.weight", "post_attention_norm.weight")
        wanted += _LINEAR if kind == "linear_attention" else _FULL
        wanted += _MOE if moe else _DENSE
        for entry in wanted:
            options = entry if isinstance(entry, tuple) else (entry,)
            sets = [[f"blk.{i}.{n}" for n in option.split()] for option in options]
            if not any(all(n in names for n in group) for group in sets):
                missing.append(" | ".join(" + ".join(group) for group in sets))
    return missing


class GGUFLayout:
    """What the hybrid models add for GGUF files: the name map of their GGUF architecture, the
    transforms its rules name, and a check that names the tensors a file lacks. Mixed into
    :class:`~tallow_model_qwen3_next.model.Qwen3NextForCausalLM`."""

    config: Any
    model: Any

    def gguf_names(self, names: WeightNameMap) -> MainBlockNames:
        return MainBlockNames(names, int(self.config.require("num_hidden_layers")))

    def _gdn(self, groups: dict[str, str]) -> Any:
        return self._linear_attn(groups)  # type: ignore[attr-defined]  # the model's

    # -- transforms named by the GGUF rules (tensor, groups) -> tensor ----------------------
    def gguf_norm(self, t: torch.Tensor, groups: dict[str, str]) -> torch.Tensor:
        """A ``1 + weight`` RMSNorm stored with the 1 added."""
        return t - 1.0

    def gguf_as_row(self, t: torch.Tensor, groups: dict[str, str]) -> torch.Tensor:
        """The shared expert's gate ``[H]`` (or ``[1, H]``) as the linear weight ``[1, H]``."""
        return t.reshape(1, -1)

    def gguf_a_log(self, t: torch.Tensor, groups: dict[str, str]) -> torch.Tensor:
        """``A_log`` from the stored ``-exp(A_log)``."""
        if bool((t >= 0).any()):
            raise ValueError(
                f"GGUF tensor 'blk.{groups['i']}.ssm_a' holds -exp(A_log), so every value "
                f"must be negative; got {t.max().item():g}"
            )
        return torch.log(-t.float()).to(t.dtype)

    def gguf_a_log_tiled(self, t: torch.Tensor, groups: dict[str, str]) -> torch.Tensor:
        return self.gguf_head_rows(self.gguf_a_log(t, groups), groups)

    def gguf_head_rows(self, t: torch.Tensor, groups: dict[str, str]) -> torch.Tensor:
        """One row (or value) per value head, tiled → grouped (``ssm_beta``, ``ssm_alpha``,
        ``ssm_dt``, ``ssm_a``)."""
        gdn = self._gdn(groups)
        self._rows_are(t, gdn.num_v_heads, groups, "a value per value head")
        return _untile(t, 0, gdn.num_k_heads, 1)

    def gguf_value_rows(self, t: torch.Tensor, groups: dict[str, str]) -> torch.Tensor:
        """``attn_gate`` (z): value heads tiled → grouped."""
        gdn = self._gdn(groups)
        self._rows_are(t, gdn.value_dim, groups, "the value heads' rows")
        return _untile(t, 0, gdn.num_k_heads, gdn.head_v_dim)

    def gguf_qkv_rows(self, t: torch.Tensor, groups: dict[str, str]) -> torch.Tensor:
        """``attn_qkv``: q and k rows as they are, the value rows tiled → grouped."""
        gdn = self._gdn(groups)
        self._rows_are(t, gdn.conv_dim, groups, "q, k and v rows")
        qk = 2 * gdn.key_dim
        v = _untile(t[qk:], 0, gdn.num_k_heads, gdn.head_v_dim)
        return torch.cat([t[:qk], v])

    def gguf_out_columns(self, t: torch.Tensor, groups: dict[str, str]) -> torch.Tensor:
        """``ssm_out``: the input columns (value heads) tiled → grouped."""
        gdn = self._gdn(groups)
        if t.dim() != 2 or t.shape[1] != gdn.value_dim:
            raise ValueError(
                f"GGUF tensor 'blk.{groups['i']}.ssm_out.weight': shape {list(t.shape)}, "
                f"expected [hidden, {gdn.value_dim}]"
            )
        return _untile(t, 1, gdn.num_k_heads, gdn.head_v_dim)

    def gguf_conv(self, t: torch.Tensor, groups: dict[str, str]) -> torch.Tensor:
        """``ssm_conv1d`` ``[C, K]`` (``[C, 1, K]`` accepted), checked against the layer."""
        gdn = self._gdn(groups)
        expected = (gdn.conv_dim, gdn.conv_taps)
        if t.dim() == 3 and t.shape[1] == 1:
            t = t[:, 0]
        if tuple(t.shape) != expected:
            raise ValueError(
                f"GGUF tensor 'blk.{groups['i']}.ssm_conv1d.weight': shape "
                f"{list(t.shape)}, expected [{expected[0]}, {expected[1]}] (the "
                "convolution's channels q | k | v, and its taps)"
            )
        return t

    def gguf_conv_tiled(self, t: torch.Tensor, groups: dict[str, str]) -> torch.Tensor:
        t = self.gguf_conv(t, groups)
        gdn = self._gdn(groups)
        qk = 2 * gdn.key_dim
        return torch.cat([t[:qk], _untile(t[qk:], 0, gdn.num_k_heads, gdn.head_v_dim)])

    def _rows_are(self, t: torch.Tensor, rows: int, groups: dict[str, str], what: str) -> None:
        if t.shape[0] != rows:
            raise ValueError(
                f"GGUF block {groups['i']}: a linear-attention tensor has {t.shape[0]} "
                f"rows, expected {rows} ({what})"
            )

    # -- naming the tensors a file lacks -----------------------------------------------------
    def check_gguf_tensors(
        self, names: set[str], layer_types: list[str], moe_layers: list[bool], exc: Exception
    ) -> None:
        missing = missing_gguf_tensors(names, layer_types, moe_layers)
        if missing:
            raise WeightLoadError(
                f"{type(self).__name__}: the GGUF file lacks "
                f"{len(missing)} tensor{'s' if len(missing) > 1 else ''} its layers need: "
                + ", ".join(missing[:12])
                + (f" (and {len(missing) - 12} more)" if len(missing) > 12 else "")
            ) from exc


def recording(
    tensors: Iterable[tuple[str, torch.Tensor | QuantizedWeight]], names: set[str]
) -> Iterable[tuple[str, torch.Tensor | QuantizedWeight]]:
    """``tensors`` as they are, each name added to ``names`` as it passes."""
    for name, tensor in tensors:
        names.add(name)
        yield name, tensor
