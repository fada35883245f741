"""Builds an engine core from the configuration: plugins → model → KV budget → runner."""

from __future__ import annotations

import gc
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import torch

from tallow.config import TallowConfig, load_config
from tallow.default_model import DEFAULT_MODEL_NAME, default_model_path
from tallow.distributed import launch
from tallow.distributed.collectives import agree
from tallow.distributed.driver import open_engine
from tallow.distributed.state import ParallelState
from tallow.kernels import kv_cache
from tallow.layers import VisionLanguageModel
from tallow.plugin import Checkpoint, Entry, Registries, SpeculatorHost
from tallow.plugin.manager import PluginManager, load_plugins

from . import embedding_setup
from .backend_selection import select_attention_backend, select_kv_codec
from .cache_groups import (
    find_cache_groups,
    group_block_bytes,
    split_budget,
    state_bytes,
)
from .core import EngineCore
from .cuda_graphs import CudaGraphRunner
from .encoder_cache import EncoderCache, MultimodalRunner
from .errors import AdmissionError
from .multimodal import MultimodalPrompt, PromptImages
from .embedding import EmbeddingInfo
from .kv_budget import kv_budget_blocks, with_latent_groups
from .kv_calibration import calibrate_kv_codec
from .kv_manager import KVCacheManager, PagedGroupSize
from .loader import LoadedModel, load_model, resolve_device
from .model_runner import ModelRunner, kv_layers
from .output_processor import OutputProcessor
from .sampling.grammar import StructuredOutputs
from .scheduler import Scheduler
from .speculation import SpecDecoding
from .token_bytes import tokenizer_info, vocabulary_problem
from .tokenizer import Tokenizer
from .worker import serve

log = logging.getLogger("tallow.engine")


@dataclass
class EngineParts:
    core: EngineCore
    tokenizer: Tokenizer
    model_name: str
    max_model_len: int
    loaded: LoadedModel
    plugin_manager: PluginManager
    attention_backend: str
    kv_codec: str = "auto"
    #: what the cache of the chosen codec costs per token and holds
    kv_footprint: kv_cache.KVFootprint | None = None
    #: "generate" or "embed"
    task: str = "generate"
    #: how the model's embeddings are made (task embed), else None
    embedding: EmbeddingInfo | None = None
    #: the tensor-parallel group this engine drives (tallow.distributed), else None
    parallel: ParallelState | None = None


def resolve_engine_config(
    model: str | None,
    config: str | os.PathLike[str] | None,
    settings: Mapping[str, object],
    *,
    caller: str,
) -> TallowConfig:
    """The configuration of an engine made from Python: the YAML file ``config`` (else
    ``$TALLOW_CONFIG``), the ``TALLOW_*`` environment and the keyword ``settings`` (``model``
    being the source), layered by :func:`tallow.config.load_config` as for ``tallow serve``."""
    if config is not None and not isinstance(config, (str, os.PathLike)):
        raise TypeError(
            f"{caller} config= names a YAML file, got {type(config).__name__}; "
            "an engine for a TallowConfig is made with from_config(config)"
        )
    return load_config(path=config, keywords={"model": model, **settings}, caller=caller)


class EngineFrontend:
    """What both engines (offline and asynchronous) hold: the built parts, the model's name,
    tokenizer, context limit and plugins, and the output processor that makes text."""

    def __init__(self, parts: EngineParts) -> None:
        self.parts = parts
        self.core = parts.core
        self.tokenizer = parts.tokenizer
        self.model_name = parts.model_name
        self.max_model_len = parts.max_model_len
        self.plugin_manager = parts.plugin_manager
        self.processor = OutputProcessor(parts.tokenizer)
        #: "generate" or "embed": the requests this engine takes
        self.task = parts.task
        #: the served model's embeddings (task embed), else None
        self.embedding = parts.embedding
        mm = parts.core.runner.multimodal
        #: expands the images of prompts (a vision-language model), else None
        self.images = PromptImages(mm.model) if mm is not None else None

    def expand_images(
        self, prompt_token_ids: list[int], images: Sequence[Any] | None
    ) -> tuple[list[int], MultimodalPrompt | None]:
        """The prompt with its image placeholders expanded and its images (processed and
        hashed here, off the engine thread); ``(prompt_token_ids, None)`` without images.
        AdmissionError when the model takes no images or the placeholders do not match."""
        if not images:
            return prompt_token_ids, None
        if self.images is None:
            raise AdmissionError(
                f"the request has images, but {self.model_name} takes text only", field="images"
            )
        return self.images.expand(prompt_token_ids, list(images))

    @property
    def structured(self) -> StructuredOutputs | None:
        """The engine's structured outputs (a tallow.engine.sampling.StructuredOutputs: the
        grammar backend and its compile cache), None for an engine that embeds."""
        return self.core.structured

    @classmethod
    def from_config(cls, config: TallowConfig, plugin_manager: PluginManager | None = None) -> Any:
        """The engine for a resolved configuration (a :class:`tallow.config.TallowConfig`)."""
        raise NotImplementedError

    @classmethod
    def create(
        cls,
        model: str | None = None,
        *,
        config: str | os.PathLike[str] | None = None,
        plugin_manager: PluginManager | None = None,
        **settings: object,
    ) -> Any:
        """The engine for the configuration ``tallow serve`` would resolve with these keywords
        as its flags: defaults < YAML (``config=`` or ``$TALLOW_CONFIG``) < ``TALLOW_*``
        environment < keywords (the keywords of :class:`tallow.LLM`)."""
        resolved = resolve_engine_config(model, config, settings, caller=f"{cls.__name__}.create()")
        return cls.from_config(resolved, plugin_manager)


def check_position_limit(model: torch.nn.Module, max_model_len: int) -> None:
    """ValueError when ``max_model_len`` goes past the positions the model's rotary embeddings
    cover (their ``cos_sin_cache`` rows): a request reaching them would fail inside a step and
    kill the engine, so the limit is refused at start-up."""
    caches = (getattr(m, "cos_sin_cache", None) for m in model.modules())
    rows = [int(c.shape[0]) for c in caches if isinstance(c, torch.Tensor)]
    if rows and max_model_len > min(rows):
        raise ValueError(
            f"model.max_model_len {max_model_len} is longer than the {min(rows)} "
            "positions the model's rotary embedding covers (its "
            "max_position_embeddings and rope scaling); set --max-model-len "
            f"{min(rows)} or less"
        )


def model_source(config: TallowConfig) -> tuple[str, str]:
    """(source, served name). No source means the embedded default model."""
    source = config.model.source
    if not source:
        return str(default_model_path()), config.model.served_model_name or DEFAULT_MODEL_NAME
    name = config.model.served_model_name or source
    return source, name


def load_tokenizer(
    config: TallowConfig, checkpoint: Checkpoint, model_vocab: int | None
) -> Tokenizer:
    """The tokenizer of ``model.tokenizer`` when it is set, else the checkpoint's. One from
    elsewhere must not produce ids the model has no embedding for."""
    path = config.model.tokenizer
    if not path:
        return Tokenizer.from_checkpoint(checkpoint)
    tokenizer = Tokenizer.from_directory(path)
    origin = config.model.setting_origin("tokenizer")
    if model_vocab and tokenizer.vocab_size > int(model_vocab):
        raise ValueError(
            f"model.tokenizer {path!r}{f' (from {origin})' if origin else ''}: the tokenizer has "
            f"{tokenizer.vocab_size} tokens but the model's vocabulary has {model_vocab}; "
            "expected the tokenizer of this model"
        )
    log.info("tokenizer: %s (model.tokenizer) instead of the model source's", path)
    return tokenizer


#: youngest-generation threshold while serving: the collector runs after this many more
#: container allocations than deallocations (Python's default is 700 or 2,000)
SERVING_GC_THRESHOLD = 50_000


def freeze_startup_heap() -> None:
    """For a process that builds one engine and serves with it until it exits (``tallow
    serve``, ``tallow bench``): collect the garbage of start-up, then move every object alive
    now (torch, transformers, the model, the engine: hundreds of thousands of them) out of the
    garbage collector's reach. Full collections, which otherwise walk all of them every few
    hundred steps, then only see what serving allocates.

    The youngest generation's threshold is also raised to :data:`SERVING_GC_THRESHOLD`. A busy
    engine allocates thousands of short-lived containers per step (plans, per-sequence
    records); at the default threshold the collector ran several times per step and promoted
    objects that were about to die, which then cost again in older-generation passes (a
    measurable share of a throughput run with the default threshold). Cyclic
    garbage is still collected, only in larger batches.

    Not for processes that build many engines (tests): frozen objects are never collected."""
    gc.collect()
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(max(SERVING_GC_THRESHOLD, gc.get_threshold()[0]), gen1, gen2)


@dataclass
class BuiltRunner:
    """The model side of an engine, as every rank of a tensor-parallel group builds it."""

    loaded: LoadedModel
    tokenizer: Tokenizer
    runner: ModelRunner
    attention_backend: Entry
    max_model_len: int
    #: the token budget of one step
    step_tokens: int
    num_blocks: int
    embedding: EmbeddingInfo | None = None
    #: each paged cache group's pool (the first is ``num_blocks``), and the state groups'
    #: slot counts
    group_sizes: list[PagedGroupSize] = field(default_factory=list)
    state_slots: list[int] = field(default_factory=list)
    #: the chosen KV codec's name and what its cache costs per token
    kv_codec: str = "auto"
    kv_footprint: kv_cache.KVFootprint | None = None


def build_runner(
    config: TallowConfig, registries: Registries, parallel: ParallelState | None = None
) -> BuiltRunner:
    """Model, KV cache and model runner for ``config`` (CUDA graphs captured on a GPU).

    ``parallel`` is this process's tensor-parallel group (:mod:`tallow.distributed`) or None:
    every rank calls this with the same configuration and the same plugins, and the
    collectives of start-up pair up (the KV cache takes the smallest budget of any rank, CUDA
    graphs are captured together)."""
    if config.model.seed is not None:
        torch.manual_seed(int(config.model.seed))
    source, _ = model_source(config)
    device = parallel.device if parallel is not None else resolve_device(config.model.device)
    loaded = load_model(
        registries,
        source,
        device=device,
        dtype=config.model.dtype,
        weight_format=config.model.weight_format,
        revision=config.model.revision,
        config=config,
        isq=config.model.isq,
        task=config.model.task,
        quant_scheme=config.model.quant_scheme,
    )
    arch = loaded.config.text
    tokenizer = load_tokenizer(config, loaded.checkpoint, arch.get("vocab_size"))
    embed = loaded.task == "embed"
    embedding = embedding_setup.embedding_info(config, loaded) if embed else None
    step_tokens = config.scheduler.max_num_batched_tokens
    if embed:
        max_model_len = embedding_setup.embedding_max_model_len(config, loaded)
        step_tokens = embedding_setup.step_token_budget(config, max_model_len)
    else:
        max_model_len = int(
            config.model.max_model_len or arch.get("max_position_embeddings") or 4096
        )
        check_position_limit(loaded.model, max_model_len)
    codec_entry = select_kv_codec(registries, config)
    codec = codec_entry.load()(config)
    block_size = config.cache.block_size
    # A tensor-parallel step message carries one group's block tables: sliding-window layers
    # then share the full group (their blocks are kept until the sequence ends).
    sliding_groups = parallel is None
    backend_entry, backend = select_attention_backend(
        registries, config, loaded, codec_entry.name, codec, block_size, sliding_groups
    )
    cost = kv_cache.footprint(
        codec,
        [a.layer for a in kv_layers(loaded.model)],
        block_size=block_size,
        model_dtype=loaded.dtype,
    )
    groups = find_cache_groups(loaded.model, sliding_groups=sliding_groups)
    if parallel is not None and any(not g.paged for g in groups):
        raise ValueError(
            "tensor parallelism does not serve models with a recurrent state per sequence yet"
        )
    max_num_seqs = config.scheduler.max_num_seqs
    block_bytes = [
        group_block_bytes(g, codec, block_size=block_size, model_dtype=loaded.dtype)
        for g in groups
        if g.paged
    ]
    cost = with_latent_groups(cost, groups, block_bytes)
    num_blocks = kv_budget_blocks(
        config,
        loaded,
        max(1, sum(block_bytes)),
        max_model_len,
        cost.fixed_bytes + state_bytes(groups, max_num_seqs, loaded.dtype),
    )
    if embed:
        num_blocks = embedding_setup.cap_kv_blocks(num_blocks, config, step_tokens, max_model_len)
    if parallel is not None:
        num_blocks = int(agree([num_blocks], "min")[0])
    group_sizes = split_budget(
        groups,
        num_blocks,
        block_bytes,
        block_size=block_size,
        max_num_seqs=max_num_seqs,
        max_step_tokens=step_tokens,
        redistribute=not config.cache.num_blocks,
    )
    if group_sizes:
        num_blocks = group_sizes[0].num_blocks
    if len(group_sizes) > 1 or len(groups) > len(group_sizes):
        log.info(
            "cache groups: %s",
            "; ".join(
                f"{type(g.spec).__name__} x{len(g.layers)}: "
                + (
                    f"{size.num_blocks} blocks"
                    if size is not None and g.paged
                    else f"{max_num_seqs} state slots"
                )
                for g, size in zip(groups, [*group_sizes, *[None] * len(groups)])
            ),
        )
    log.info(
        "KV cache: codec %s, %d blocks of %d tokens = %d tokens (%.1f MiB; %.0f tokens "
        "per GiB, %.2fx a 16-bit cache)",
        codec_entry.name,
        num_blocks,
        block_size,
        cost.tokens(num_blocks),
        (num_blocks * cost.bytes_per_block + cost.fixed_bytes) / 2**20,
        cost.tokens_per_gib,
        cost.vs_bf16,
    )
    vocab = int(arch.get("vocab_size") or tokenizer.vocab_size)
    structured = (
        None
        if embed
        else StructuredOutputs.for_engine(
            registries,
            config,
            lambda: tokenizer_info(tokenizer, vocab),
            device,
            vocabulary_problem=vocabulary_problem(tokenizer),
        )
    )
    runner = ModelRunner(
        loaded.model,
        device=device,
        dtype=loaded.dtype,
        num_blocks=num_blocks,
        block_size=block_size,
        attention_backend=backend,
        vocab_size=vocab,
        max_num_seqs=config.scheduler.max_num_seqs,
        max_model_len=max_model_len,
        eos_token_ids=tokenizer.eos_token_ids,
        kv_codec=codec,
        pooler=embedding_setup.pooler_for(embedding) if embedding is not None else None,
        grammar=structured,
        group_sizes=group_sizes or None,
        sliding_groups=sliding_groups,
    )
    model = loaded.model
    if isinstance(model, VisionLanguageModel) and not embed:
        if parallel is not None:
            raise ValueError(
                "tensor parallelism does not serve images yet: serve the "
                "vision-language model on one device"
            )
        runner.multimodal = MultimodalRunner(
            model, EncoderCache(config.cache.encoder_cache_mb * 2**20), device
        )
    if codec.calibrated:
        calibrate_kv_codec(runner, codec, tokenizer, vocab)
    warm_up_backend = getattr(backend, "warm_up", None)
    if device.type == "cuda" and warm_up_backend is not None:
        # kernel variants that the warm-up steps below do not reach (long contexts split
        # across programs, say) compile now rather than in a serving step
        started = time.perf_counter()
        warm_up_backend([a.layer for a in runner.layers], runner.kv_caches, loaded.dtype)
        log.info("attention backend warmed up in %.1fs", time.perf_counter() - started)
    # embedding steps are never decode steps: nothing to capture
    if (
        device.type == "cuda"
        and not embed
        and not config.runner.disable_cuda_graph
        and getattr(backend, "supports_cuda_graph", False)
    ):
        runner.graphs = CudaGraphRunner.capture(runner, config.runner.max_cuda_graph_batch)
    return BuiltRunner(
        loaded,
        tokenizer,
        runner,
        backend_entry,
        max_model_len,
        step_tokens,
        num_blocks,
        embedding,
        kv_codec=codec_entry.name,
        kv_footprint=cost,
        group_sizes=list(runner.group_sizes),
        state_slots=[max_num_seqs] * len(runner.state_groups),
    )


def build_speculation(
    config: TallowConfig,
    registries: Registries,
    built: BuiltRunner,
    parallel: ParallelState | None,
    model_name: str,
) -> SpecDecoding | None:
    """The speculator ``speculative.method`` names, attached to the engine's model
    (:meth:`tallow.plugin.Speculator.attach`) and ready for the engine (None when no method is
    set). Start-up fails naming what stands in the way: an unknown name (the registered ones
    are listed), the speculator's own reasons, or an engine it cannot serve."""
    runner = built.runner
    embed = built.loaded.task == "embed"
    spec = config.speculative
    if spec.method is None:
        return None
    problems = []
    if embed:
        problems.append("the engine embeds (model.task embed): nothing is decoded")
    if parallel is not None:
        problems.append("tensor parallelism does not verify proposals yet")
    if runner.state_groups:
        problems.append(
            "the model keeps a recurrent state per sequence, which cannot take rejected tokens back"
        )
    if problems:
        raise ValueError(f"speculative.method={spec.method!r}: " + "; ".join(problems))
    registry = registries.speculators
    if spec.method not in registry.names():
        known = ", ".join(sorted(registry.names())) or "none (install tallow-speculator-ngram)"
        raise ValueError(
            f"speculative.method={spec.method!r} is not a registered speculator; "
            f"registered: {known}"
        )
    cls = registry.entry(spec.method).load()
    reasons = cls.validate(config)
    if reasons:
        raise ValueError(
            f"speculator {spec.method!r} cannot serve this configuration: " + "; ".join(reasons)
        )
    log.info(
        "speculative decoding: %s, k=%d%s; steps run synchronously, verify steps eagerly",
        spec.method,
        spec.num_speculative_tokens,
        " (adaptive)" if spec.adaptive else "",
    )
    speculator = cls(config)
    speculator.attach(
        SpeculatorHost(
            device=runner.device,
            dtype=runner.dtype,
            registries=registries,
            tokenizer=built.tokenizer,
            vocab_size=runner.vocab_size,
            model_name=model_name,
            max_model_len=built.max_model_len,
            max_num_seqs=config.scheduler.max_num_seqs,
            target=runner,
        )
    )
    return SpecDecoding(
        speculator,
        spec.num_speculative_tokens,
        adaptive=spec.adaptive,
        vocab_size=runner.vocab_size,
    )


def build_engine(config: TallowConfig, plugin_manager: PluginManager | None = None) -> EngineParts:
    """The engine for ``config``. With tensor parallelism (``parallel`` settings, or ranks
    started by torchrun) this process joins its group first: rank 0 goes on to build the
    engine, handing its workers the same one; any other rank serves as a worker here until
    the driver ends the group, then leaves the process (SystemExit)."""
    parallel = launch.start(config)
    if parallel is not None and not parallel.is_driver:
        serve(parallel, build_runner)
        raise SystemExit(0)
    if plugin_manager is None:
        plugin_manager = load_plugins(config.plugins)
        plugin_manager.hook.tallow_configure(config=config)
    registries = plugin_manager.registries
    publisher = None
    if parallel is not None:
        publisher = open_engine(
            parallel,
            config,
            plugin_manager.loaded(),
            feeds_tokens=config.scheduler.async_scheduling,
        )
    _, served_name = model_source(config)
    built = build_runner(config, registries, parallel)
    loaded, runner, tokenizer = built.loaded, built.runner, built.tokenizer
    runner.step_publisher = publisher
    embed = loaded.task == "embed"
    structured = runner.grammar
    max_model_len = built.max_model_len
    # embedding inputs never share blocks (an encoder's K/V depend on later tokens too)
    block_manager = KVCacheManager(
        built.group_sizes or [PagedGroupSize(built.num_blocks)],
        block_size=config.cache.block_size,
        enable_prefix_caching=config.cache.enable_prefix_caching and not embed,
        state_slots=built.state_slots,
        max_step_tokens=built.step_tokens,
    )
    scheduler = Scheduler(
        block_manager,
        max_num_seqs=config.scheduler.max_num_seqs,
        max_num_batched_tokens=built.step_tokens,
        prefill_chunk_size=config.scheduler.prefill_chunk_size,
        max_model_len=max_model_len,
        policy=config.scheduler.policy,
        max_waiting=config.scheduler.max_waiting,
    )
    spec = build_speculation(config, registries, built, parallel, served_name)
    core = EngineCore(
        scheduler,
        runner,
        eos_token_ids=tokenizer.eos_token_ids,
        max_model_len=max_model_len,
        async_scheduling=config.scheduler.async_scheduling,
        task=loaded.task,
        structured=structured,
        spec=spec,
    )
    if loaded.device.type == "cuda":
        # Triton compiles each kernel variant on first use (seconds each): do it now, not in
        # the first requests' steps.
        started = time.perf_counter()
        core.warm_up()
        if structured is not None:  # sampled rows' logits are float32, argmax rows the model's
            structured.warm_up(runner.vocab_size, (torch.float32, loaded.dtype))
        log.info("warm-up steps done in %.1fs", time.perf_counter() - started)
    return EngineParts(
        core,
        tokenizer,
        served_name,
        max_model_len,
        loaded,
        plugin_manager,
        built.attention_backend.name,
        kv_codec=built.kv_codec,
        kv_footprint=built.kv_footprint,
        task=loaded.task,
        embedding=built.embedding,
        parallel=parallel,
    )
