"""Testing helpers for model plugins: run a model step by step through a paged KV cache without
the engine, and compare it with transformers on the same random weights.

A typical parity test::

    from tallow.plugin.model_testing import (
        PagedRunner, assert_close_logits, hf_greedy, load_model, random_hf_model)

    hf = random_hf_model(transformers.Phi3Config(...), seed=0)
    hf.save_pretrained(tmp_path)                       # then load it through a weight format
    model = load_model(Phi3ForCausalLM, checkpoint)
    tokens, logits, prompt_logits = PagedRunner(model).greedy(0, prompt, steps=20)
    ref_tokens, ref_logits, ref_prompt = hf_greedy(hf, prompt, steps=20)
    assert_close_logits(prompt_logits, ref_prompt, "prompt")

GGUF files are written the way llama.cpp's converter names tensors (:func:`gguf_tensors`,
:func:`write_gguf`), with the ``gguf`` package's own name map. transformers and gguf are
imported only by the helpers that use them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping

import torch

from tallow.layers import Attention, AttentionMetadata, ArchConfig, BuildContext, forward_context
from tallow.layers.torch_attention import TorchAttentionBackend

__all__ = [
    "PagedRunner", "randomize_", "random_hf_model", "hf_greedy", "assert_close_logits",
    "assert_greedy_parity", "assert_cuda_parity", "assert_registers_architecture",
    "assert_engine_greedy", "save_placeholder_tokenizer",
    "load_model", "load_saved", "gguf_tensors", "gguf_metadata", "write_gguf", "read_gguf",
]


@dataclass
class _Seq:
    blocks: list[int]
    length: int = 0  # tokens already in the cache


@dataclass
class PagedRunner:
    """Runs steps of a flat batch through ``model`` with a paged KV cache, playing the model
    runner's part: contiguous block tables, one cache per ``Attention`` module, and the step's
    ``AttentionMetadata`` in the forward context of the torch reference backend."""

    model: Any
    block_size: int = 4
    blocks_per_seq: int = 16
    max_seqs: int = 4
    seqs: dict[int, _Seq] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.backend = TorchAttentionBackend()
        num_blocks = self.blocks_per_seq * self.max_seqs
        p = next(self.model.parameters())
        for m in self.model.modules():
            if isinstance(m, Attention):
                spec = m.layer
                m.kv_cache = torch.zeros(2, num_blocks, self.block_size, spec.num_kv_heads,
                                         spec.head_dim, dtype=p.dtype, device=p.device)

    def add(self, seq_id: int) -> None:
        first = len(self.seqs) * self.blocks_per_seq
        self.seqs[seq_id] = _Seq(list(range(first, first + self.blocks_per_seq)))

    @torch.no_grad()
    def step(self, chunks: list[tuple[int, list[int]]]) -> list[torch.Tensor]:
        """Run one step: ``chunks`` = [(seq id, its next tokens)]; returns each chunk's
        float32 logits ``[len(tokens), vocab]``."""
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        starts = [0]
        seq_lens: list[int] = []
        tables: list[list[int]] = []
        for seq_id, tokens in chunks:
            seq = self.seqs[seq_id]
            for j, tok in enumerate(tokens):
                pos = seq.length + j
                ids.append(tok)
                positions.append(pos)
                slots.append(seq.blocks[pos // self.block_size] * self.block_size
                             + pos % self.block_size)
            seq.length += len(tokens)
            if seq.length > self.blocks_per_seq * self.block_size:
                raise ValueError("sequence longer than the test cache")
            starts.append(starts[-1] + len(tokens))
            seq_lens.append(seq.length)
            tables.append(seq.blocks)
        device = next(self.model.parameters()).device
        meta = AttentionMetadata(
            num_seqs=len(chunks), num_tokens=len(ids),
            query_start_loc=torch.tensor(starts, dtype=torch.int32, device=device),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
            block_tables=torch.tensor(tables, dtype=torch.int32, device=device),
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
            max_query_len=max(len(t) for _, t in chunks), max_seq_len=max(seq_lens),
            block_size=self.block_size, query_start_loc_cpu=starts, seq_lens_cpu=seq_lens,
        )
        with forward_context(meta, self.backend):
            hidden = self.model(torch.tensor(ids, device=device),
                                torch.tensor(positions, device=device))
        logits = self.model.compute_logits(hidden).float()
        return [logits[starts[i]:starts[i + 1]] for i in range(len(chunks))]

    def greedy(self, seq_id: int, prompt: list[int], steps: int
               ) -> tuple[list[int], list[torch.Tensor], torch.Tensor]:
        """Prefill ``prompt`` then decode ``steps`` tokens greedily: (tokens, per-step logits of
        the token chosen at each step [vocab], prompt logits [P, vocab])."""
        self.add(seq_id)
        prompt_logits = self.step([(seq_id, prompt)])[0]
        last = prompt_logits[-1]
        tokens, step_logits = [], []
        for _ in range(steps):
            step_logits.append(last)
            tok = int(last.argmax())
            tokens.append(tok)
            last = self.step([(seq_id, [tok])])[0][-1]
        return tokens, step_logits, prompt_logits


def randomize_(model: torch.nn.Module, seed: int, std: float = 0.08) -> None:
    """Give every parameter of a (transformers) model random values: ``std``-scaled normal
    noise, and ``1 + 0.2 * noise`` for norm weights (biases and norms too, which transformers
    initialises to constants that would hide mistakes)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            if "norm" in name:
                p.copy_(1.0 + 0.2 * noise)
            else:
                p.copy_(std * noise)


def random_hf_model(config: Any, seed: int = 0, std: float = 0.08) -> Any:
    """A transformers causal LM of ``config`` in float32 eager attention, its weights
    randomized (:func:`randomize_`), its head tied when the config says so, in eval mode."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager",
                                             dtype=torch.float32)
    randomize_(model, seed, std)
    if getattr(config, "tie_word_embeddings", False):
        model.tie_weights()
    return model.eval()


def hf_greedy(model: Any, prompt: list[int], steps: int
              ) -> tuple[list[int], list[torch.Tensor], torch.Tensor]:
    """transformers' side of :meth:`PagedRunner.greedy`: the prompt's logits from one forward,
    and ``steps`` tokens with their logits from greedy ``generate`` (its KV cache)."""
    ids = torch.tensor([prompt])
    with torch.no_grad():
        prompt_logits = model(ids).logits[0]
        out = model.generate(ids, max_new_tokens=steps, min_new_tokens=steps, do_sample=False,
                             output_logits=True, return_dict_in_generate=True)
    tokens = out.sequences[0, len(prompt):].tolist()
    return tokens, [step[0] for step in out.logits], prompt_logits


def assert_close_logits(ours: torch.Tensor, ref: torch.Tensor, what: str,
                        rel: float = 1e-4) -> None:
    """Logits agree to ``rel`` of their scale (the largest magnitude, at least 1)."""
    ref = ref.float()
    scale = max(1.0, float(ref.abs().max()))
    err = float((ours.float() - ref).abs().max())
    assert err <= rel * scale, f"{what}: max |diff| {err:.3e} > {rel:.0e} * scale {scale:.2f}"


def assert_greedy_parity(model: Any, hf: Any, prompt: list[int], steps: int = 20, *,
                         rel: float = 1e-4, what: str = "") -> list[int]:
    """``model`` (through a :class:`PagedRunner`, on its own device) matches transformers'
    ``hf`` on ``prompt``: the prompt's logits, ``steps`` greedy tokens and the logits of every
    step, to ``rel`` of their scale. Also asserts that the weights are random enough for the
    check to mean something: the greedy tokens and the prompt's argmaxes are not all one token.
    Returns the tokens."""
    ref_tokens, ref_logits, ref_prompt = hf_greedy(hf, prompt, steps)
    tokens, logits, prompt_logits = PagedRunner(model).greedy(0, prompt, steps)
    assert_close_logits(prompt_logits.cpu(), ref_prompt, f"{what}: prompt logits", rel)
    for i, (ours, ref) in enumerate(zip(logits, ref_logits)):
        assert_close_logits(ours.cpu(), ref, f"{what}: logits of step {i}", rel)
    assert tokens == ref_tokens, f"{what}: greedy tokens differ: {tokens} != {ref_tokens}"
    assert len(set(ref_tokens)) > 1, f"{what}: greedy output is one token repeated"
    assert len(set(ref_prompt.argmax(-1).tolist())) > 1, f"{what}: logits ignore the input"
    return tokens


def assert_cuda_parity(load: Callable[..., Any], hf: Any, prompt: list[int], steps: int = 20,
                       *, what: str = "", bf16_rel: float = 5e-2) -> None:
    """On a CUDA device: ``load(dtype=torch.float32, device="cuda")`` has every parameter and
    buffer on the device and passes :func:`assert_greedy_parity` against ``hf`` (transformers on
    the CPU); ``load(dtype=torch.bfloat16, device="cuda")`` gives prompt logits within
    ``bf16_rel`` of it."""
    model = load(dtype=torch.float32, device="cuda")
    assert all(t.is_cuda for t in [*model.parameters(), *model.buffers()])
    assert_greedy_parity(model, hf, prompt, steps, what=f"{what} on cuda")
    low = load(dtype=torch.bfloat16, device="cuda")
    logits = PagedRunner(low).greedy(0, prompt, 0)[2]
    with torch.no_grad():
        ref = hf(torch.tensor([prompt])).logits[0]
    assert_close_logits(logits.cpu(), ref, f"{what}: bfloat16 prompt logits", bf16_rel)


def assert_registers_architecture(plugin_module: str, distribution: str, cls: type) -> None:
    """The installed distribution's ``tallow`` entry point is ``plugin_module``, which registers
    ``cls`` lazily under each of its HF architectures and GGUF architecture names, importing no
    torch while it does."""
    from importlib import import_module
    from importlib.metadata import entry_points

    from .registry import ArchitectureRegistry
    from .testing import modules_imported_by_registration

    found = {ep.name: ep.value for ep in entry_points(group="tallow")}.get(distribution)
    assert found == plugin_module, f"entry point of {distribution}: {found!r}"
    registry = ArchitectureRegistry()
    import_module(plugin_module).tallow_register_architectures(registry)
    for name in cls.hf_architectures:
        assert registry.entry(name).lazy and registry.get(name) is cls, name
    for arch in cls.gguf_architectures:
        assert registry.for_gguf(arch).name in cls.hf_architectures, arch
    assert modules_imported_by_registration(plugin_module, "tallow_register_architectures",
                                            "ArchitectureRegistry") == []


def save_placeholder_tokenizer(path: str | Path, vocab_size: int) -> None:
    """Write a ``tokenizer.json`` whose token ``i`` is the word ``t<i>`` into the model
    directory ``path``: enough for the engine to load a random model that is prompted with
    token ids."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tokenizer = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab_size)},
                                           unk_token="t0"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.save(str(Path(path) / "tokenizer.json"))


def assert_engine_greedy(path: str | Path, hf: Any, prompts: list[list[int]], steps: int = 20,
                         **llm_kwargs: Any) -> None:
    """The whole engine (:class:`tallow.LLM` on the model directory ``path``, which needs a
    tokenizer: :func:`save_placeholder_tokenizer`) generates transformers' greedy tokens for
    every prompt, all prompts in one batch. ``llm_kwargs`` go to ``LLM`` (``device``,
    ``dtype`` — float32 unless given —, ``block_size``, ...)."""
    from tallow import LLM, SamplingParams

    llm = LLM(model=str(path), **{"dtype": "float32", **llm_kwargs})
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=steps,
                                                ignore_eos=True))
    for prompt, out in zip(prompts, outs):
        expected = hf_greedy(hf, prompt, steps)[0]
        assert out.outputs[0].token_ids == expected, f"prompt {prompt}"


def load_model(cls: type, checkpoint: Any, *, dtype: torch.dtype = torch.float32,
               device: str | torch.device = "cpu", config: Mapping[str, Any] | None = None
               ) -> Any:
    """Build ``cls`` from a weight format's checkpoint (its config, or ``config``), load its
    tensors under the checkpoint's naming, and put it in eval mode."""
    build = BuildContext(dtype=dtype, device=torch.device(device))
    model = cls(ArchConfig(dict(config if config is not None else checkpoint.config)), build)
    model.load_weights(checkpoint.tensors(), naming=checkpoint.naming)
    return model.eval()


def load_saved(hf: Any, path: str | Path, cls: type, read: Callable[[str], Any], *,
               config: Mapping[str, Any] | None = None, **kwargs: Any) -> Any:
    """Save transformers' ``hf`` as safetensors at ``path`` (once: a directory that already
    holds it is reused), read it back with a weight format's ``read`` (``SafetensorsFormat()
    .load``), check the architecture it reports, and :func:`load_model` ``cls`` from it;
    ``config`` entries replace the checkpoint's."""
    path = Path(path)
    if not (path / "config.json").exists():
        hf.save_pretrained(str(path), safe_serialization=True)
    checkpoint = read(str(path))
    assert checkpoint.architecture in cls.hf_architectures, checkpoint.architecture
    return load_model(cls, checkpoint, config={**checkpoint.config, **(config or {})},
                      **kwargs)


def gguf_tensors(state: Mapping[str, torch.Tensor], arch: str, num_layers: int, *,
                 transform: Callable[[str, Any], Any] | None = None,
                 skip: Iterable[str] = ()) -> Iterator[tuple[str, Any]]:
    """``(gguf name, float32 numpy array)`` for each tensor of an HF ``state`` dict, named
    by the ``gguf`` package's map for GGUF architecture ``arch`` (what llama.cpp's converter
    uses). ``transform(hf name, array)`` may rewrite an array (a row permutation); names in
    ``skip`` are left out. A name the map does not know raises ``KeyError``."""
    import gguf
    import numpy as np

    arch_id = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch)
    names = gguf.get_tensor_name_map(arch_id, num_layers)
    skipped = set(skip)
    for name, tensor in state.items():
        if name in skipped:
            continue
        mapped = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if mapped is None:
            raise KeyError(f"the gguf name map of {arch!r} does not know {name!r}")
        array = tensor.detach().float().numpy()
        if transform is not None:
            array = transform(name, array)
        yield mapped, np.ascontiguousarray(array)


def gguf_metadata(config: Any, **extra: Any) -> dict[str, Any]:
    """The architecture keys llama.cpp's converter writes for a transformers ``config`` (sizes,
    heads, norm epsilon, RoPE base and rotated features), without the ``<arch>.`` prefix, for
    :func:`write_gguf`; ``extra`` adds or replaces keys."""
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    rope = getattr(config, "rope_parameters", None) or {}
    partial = rope.get("partial_rotary_factor") or getattr(config, "partial_rotary_factor",
                                                           None) or 1.0
    metadata: dict[str, Any] = {
        "block_count": config.num_hidden_layers,
        "context_length": config.max_position_embeddings,
        "embedding_length": config.hidden_size,
        "feed_forward_length": config.intermediate_size,
        "attention.head_count": heads,
        "attention.head_count_kv": config.num_key_value_heads or heads,
        "attention.layer_norm_rms_epsilon": float(config.rms_norm_eps),
        "rope.freq_base": float(rope.get("rope_theta") or getattr(config, "rope_theta", 1e4)),
        "rope.dimension_count": int(head_dim * partial),
    }
    if head_dim != config.hidden_size // heads:
        metadata["attention.key_length"] = metadata["attention.value_length"] = head_dim
    return {**metadata, **extra}


def write_gguf(path: str | Path, arch: str, metadata: Mapping[str, Any],
               tensors: Iterable[tuple[str, Any]], vocab_size: int) -> None:
    """Write a GGUF file of architecture ``arch``: ``metadata`` keys without the ``<arch>.``
    prefix (ints as uint32, floats as float32, strings, bools, lists of numbers as float32
    arrays), a placeholder vocabulary of ``vocab_size`` tokens, and ``tensors``."""
    import gguf

    writer = gguf.GGUFWriter(str(path), arch)
    for key, value in metadata.items():
        full = f"{arch}.{key}"
        if isinstance(value, bool):
            writer.add_bool(full, value)
        elif isinstance(value, int):
            writer.add_uint32(full, value)
        elif isinstance(value, float):
            writer.add_float32(full, value)
        elif isinstance(value, str):
            writer.add_string(full, value)
        else:
            writer.add_array(full, [float(v) for v in value])
    writer.add_tokenizer_model("llama")
    writer.add_token_list([f"t{i}" for i in range(vocab_size)])
    writer.add_token_scores([0.0] * vocab_size)
    writer.add_token_types([1] * vocab_size)
    for name, array in tensors:
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def read_gguf(path: str | Path) -> tuple[dict[str, Any], list[tuple[str, torch.Tensor]]]:
    """``(metadata, [(name, float32 tensor)])`` of a GGUF file of float tensors, read with
    the ``gguf`` package's reader (independent of tallow's own)."""
    import gguf
    import numpy as np

    reader = gguf.GGUFReader(str(path))
    metadata = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    tensors = [(t.name, torch.from_numpy(np.array(t.data, dtype=np.float32)))
               for t in reader.tensors]
    return metadata, tensors
