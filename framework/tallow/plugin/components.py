"""Base classes of the components that plugins register. :class:`Component` and the KV-cache
and attention contracts (:class:`KVTensor`, :class:`KVCodec`, :class:`AttentionBackend`) are
defined in :mod:`tallow.types`, below the kernels and layers that implement them, and
re-exported here.

They import no torch: a plugin's registration module may import :mod:`tallow.plugin` freely, and
listing plugins stays cheap. Tensor types appear only in annotations.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Iterator

from tallow.types import AttentionBackend as AttentionBackend
from tallow.types import Component as Component
from tallow.types import KVCodec as KVCodec
from tallow.types import KVTensor as KVTensor

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from tokenizers import Tokenizer

    from tallow.config import TallowConfig

    from .calibration import CalibrationRequest
    from .embedding_spec import EmbeddingSpec


# ---------------------------------------------------------------------------------------------
# Weights
# ---------------------------------------------------------------------------------------------
@dataclass
class Checkpoint:
    """What a :class:`WeightFormat` read from a model source.

    ``config`` is an HF-style ``config.json`` dict (a GGUF loader builds one from the metadata
    through the architecture's ``config_from_gguf``). ``tensors()`` yields ``(name, tensor)``
    pairs named as the checkpoint names them; ``naming`` says which scheme (``"hf"`` or
    ``"gguf"``), and the model's ``load_weights`` maps them.

    A format checks its files while it builds the checkpoint (headers against file sizes,
    metadata against tensors) and raises :class:`tallow.plugin.ModelFileError` for a damaged
    one, so that nothing is allocated from a corrupt count.
    """

    source: str
    config: dict[str, Any]
    architecture: str
    tensors: Callable[[], Iterator[tuple[str, "torch.Tensor"]]]
    naming: str = "hf"
    #: a ``tokenizers.Tokenizer``; None if the source carries none
    tokenizer: Tokenizer | None = None
    #: ``tokenizer_config.json``-style dict: bos_token, eos_token, add_bos_token, chat_template...
    tokenizer_config: dict[str, Any] = field(default_factory=dict)
    generation_config: dict[str, Any] = field(default_factory=dict)
    #: the quant scheme its quantized tensors are for (e.g. "gguf"), or None for plain weights.
    #: Such tensors arrive as :class:`tallow.layers.QuantizedWeight`; without that scheme
    #: installed they are dequantized at load.
    quantization: str | None = None
    #: free-form facts the format wants to pass on (GGUF metadata, file paths, ...)
    extra: dict[str, Any] = field(default_factory=dict)
    #: name -> shape (torch order) of every tensor ``tensors()`` yields, as the files' headers
    #: state them (read without touching tensor data); None when the format cannot tell. The
    #: engine checks the config against it before building the model.
    tensor_shapes: dict[str, tuple[int, ...]] | None = None
    #: the file ``config`` was read from (``config.json``, the ``.gguf``), for error messages
    config_path: str | None = None
    #: what the checkpoint's own files say about its embeddings (a sentence-transformers
    #: directory's pooling and normalization), or None when they say nothing
    embedding: "EmbeddingSpec | None" = None

    @property
    def chat_template(self) -> str | None:
        return self.tokenizer_config.get("chat_template")


class WeightFormat(Component):
    """Reads one kind of model source into a :class:`Checkpoint`."""

    @classmethod
    def claims(cls, source: str) -> bool:
        """True when ``source`` (a path, a file or a hub id) is in this format."""
        raise NotImplementedError

    def load(self, source: str, *, revision: str | None = None) -> Checkpoint:
        raise NotImplementedError


# ---------------------------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------------------------
class ModelArchitecture:
    """The contract of a model class registered through ``tallow_register_architectures``.

    The class is an ``torch.nn.Module`` built from :mod:`tallow.layers` (the base
    :class:`tallow.layers.CausalLM` implements the plumbing); this class documents what the
    engine calls:

    - ``__init__(config: tallow.layers.ArchConfig, build: tallow.layers.BuildContext)``;
    - ``forward(input_ids [T], positions [T]) -> hidden [T, H]`` over one flat batch, with the
      attention metadata of the step in the forward context (:mod:`tallow.layers.attention`);
    - ``compute_logits(hidden [N, H]) -> logits [N, V]``, float32 or the head's own dtype (the
      engine widens them to float32 for sampling and logprobs; plain greedy rows take the
      argmax of the logits as returned);
    - ``load_weights(tensors, naming) -> set[str]`` the parameter names it filled;
    - ``config_from_gguf(metadata, config) -> dict`` (classmethod): refine the HF-style config
      that the GGUF format derived generically from ``metadata``;
    - ``config_from_hf(config) -> dict`` (classmethod, optional): complete the config of any
      other checkpoint (``config.json``), e.g. with the defaults its config class implies;
      the engine builds the model and sizes vocabulary and context from the result.
    """

    hf_architectures: ClassVar[tuple[str, ...]] = ()
    gguf_architectures: ClassVar[tuple[str, ...]] = ()


# ---------------------------------------------------------------------------------------------
# Quantization (KV codecs and attention backends: tallow.types)
# ---------------------------------------------------------------------------------------------
class QuantScheme(Component):
    """A weight quantization scheme.

    How the engine chooses one when a model loads (:mod:`tallow.engine.quant_choice`):

    - a quantized checkpoint (``Checkpoint.quantization``: a ``config.json``'s
      ``quantization_config.quant_method``, ``"gguf"`` for a GGUF file of quantized blocks) is
      *claimed* by every installed scheme that serves its method (the scheme's name, or a
      method it lists at registration: ``registry.register("int4", "...", quant_methods=
      ("gptq", "awq", "compressed-tensors"))``) and whose ``detect(config)`` accepts the
      checkpoint's HF-style config. One claim: that scheme serves, if ``validate(config)``
      gives no reasons and the device meets ``min_capability``; otherwise the engine logs why
      and the tensors are dequantized at load, as when no scheme claims the checkpoint. Two
      claims stop the load naming both and ``model.quant_scheme``, the setting that picks one;
    - ``model.isq`` (load-time quantization of a float model) takes the one scheme whose
      ``isq_types`` lists the type; a type none lists is refused naming those offered.

    The chosen class is instantiated as ``cls(config, isq=<type or None>)`` (``config`` the
    :class:`tallow.config.TallowConfig`; settings under ``plugins.settings.<distribution>``)
    and the instance is the model's ``BuildContext.quant``. A checkpoint's scheme then reads
    how the weights are stored through ``use_checkpoint_config(config)``, before the model is
    built. Layers ask it for their storage and matmul through ``linear_method(prefix)``,
    ``head_method(prefix)`` (the LM head) and ``embedding_method(prefix)`` (token
    embeddings), each optional and each returning a :class:`tallow.layers.LinearMethod` or
    None to leave the layer unquantized (see :mod:`tallow.layers.linear_method`).
    ``summary()`` (optional) describes what it holds once the weights are loaded, for the
    start-up log. A scheme that quantizes from calibration data asks for it through
    ``calibration_request()`` (:mod:`tallow.plugin.calibration`). ``min_capability`` is the lowest CUDA compute capability (major*10+minor)
    its kernels run on (0: any, CPU included).
    """

    min_capability: ClassVar[int] = 0
    #: weight types ``model.isq`` may name that this scheme quantizes float weights to
    isq_types: ClassVar[tuple[str, ...]] = ()
    #: File types ``tallow quantize --type`` may ask this scheme to write (lower-case names,
    #: e.g. ``"q4_k_m"``); empty for a scheme that does not write model files.
    file_types: ClassVar[tuple[str, ...]] = ()

    def __init__(self, config: TallowConfig | None = None, isq: str | None = None) -> None:
        self.config = config
        self.isq = isq
        #: the HF-style config of the checkpoint whose quantized weights this instance holds
        #: (empty under load-time quantization): see :meth:`use_checkpoint_config`
        self.checkpoint_config: dict[str, Any] = {}

    @classmethod
    def detect(cls, config: dict[str, Any]) -> bool:
        """Whether the HF-style checkpoint ``config`` (of a quantization method the scheme
        serves) holds weights in an encoding of this scheme. The default claims every
        checkpoint of its methods; a scheme that shares a method with others
        (``compressed-tensors``) recognises its own by the ``quantization_config``. It only
        recognises: a config it claims but cannot serve is refused by
        :meth:`use_checkpoint_config`, naming the field."""
        return True

    def use_checkpoint_config(self, config: dict[str, Any]) -> None:
        """Called by the engine once, before the model is built, with the HF-style config of
        the checkpoint whose quantized weights this instance will hold (its
        ``quantization_config`` says how they are stored: code width, groups, zero points,
        scale granularity, activation scheme). Raise ``ValueError`` naming the field for a
        configuration the scheme cannot serve; the engine reports it against the
        checkpoint's config file. The default keeps it as :attr:`checkpoint_config`."""
        self.checkpoint_config = dict(config)

    def calibration_request(self) -> "CalibrationRequest | None":
        """Asked once the weights are loaded: None, or the text the engine must run the model
        over before the scheme can quantize (a calibrated quantizer, whose layers kept their
        float weights so far; see :mod:`tallow.plugin.calibration`). The engine then calls
        :meth:`calibrated`."""
        return None

    def calibrated(self) -> None:
        """Called after the engine ran the model over the text of :meth:`calibration_request`
        (and before anything else runs it): quantize what was held back."""

    @classmethod
    def quantize_file(
        cls,
        checkpoint: Checkpoint,
        out_path: str,
        file_type: str,
        *,
        device: str = "cpu",
        progress: bool = True,
    ) -> dict[str, Any]:
        """Write ``checkpoint`` (as a weight format read it: config, tokenizer, tensors) to the
        model file ``out_path`` quantized as ``file_type``, one of :attr:`file_types`,
        computing on ``device`` (``"cpu"``, ``"cuda"``, ``"cuda:1"``...). ``progress`` asks for
        a progress bar on a terminal. Returns a JSON-able summary of what was written (the
        tensors per type, the file's bytes, the seconds taken); ``tallow quantize`` prints it.
        Raises ``ValueError`` with a message for the user when the checkpoint cannot be written
        in this format. Only schemes that list file types implement it."""
        raise NotImplementedError(f"quant scheme {cls.name!r} does not write model files")


# ---------------------------------------------------------------------------------------------
# Tools
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ToolResult:
    """What one tool call returned, as the model will read it.

    ``content`` is text (a provider turns images, resources or structured output into text
    itself). ``is_error`` marks a failed call (the tool raised, timed out, its server is down,
    its result was too large): the model still sees ``content``, which says what went wrong.
    """

    content: str
    is_error: bool = False


class ToolProvider(Component):
    """Tools the server offers to the model and runs itself (an MCP client, say).

    A provider is registered as a class (``tallow_register_tool_providers``); the server builds
    one instance with :meth:`from_config` and drives it through this contract only:

    1. :meth:`start` once, on the event loop that will call it, before the first request;
    2. :meth:`list_tools` whenever it needs the current tools (after a change notification,
       see :meth:`on_tools_changed`), :meth:`call_tool` for each call the model makes,
       concurrently from many requests; :meth:`status` for ``/v1/plugins`` and ``/v1/tools``;
    3. :meth:`stop` once, at shutdown.

    A source of tools that cannot be reached must never stop the server: :meth:`start`
    reports it in :meth:`status` and the provider keeps retrying on its own.
    """

    @classmethod
    def from_config(cls, config: TallowConfig) -> "ToolProvider | None":
        """The provider for ``config`` (a :class:`tallow.config.TallowConfig`), or None when
        the configuration gives it nothing to offer (no servers configured, say). Bad settings
        raise :class:`tallow.plugin.PluginSettingsError` naming the key."""
        return cls()

    async def start(self) -> None:
        """Connect to the tool sources. Returns once each source was tried once (bounded by
        the provider's own timeouts); a source that failed is reported by :meth:`status` and
        retried in the background. Must not raise for an unreachable source."""

    async def stop(self) -> None:
        """Disconnect and release what :meth:`start` acquired (subprocesses, connections).
        Must not raise."""

    async def list_tools(self) -> list[dict[str, Any]]:
        """The tools offered now, as OpenAI tool definitions: ``{"type": "function",
        "function": {"name", "description", "parameters"}}``; names are unique within the
        provider and match ``^[A-Za-z0-9_-]{1,64}$``; ``parameters`` is a JSON Schema."""
        raise NotImplementedError

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        """Run tool ``name`` (one :meth:`list_tools` offered) with the model's ``arguments``.

        Every failure the model should hear about — an unknown tool, bad arguments, a tool
        error, a timeout, a result over a size limit, a source that went away — is returned as
        a :class:`ToolResult` with ``is_error`` set, never raised. Cancelling the awaiting
        task (the client went away) cancels the call at its source where the source allows.
        """
        raise NotImplementedError

    def on_tools_changed(self, callback: Callable[[], None]) -> None:
        """Have ``callback()`` called (on the event loop, without arguments) each time the
        tools :meth:`list_tools` returns may have changed: a source connected, went away, or
        announced a new list. The default never calls it (the tools never change)."""

    def status(self) -> dict[str, Any]:
        """A JSON-able description of the provider's state for operators:
        ``{"sources": [{"name", "state", "tool_names", "tools", "error", ...}, ...]}``, every
        key optional; ``state`` one of ``connecting``, ``up``, ``down``, ``stopped``;
        ``tool_names`` a list of the tool names of a source that is up, ``tools`` their
        count, ``error`` why it is down (:func:`check_tool_provider_status` checks it)."""
        return {}


#: the keys of a tool provider's status source that the server reads, and their types
_SOURCE_KEYS: dict[str, type | tuple[type, ...]] = {
    "name": str,
    "state": str,
    "tool_names": list,
    "tools": int,
    "error": str,
}
_SOURCE_STATES = ("connecting", "up", "down", "stopped")


def check_tool_provider_status(status: object) -> list[str]:
    """What in ``status`` (a :meth:`ToolProvider.status` result) breaks its documented
    contract; empty when it follows it."""
    if not isinstance(status, dict):
        return [f"status() returned {type(status).__name__}, not a dict"]
    sources = status.get("sources", [])
    if not isinstance(sources, list):
        return [f"status()['sources'] is {type(sources).__name__}, not a list"]
    problems = []
    for i, source in enumerate(sources):
        where = f"status()['sources'][{i}]"
        if not isinstance(source, dict):
            problems.append(f"{where} is {type(source).__name__}, not a dict")
            continue
        for key, kind in _SOURCE_KEYS.items():
            if key in source and (
                not isinstance(source[key], kind) or isinstance(source[key], bool)
            ):
                problems.append(
                    f"{where}[{key!r}] is {type(source[key]).__name__}, expected "
                    f"{getattr(kind, '__name__', kind)}"
                )
        if isinstance(source.get("state"), str) and source["state"] not in _SOURCE_STATES:
            problems.append(
                f"{where}['state'] is {source['state']!r}, expected one of "
                f"{', '.join(_SOURCE_STATES)}"
            )
        names = source.get("tool_names")
        if isinstance(names, list) and not all(isinstance(n, str) for n in names):
            problems.append(f"{where}['tool_names'] holds a non-string")
    return problems
