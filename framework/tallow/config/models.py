"""Every setting of tallow, as pydantic models: one section per concern, unknown keys refused.

Each field carries its documentation (``description``) and, where the generated command-line
flag is not simply ``--<field-name>``, the flag in ``json_schema_extra={"flag": ...}`` (and
where the keyword of ``LLM()`` is not the field's name, ``"keyword"``). The CLI
(:func:`tallow.config.add_config_arguments`), the environment scheme, the keyword arguments of
the Python API (:mod:`tallow.config.keywords`) and ``docs/configuration.md`` are all derived from
these models, so a new setting is added here once.
"""

from __future__ import annotations

import re
import warnings
from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from .hosts import split_host_entries

_DEVICE = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


def _flag(name: str | None, **extra: object) -> dict[str, Any]:
    return {"flag": name, **extra}


class Section(BaseModel):
    """Base of every config section: unknown keys are errors, assignments are re-validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, validate_default=True)

    # field → where its value came from, filled by tallow.config.load_config
    _origins: dict[str, str] = PrivateAttr(default_factory=dict)

    def setting_origin(self, name: str) -> str:
        """Where the value of field ``name`` came from (``"env TALLOW_PLUGINS__DISABLE"``,
        ``"file tallow.yaml"``, ``"flag --disable-plugin"``, ``"LLM() keyword plugins"``); empty
        for a default or a value set in code after loading."""
        return self._origins.get(name, "")

    def __setattr__(self, name: str, value: object) -> None:
        super().__setattr__(name, value)
        if not name.startswith("_"):
            self._origins.pop(name, None)  # set in code: the recorded source no longer holds

    def __eq__(self, other: object) -> bool:
        # the recorded sources are bookkeeping, not part of a configuration's value
        if not isinstance(other, Section):
            return NotImplemented
        return type(self) is type(other) and self.__dict__ == other.__dict__

    __hash__ = None  # type: ignore[assignment]  # mutable, as pydantic's models


class ModelConfig(Section):
    """Which model to serve and how to hold its weights."""

    source: Optional[str] = Field(
        None,
        description="Model to serve: a local directory, a GGUF file, a hub id, or a name a weight "
        "format claims (e.g. random:<arch>). None serves the embedded default model "
        "(Qwen2.5-Coder-0.5B-Instruct, GGUF).",
        json_schema_extra=_flag("--model", keyword="model"),
    )
    revision: Optional[str] = Field(
        None, description="Revision (branch, tag or commit) of a hub model."
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto",
        description="Activation and unquantized weight dtype; auto picks bfloat16 on a "
        "GPU that supports it, float32 on CPU.",
    )
    device: str = Field("auto", description="auto, cpu, cuda or cuda:N.")
    max_model_len: Optional[int] = Field(
        None,
        gt=0,
        description="Longest sequence (prompt + output) accepted; None takes the "
        "model's own limit.",
    )
    served_model_name: Optional[str] = Field(
        None,
        description="Model name reported by /v1/models and expected in requests; None "
        "derives it from the source.",
    )
    weight_format: str = Field(
        "auto",
        description="Name of the weight-format plugin that loads the source; auto asks "
        "every format, highest priority first, whether it claims the source.",
    )
    seed: int = Field(
        0,
        ge=0,
        description="Seed of the random number generators (sampling "
        "without a per-request seed, random weights).",
    )
    tokenizer: Optional[str] = Field(
        None,
        description="Directory with a tokenizer.json (and, when present, "
        "tokenizer_config.json, generation_config.json, chat_template.jinja) to use instead of "
        "the model source's tokenizer; its token ids must fit the model's vocabulary.",
    )
    isq: Optional[str] = Field(
        None,
        description="Quantize a float model's weights while it loads, layer by layer on "
        "the device, into this type: any type an installed quant-scheme plugin offers (an "
        "unknown one is refused, listing those offered). The GGML types q4_0, q4_1, q5_0, "
        "q5_1, q8_0, q2_k, q3_k, q4_k, q5_k, q6_k (tallow-quant-gguf): every matrix takes it, "
        "embedding and head included, except rows that are not whole blocks of it, which take "
        "llama.cpp's fallback type. fp8 (tallow-quant-fp8): every linear layer in float8 e4m3 "
        "with one scale per output row (embedding and head too with its isq_vocab setting), "
        "activations of large batches quantized per token. int4 (tallow-quant-int4): 4-bit "
        "codes with a scale and zero point per group of 128 columns for every linear layer "
        "and an untied head, chosen by GPTQ over calibration text (its settings choose the "
        "method, group and calibration); token embeddings stay dense. mxfp4 "
        "(tallow-quant-fp4): e2m1 codes with a power-of-two scale per 32 columns, for the "
        "same layers. None keeps the checkpoint's weights.",
        json_schema_extra=_flag("--isq", metavar="TYPE"),
    )
    quant_scheme: str = Field(
        "auto",
        description="Name of the quant-scheme plugin that keeps a quantized "
        "checkpoint's weights (or quantizes them under model.isq); auto takes the one installed "
        "scheme that claims the checkpoint (its quantization_config.quant_method among the "
        "scheme's, and the scheme's detect accepting the config) or offers the isq type. Needed "
        "only when two installed schemes claim the same checkpoint or type.",
    )

    task: Literal["auto", "generate", "embed"] = Field(
        "auto",
        description="What the model is served for: generate (completions and chat) or "
        "embed (/v1/embeddings, LLM.embed; each input computed whole in one step, nothing "
        "cached after it). auto embeds with encoder-only models (BERT) and with model "
        "directories that carry sentence-transformers files (modules.json), else generates.",
    )
    pooling: Literal["auto", "mean", "cls", "last"] = Field(
        "auto",
        description="How an embedding is pooled from the hidden states of its tokens "
        "(task embed): their mean, the first (CLS) token or the last token. auto: as the "
        "model's sentence-transformers files say, else the model's own default (mean for "
        "encoders, last token for decoders).",
    )
    normalize_embeddings: Optional[bool] = Field(
        None,
        description="Scale embeddings to unit length (task embed). None: as the model's "
        "sentence-transformers files say (a Normalize module), true when it has none. "
        "Requests may ask for fewer dimensions only of normalized embeddings.",
    )

    @field_validator("isq")
    @classmethod
    def _check_isq(cls, value: Optional[str]) -> Optional[str]:
        if value is not None and not _NAME.match(value):
            raise ValueError(
                "expected a quantization type name such as q4_k, fp8 or int4 "
                "(lower-case letters, digits and _)"
            )
        return value

    @field_validator("device")
    @classmethod
    def _check_device(cls, value: str) -> str:
        if not _DEVICE.match(value):
            raise ValueError("expected auto, cpu, cuda or cuda:N")
        return value


class CacheConfig(Section):
    """The paged KV cache."""

    block_size: int = Field(16, gt=0, le=1024, description="Tokens per KV block (a power of two).")
    kv_fraction: float = Field(
        0.9,
        gt=0.0,
        le=1.0,
        description="Fraction of the device memory left free after the "
        "model is loaded that the KV cache may take.",
    )
    mem_mb: Optional[int] = Field(
        None,
        gt=0,
        description="KV-cache budget in MiB; overrides kv_fraction.",
        json_schema_extra=_flag("--mem", metavar="MB"),
    )
    kv_codec: str = Field(
        "auto",
        description="How K and V are stored (a kv-codec plugin: auto "
        "keeps the model dtype; fp8 and fp8_e5m2 of tallow-kvcache-fp8 "
        "store 8-bit floats, half the bytes of bf16; turbo8, turbo4 and "
        "turbo3 of tallow-kvcache-turboquant rotate and quantize to 8, 4 or "
        "3 bits, about 2, 3.9 and 5.1 times the tokens of bf16; others when "
        "installed).",
    )
    enable_prefix_caching: bool = Field(
        True, description="Reuse the KV blocks of prompt prefixes shared between requests."
    )
    num_blocks: Optional[int] = Field(
        None, gt=0, description="Exact number of KV blocks; overrides the memory budget."
    )
    encoder_cache_mb: int = Field(
        1024,
        gt=0,
        description="Device memory in MiB for the image-encoder outputs of a "
        "vision-language model, kept by image hash (least recently used evicted).",
    )

    @field_validator("block_size")
    @classmethod
    def _power_of_two(cls, value: int) -> int:
        if value & (value - 1):
            raise ValueError("expected a power of two")
        return value


class SchedulerConfig(Section):
    """Continuous batching: how much work one engine step takes on."""

    max_num_seqs: int = Field(256, gt=0, description="Most sequences running in one step.")
    max_num_batched_tokens: int = Field(
        8192, gt=0, description="Token budget of one step (prefill chunks and decodes together)."
    )
    prefill_chunk_size: Optional[int] = Field(
        None,
        gt=0,
        description="Longest piece of one prompt prefilled in a step; None lets a "
        "prompt take what is left of the step's budget.",
    )
    max_waiting: int = Field(
        1024, gt=0, description="Requests that may wait for a slot before new ones are refused."
    )
    policy: Literal["fcfs", "priority"] = Field(
        "fcfs",
        description="Order of admission: first come first served, or by request "
        "priority (then arrival).",
        json_schema_extra=_flag("--scheduling-policy"),
    )
    async_scheduling: bool = Field(
        True,
        description="Plan and launch the next step while the device still runs the "
        "current one (sampled tokens feed the next step on the device); steps with penalties, "
        "logprobs or n > 1 forks still wait for their tokens. Same tokens as without it.",
    )


class RunnerConfig(Section):
    """The model runner: attention backend, CUDA graphs, structured-output grammars."""

    attention_backend: str = Field(
        "auto",
        description="Name of the attention backend; auto takes the highest-priority "
        "backend that can serve the model and device.",
    )
    disable_cuda_graph: bool = Field(
        False, description="Run decode steps eagerly instead of replaying captured CUDA graphs."
    )
    max_cuda_graph_batch: int = Field(
        256,
        gt=0,
        description="Largest decode batch captured in a CUDA graph; larger batches run eagerly.",
    )
    grammar_backend: str = Field(
        "auto",
        description="Name of the grammar backend for structured outputs "
        "(response_format, guided decoding, forced tool calls; a grammar-backend plugin: "
        "xgrammar or llguidance); auto takes the highest-priority one that is installed and "
        "enabled.",
    )
    grammar_cache_size: int = Field(
        256,
        gt=0,
        description="Compiled grammars (one per distinct JSON Schema, regex, choice "
        "list or EBNF grammar) kept for reuse.",
    )
    grammar_compile_timeout_s: float = Field(
        10.0,
        gt=0,
        description="Seconds one grammar compile may take; a longer one is stopped "
        "(its worker process ends, freeing the CPU) and the request gets a 400. Backends that "
        "can hand a compiled grammar across processes (xgrammar) compile in a worker process; "
        "others compile in a thread with no time limit.",
    )
    grammar_max_spec_chars: int = Field(
        131072,
        gt=0,
        description="Largest JSON Schema, regex, choice list or EBNF grammar (in "
        "characters) a request may ask to compile; a larger one is a 400.",
    )


class SpeculativeConfig(Section):
    """Speculative decoding: a speculator proposes tokens, the model verifies them in one
    step."""

    method: Optional[str] = Field(
        None,
        description="Name of the speculator (a speculator plugin: ngram for prompt "
        "lookup, say; the built-in draft for a draft model, mtp for the multi-token "
        "prediction layers a checkpoint ships); None decodes one token per step. Steps then run synchronously (a "
        "proposal needs the previous step's tokens).",
        json_schema_extra=_flag("--speculative-method"),
    )
    num_speculative_tokens: int = Field(
        4,
        gt=0,
        le=64,
        description="Most tokens proposed per sequence and step (k); a "
        "verify step computes k + 1 tokens of each sequence and emits 1 to k + 1.",
    )
    adaptive: bool = Field(
        False,
        description="Adapt each sequence's k to its acceptance: grow it by one after a "
        "step that accepted every proposed token, shrink it by one after a step that accepted "
        "fewer than half (between 1 and num_speculative_tokens).",
        json_schema_extra=_flag("--speculative-adaptive"),
    )
    draft_model: Optional[str] = Field(
        None,
        description="The draft model of method draft: any source model.source takes (a "
        "local directory, a GGUF file, a hub id, random:<arch>). It must share the model's "
        "tokenizer; it runs on the model's device with its own KV cache.",
        json_schema_extra=_flag("--draft-model"),
    )
    draft_dtype: Optional[Literal["auto", "float32", "bfloat16", "float16"]] = Field(
        None,
        description="Activation and unquantized weight dtype of the draft model; None "
        "takes model.dtype.",
        json_schema_extra=_flag("--draft-dtype"),
    )
    draft_quantization: Optional[str] = Field(
        None,
        description="Quantize the draft model's weights while it loads, into this type "
        "(as model.isq does for the model); None keeps its checkpoint's weights.",
        json_schema_extra=_flag("--draft-quantization", metavar="TYPE"),
    )
    draft_kv_cache_mb: Optional[int] = Field(
        None,
        gt=0,
        description="KV-cache budget of the draft model in MiB. None: on a GPU half of the "
        "memory left after its weights (the model's cache is sized first, so lower "
        "cache.kv_fraction to leave room), on a CPU what max_num_seqs sequences of "
        "max_model_len tokens need, at most 1 GiB.",
        json_schema_extra=_flag("--draft-kv-cache-mb"),
    )

    @field_validator("method")
    @classmethod
    def _method_name(cls, value: Optional[str]) -> Optional[str]:
        if value is not None and not value.strip():
            raise ValueError("expected a speculator name or null")
        return value

    @model_validator(mode="after")
    def _draft_settings(self) -> "SpeculativeConfig":
        draft = [
            n for n in ("draft_model", "draft_dtype", "draft_quantization") if getattr(self, n)
        ]
        if self.draft_kv_cache_mb is not None:
            draft.append("draft_kv_cache_mb")
        if self.method == "draft" and not self.draft_model:
            raise ValueError(
                "speculative.method draft needs speculative.draft_model (the draft model's "
                "source: a directory, a GGUF file, a hub id or random:<arch>)"
            )
        if draft and self.method != "draft":
            raise ValueError(
                f"speculative.{draft[0]} is set but speculative.method is {self.method!r}; "
                "the draft settings serve method draft only"
            )
        return self


class ParallelConfig(Section):
    """Tensor parallelism over torch.distributed: ranks, nodes, rendezvous, failure limits."""

    tensor_parallel_size: int = Field(
        1,
        gt=0,
        description="Ranks the model is split over (one process per GPU). 1 runs in "
        "this process. Under torchrun (WORLD_SIZE set) it defaults to the world size.",
    )
    enable_expert_parallel: bool = Field(
        False,
        description="Mixture-of-experts layers place whole experts on the "
        "tensor-parallel ranks (rank r holds experts r*E/tp .. (r+1)*E/tp - 1; tokens go to "
        "the rank of their expert and back by all-to-all) instead of splitting every expert's "
        "intermediate size; attention stays tensor-parallel. The expert count must divide by "
        "tensor_parallel_size.",
    )
    nnodes: int = Field(
        1,
        gt=0,
        description="Hosts taking part; each runs one tallow launch "
        "with tensor_parallel_size / nnodes ranks. The HTTP server runs on "
        "node 0 only.",
    )
    node_rank: int = Field(
        0,
        ge=0,
        description="Which host this launch is (0 .. nnodes-1); node 0 holds rank 0, the driver.",
    )
    master_addr: Optional[str] = Field(
        None,
        description="Address of node 0, where the ranks meet; None: $MASTER_ADDR, else 127.0.0.1.",
    )
    master_port: Optional[int] = Field(
        None,
        ge=0,
        le=65535,
        description="TCP port of the rendezvous on node 0; None: "
        "$MASTER_PORT, else a free port on a single node and 29500 across nodes.",
    )
    distributed_backend: Literal["auto", "nccl", "gloo"] = Field(
        "auto",
        description="Collectives of the model: auto takes nccl on CUDA devices, gloo on CPU.",
    )
    collective_timeout_s: float = Field(
        600.0,
        gt=0,
        description="How long a collective of a step (or of start-up) may wait "
        "for the other ranks before it fails; a hung rank then stops the engine.",
    )
    heartbeat_timeout_s: float = Field(
        10.0,
        gt=0,
        description="A rank on another host (or started by torchrun) whose "
        "heartbeat is older than this counts as dead; workers leave when the driver's is. "
        "Local worker processes are watched directly, without waiting this long.",
    )

    @field_validator("master_addr")
    @classmethod
    def _address(cls, value: Optional[str]) -> Optional[str]:
        if value is not None and not value.strip():
            raise ValueError("expected a host name or address")
        return value


class ServerConfig(Section):
    """The OpenAI-compatible HTTP server."""

    host: str = Field(
        "0.0.0.0",
        description="Address to listen on; host:port and "
        "[ipv6]:port also set the port, unix:///path listens on a Unix socket.",
    )
    port: int = Field(2000, ge=0, le=65535, description="TCP port (0: any free port).")
    chat_template_timeout_s: float = Field(
        5.0,
        gt=0,
        description="Seconds rendering the model's chat template for one request "
        "may take; a longer render is stopped and the request gets a 400 naming the template.",
    )
    api_keys: list[str] = Field(
        default_factory=list,
        description="Accepted bearer tokens; empty accepts every request. Repeat --api-key for "
        "several.",
        json_schema_extra=_flag("--api-key", metavar="KEY", secret=True),
    )
    max_body_bytes: int = Field(33554432, gt=0, description="Largest request body accepted.")
    tool_parser: str = Field(
        "auto",
        description="Name of the tool-call parser; auto picks the "
        "one that matches the model and its chat template.",
    )
    reasoning_parser: str = Field(
        "auto",
        description="Name of the reasoning parser that splits chat output into "
        "reasoning_content and content (think, deepseek_r1, harmony, gemma4, ...); auto picks "
        "the one that matches the model and its chat template, none turns it off.",
    )
    max_queue: int = Field(
        1024,
        gt=0,
        description="Requests the server holds (waiting or running) before it answers 503.",
    )
    max_sequences_per_request: int = Field(
        256,
        gt=0,
        description="Most sequences one request may ask for (n times the number "
        "of prompts); more is a 400.",
    )
    server_tools: Literal["off", "always"] = Field(
        "off",
        description="Whether chat requests use the tools of the server's tool providers "
        "(MCP servers, say), which the server runs itself in a loop: off, or always; a request's "
        "server_tools field overrides it (see docs/mcp.md).",
    )
    max_tool_rounds: int = Field(
        8, gt=0, le=100, description="Most rounds of server-run tool calls in one chat request."
    )
    ui: bool = Field(
        False,
        description="Serve the built-in chat web UI at /ui and redirect / "
        "to it (the tallow-ui-web plugin; see docs/web-ui.md).",
    )
    allowed_image_hosts: list[str] = Field(
        default_factory=list,
        description="Hosts whose http(s) image URLs the server fetches for image_url content "
        "parts: host, host:port, *.domain (subdomains) or an IP address, comma-separated or "
        "repeated; empty refuses every image link (data: URLs are always accepted). See "
        "docs/api.md#images.",
        json_schema_extra=_flag("--allowed-image-hosts", metavar="HOSTS"),
    )
    max_image_bytes: int = Field(
        20 * 1024 * 1024,
        gt=0,
        description="Largest image file accepted (a data: URL's decoded bytes, a fetched body).",
    )
    max_image_pixels: int = Field(
        8192 * 8192,
        gt=0,
        description="Largest width × height of "
        "an image, checked on its header before its pixels are "
        "decoded.",
    )
    image_fetch_timeout_s: float = Field(
        10.0,
        gt=0,
        description="Seconds fetching one image URL may take in all (redirects included).",
        json_schema_extra=_flag("--image-fetch-timeout", metavar="SECONDS"),
    )

    @field_validator("allowed_image_hosts", mode="before")
    @classmethod
    def _image_hosts(cls, value: object) -> object:
        if isinstance(value, (str, list)):
            return split_host_entries(value)  # a ValueError names the bad entry
        return value

    @field_validator("api_keys")
    @classmethod
    def _non_empty_keys(cls, value: list[str]) -> list[str]:
        if any(not key for key in value):
            raise ValueError("expected non-empty API keys")
        return value


class PluginsConfig(Section):
    """Which plugin distributions load (see docs/plugins.md)."""

    autoload: bool = Field(
        True,
        description="Load every installed plugin distribution; a failing one is reported "
        "and skipped.",
        json_schema_extra=_flag("--autoload-plugins"),
    )
    enable: list[str] = Field(
        default_factory=list,
        description="Distributions to load even when autoload is off; a failure stops start-up.",
        json_schema_extra=_flag("--enable-plugin", metavar="DIST"),
    )
    disable: list[str] = Field(
        default_factory=list,
        description="Distributions never to load.",
        json_schema_extra=_flag("--disable-plugin", metavar="DIST"),
    )
    require: list[str] = Field(
        default_factory=list,
        description="Distributions that must load, with optional version "
        "specifiers (tallow-model-llama>=0.1); missing, mismatched or failing stops start-up.",
        json_schema_extra=_flag("--require-plugin", metavar="REQ"),
    )
    settings: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="Per-plugin settings, keyed by distribution name; "
        "each plugin reads its own in tallow_configure.",
        json_schema_extra=_flag(None),
    )

    @field_validator("enable", "disable")
    @classmethod
    def _names(cls, value: list[str]) -> list[str]:
        for name in value:
            if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
                raise ValueError(f"expected a distribution name, got {name!r}")
        return value

    @field_validator("require")
    @classmethod
    def _requirements(cls, value: list[str]) -> list[str]:
        from packaging.requirements import InvalidRequirement, Requirement

        for text in value:
            try:
                Requirement(text)
            except InvalidRequirement as exc:
                raise ValueError(
                    f"expected a distribution name with optional version specifiers "
                    f"(e.g. tallow-model-llama>=0.1), got {text!r}: {str(exc).splitlines()[0]}"
                ) from None
        return value


# A field named "json" shadows BaseModel.json (a deprecated v1 method); the setting's name is
# fixed, and instance attributes win over that method, so the warning is silenced here only.
with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message='Field name "json"', category=UserWarning)

    class LoggingConfig(Section):
        """Logging of the server and engine."""

        level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] = Field(
            "INFO", description="Lowest level logged.", json_schema_extra=_flag("--log-level")
        )
        json: bool = Field(
            False,
            description="One JSON object per log line.",  # type: ignore[assignment]
            json_schema_extra=_flag("--log-json"),
        )

        @field_validator("level", mode="before")
        @classmethod
        def _upper(cls, value: object) -> object:
            return value.upper() if isinstance(value, str) else value


class TallowConfig(Section):
    """The whole configuration: one attribute per section."""

    model: ModelConfig = Field(default_factory=ModelConfig)
    cache: CacheConfig = Field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = Field(default_factory=SchedulerConfig)
    runner: RunnerConfig = Field(default_factory=RunnerConfig)
    speculative: SpeculativeConfig = Field(default_factory=SpeculativeConfig)
    parallel: ParallelConfig = Field(default_factory=ParallelConfig)
    server: ServerConfig = Field(default_factory=ServerConfig)
    plugins: PluginsConfig = Field(default_factory=PluginsConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)

    # "model" is a section name here, not pydantic's protected namespace.
    model_config = ConfigDict(
        extra="forbid", validate_assignment=True, validate_default=True, protected_namespaces=()
    )


SECTIONS: dict[str, type[Section]] = {
    name: info.annotation  # type: ignore[misc]
    for name, info in TallowConfig.model_fields.items()
}
