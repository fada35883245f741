"""The base class of decoder-only model plugins: everything but the architecture itself.

A subclass builds its modules in ``__init__``, implements ``forward``, and declares how checkpoint
tensor names map onto its parameters (``weight_name_maps``, one :class:`WeightNameMap` per
naming scheme). This class does the loading, the completeness check and the logits.
"""

from __future__ import annotations

from abc import ABCMeta, abstractmethod
from collections import defaultdict
from typing import Any, Callable, ClassVar, Hashable, Iterable

import torch
from torch import nn

from .attention import Attention
from .model import ArchConfig, BuildContext
from .quantized import QuantizedWeight
from .weight_names import WeightLoadError, WeightNameMap

_LIST_LIMIT = 20


def _listing(title: str, names: list[str]) -> str:
    shown = ", ".join(names[:_LIST_LIMIT])
    more = f", ... and {len(names) - _LIST_LIMIT} more" if len(names) > _LIST_LIMIT else ""
    return f"\n  {title} ({len(names)}): {shown}{more}"


class CausalLM(nn.Module, metaclass=ABCMeta):
    """A decoder-only language model over one flat batch of tokens.

    Contract (what the engine calls; see :class:`tallow.plugin.ModelArchitecture`):

    - ``__init__(config, build)``: ``config`` an HF-style config (:class:`ArchConfig`),
      ``build`` the dtype, device, quantization and tensor-parallel rank;
    - ``forward(input_ids [T], positions [T]) -> hidden [T, H]``, with the step's attention
      metadata in the forward context;
    - ``compute_logits(hidden [N, H]) -> logits [N, vocab]``, float32 or the head's own dtype
      (the engine widens them wherever it computes with them);
    - ``load_weights(tensors, naming) -> set[str]``: the parameters it filled, after checking that
      nothing is missing or left over;
    - ``config_from_gguf(metadata, config) -> dict`` and ``config_from_hf(config) -> dict``
      (classmethods).

    Embeddings (``build.task == "embed"``): the engine pools the hidden states of ``forward``
    (:mod:`tallow.layers.pooling`) and never asks for logits, so a model may then build no LM
    head; checkpoint tensors of a head it did not build (``lm_head.*``) are passed over.
    """

    #: Hugging Face ``architectures`` names and GGUF ``general.architecture`` values served
    hf_architectures: ClassVar[tuple[str, ...]] = ()
    gguf_architectures: ClassVar[tuple[str, ...]] = ()
    #: naming scheme -> how checkpoint names map onto parameters
    weight_name_maps: ClassVar[dict[str, WeightNameMap]] = {}
    #: what the engine may run this model for ("generate", "embed")
    tasks: ClassVar[tuple[str, ...]] = ("generate", "embed")
    #: the pooling of embeddings when neither the configuration nor the checkpoint's files say
    #: (see tallow.layers.pooling): a decoder's last token sees the whole input
    default_pooling: ClassVar[str] = "last"
    #: Hugging Face's ``base_model_prefix``: a checkpoint saved from the bare base model (an
    #: embedding model's backbone, say) names its tensors without it (``layers.0...`` for
    #: ``model.layers.0...``), one saved from a task model with it (``bert.embeddings...``
    #: for ``embeddings...``). Names the map does not know are retried with the prefix added
    #: or removed. None: names are taken as they are.
    base_model_prefix: ClassVar[str | None] = None

    def __init__(self, config: ArchConfig | dict[str, Any], build: BuildContext) -> None:
        super().__init__()
        self.config = config if isinstance(config, ArchConfig) else ArchConfig(config)
        self.build = build

    @abstractmethod
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Final hidden states ``[T, H]`` (after the last norm) of every token of the batch."""

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits ``[N, vocab]`` of ``hidden [N, H]`` through ``self.lm_head``, in the head's
        dtype: greedy rows take their argmax as they are (widening 16-bit logits cannot change
        it), and the engine widens them to float32 for sampling and logprobs. Widening here
        would cost a full copy of the logits every step, large at hundreds of rows of a 128k
        vocabulary."""
        head = getattr(self, "lm_head", None)
        if head is None:
            raise NotImplementedError(
                f"{type(self).__name__} has no lm_head; override compute_logits"
            )
        return head(hidden)

    def mtp_head(self) -> "nn.Module | None":
        """The checkpoint's multi-token prediction head (a :class:`tallow.layers.MTPHead`),
        built when ``build.mtp`` is set by a model that has one; None otherwise."""
        return None

    # -- weights ----------------------------------------------------------------------------
    def weight_names(self, naming: str) -> WeightNameMap:
        try:
            return self.weight_name_maps[naming]
        except KeyError:
            known = ", ".join(sorted(self.weight_name_maps)) or "none"
            raise WeightLoadError(
                f"{type(self).__name__} cannot load tensors named {naming!r} (it knows: {known})"
            ) from None

    def load_weights(
        self, tensors: Iterable[tuple[str, torch.Tensor | QuantizedWeight]], naming: str = "hf"
    ) -> set[str]:
        """Load checkpoint ``tensors`` named under ``naming``; return the parameters filled.

        Every tensor goes through its parameter's ``weight_loader`` (which shards it for this
        rank and converts its dtype); a parameter with ``shard_cover(shard) -> set`` says
        which of its ``shard_ids`` one loaded shard fills (a stacked tensor of every
        expert's gate, say), else a shard fills itself and no shard fills all of them. A still-quantized tensor
        (:class:`~tallow.layers.QuantizedWeight`) reaches the loader as it is when the parameter
        says ``accepts_quantized``; otherwise it is dequantized to float32 first. Raises
        :class:`WeightLoadError` naming the tensor when a shape does not fit, and, after the
        last tensor, listing every parameter left unfilled and every checkpoint tensor that no
        rule knows.
        """
        name_map = self.weight_names(naming)
        params = dict(self.named_parameters(remove_duplicate=False))
        canonical = {id(p): n for n, p in self.named_parameters()}
        loaded: dict[str, set[Hashable]] = defaultdict(set)
        unexpected: list[str] = []
        embedding_only = self.build.task == "embed"
        for ckpt_name, tensor in tensors:
            match = self._match(name_map, ckpt_name, naming)
            if match is None:
                unexpected.append(ckpt_name)
                continue
            if match.ignored:
                continue
            rule = match.rule
            quantized = isinstance(tensor, QuantizedWeight)
            if not quantized and not isinstance(tensor, torch.Tensor):
                tensor = torch.as_tensor(tensor)
            if quantized and (rule.handler or (rule.transform and not rule.rowwise)):
                tensor, quantized = tensor.dequantize(), False
            if rule.transform:
                transform = getattr(self, rule.transform)
                if isinstance(tensor, QuantizedWeight):
                    tensor = tensor.map_rows(lambda rows: transform(rows, match.groups))
                else:
                    tensor = transform(tensor, match.groups)
            if rule.handler:
                getattr(self, rule.handler)(tensor, match.groups)
                continue
            target = match.target
            assert target is not None
            param = params.get(target)
            if param is None and embedding_only and target.startswith("lm_head."):
                continue  # an embedding model built without its head
            if param is None:
                unexpected.append(f"{ckpt_name} (-> {target}, which this model does not have)")
                continue
            name = canonical[id(param)]
            if name != target:  # a tied alias (lm_head of tied embeddings): keep the original
                continue
            if quantized and not getattr(param, "accepts_quantized", False):
                tensor = tensor.dequantize()  # no quantization scheme keeps it: float32
            # a loader that accepts quantized tensors takes them as they are (accepts_quantized)
            loader: Callable[..., None] = getattr(param, "weight_loader", default_weight_loader)
            shard = match.shard
            try:
                if shard is None:
                    loader(param, tensor)
                else:
                    loader(param, tensor, shard)
            except (ValueError, RuntimeError, TypeError) as exc:
                raise WeightLoadError(
                    f"{type(self).__name__}: checkpoint tensor {ckpt_name!r} "
                    f"-> parameter {target!r}: {exc}"
                ) from exc
            shards = getattr(param, "shard_ids", None)
            cover = getattr(param, "shard_cover", None)
            if shard is None and shards:
                loaded[name].update(shards)
            elif cover is not None:  # one tensor may fill several shards (stacked experts)
                loaded[name].update(cover(shard))
            else:
                loaded[name].add(shard)
        missing = self._missing(loaded)
        if missing:
            missing = sorted(set(missing) - self.resolve_missing(set(missing), naming))
        if missing or unexpected:
            raise WeightLoadError(
                f"checkpoint does not match {type(self).__name__} (tensor naming {naming!r}):"
                + (_listing("missing parameters", missing) if missing else "")
                + (_listing("unexpected checkpoint tensors", unexpected) if unexpected else "")
            )
        self.process_weights_after_loading()
        return {n for n, _ in self.named_parameters()}

    def _match(self, name_map: WeightNameMap, ckpt_name: str, naming: str) -> Any:
        """The rule for ``ckpt_name``, also under :attr:`base_model_prefix` (added or
        removed) for Hugging Face names."""
        match = name_map.match(ckpt_name)
        prefix = self.base_model_prefix
        if match is not None or not prefix or naming != "hf":
            return match
        if ckpt_name.startswith(prefix + "."):
            return name_map.match(ckpt_name[len(prefix) + 1 :])
        return name_map.match(f"{prefix}.{ckpt_name}")

    def _missing(self, loaded: dict[str, set[Hashable]]) -> list[str]:
        out = []
        for name, param in self.named_parameters():
            if getattr(param, "from_checkpoint", True) is False:
                continue  # derived while loading another tensor (a quantization scale, say)
            shards = getattr(param, "shard_ids", None)
            if not shards:
                if name not in loaded:
                    out.append(name)
                continue
            lacking = [s for s in shards if s not in loaded.get(name, ())]
            out.extend(f"{name}[{s}]" for s in lacking)
        return out

    def load_k_cache_scale(self, tensor: torch.Tensor, groups: dict[str, str]) -> None:
        """Weight-rule handler: a checkpoint's scale of layer ``groups["i"]``'s key cache
        (``self_attn.k_scale`` in FP8-KV checkpoints), kept on its :class:`Attention`."""
        self._attention(int(groups["i"])).kv_scales["k"] = tensor.detach().float().clone()

    def load_v_cache_scale(self, tensor: torch.Tensor, groups: dict[str, str]) -> None:
        """As :meth:`load_k_cache_scale`, for the value cache."""
        self._attention(int(groups["i"])).kv_scales["v"] = tensor.detach().float().clone()

    def _attention(self, layer_index: int) -> Attention:
        for module in self.modules():
            if isinstance(module, Attention) and module.layer.layer_index == layer_index:
                return module
        raise WeightLoadError(
            f"{type(self).__name__}: a KV-cache scale names layer "
            f"{layer_index}, which has no attention layer"
        )

    def resolve_missing(self, missing: set[str], naming: str) -> set[str]:
        """A chance to fill parameters the checkpoint lacks (tying a head, say).

        Returns the names it resolved; the default resolves none.
        """
        return set()

    def process_weights_after_loading(self) -> None:
        """Let every layer's quantization method finish its weights (repacking and such)."""
        for module in self.modules():
            method = getattr(module, "quant_method", None)
            if method is not None and hasattr(method, "process_weights_after_loading"):
                method.process_weights_after_loading(module)

    @classmethod
    def config_from_hf(cls, config: dict[str, Any]) -> dict[str, Any]:
        """Complete the HF-style ``config`` of a checkpoint that is not GGUF (``config.json``).

        The default returns it unchanged; an architecture overrides it to fill what its
        ``config.json`` may leave out (its config class's defaults), so that the engine sizes
        the model, the vocabulary and the context from the same values the model is built
        with.
        """
        return config

    @classmethod
    def config_from_gguf(cls, metadata: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
        """Complete an HF-style ``config`` built generically from GGUF ``metadata``.

        The default returns ``config`` unchanged; architectures override it for what only they
        know (head sizes, RoPE scaling, biases...).
        """
        return config


def default_weight_loader(
    param: torch.Tensor, loaded: torch.Tensor, shard_id: Hashable | None = None
) -> None:
    """Copy a whole tensor into a parameter that has no loader of its own (norm weights)."""
    if shard_id is not None:
        raise ValueError(f"parameter has no shards, got shard {shard_id!r}")
    if tuple(param.shape) != tuple(loaded.shape):
        raise ValueError(
            f"checkpoint tensor has shape {tuple(loaded.shape)}, expected {tuple(param.shape)}"
        )
    with torch.no_grad():
        param.data.copy_(loaded)
