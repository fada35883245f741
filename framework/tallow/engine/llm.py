"""The offline Python API: ``from tallow import LLM, SamplingParams``."""

from __future__ import annotations

from typing import Any, Iterable, Sequence

from .llm_engine import LLMEngine
from .outputs import RequestOutput
from .sampling_params import SamplingParams

# Flat keyword → (section, field) of the configuration, for LLM(**kwargs).
_FLAT_KEYS = {
    "model": ("model", "source"), "dtype": ("model", "dtype"), "device": ("model", "device"),
    "revision": ("model", "revision"), "max_model_len": ("model", "max_model_len"),
    "seed": ("model", "seed"), "served_model_name": ("model", "served_model_name"),
    "weight_format": ("model", "weight_format"), "isq": ("model", "isq"),
    "block_size": ("cache", "block_size"), "num_blocks": ("cache", "num_blocks"),
    "kv_fraction": ("cache", "kv_fraction"), "mem_mb": ("cache", "mem_mb"),
    "kv_codec": ("cache", "kv_codec"),
    "enable_prefix_caching": ("cache", "enable_prefix_caching"),
    "max_num_seqs": ("scheduler", "max_num_seqs"),
    "max_num_batched_tokens": ("scheduler", "max_num_batched_tokens"),
    "prefill_chunk_size": ("scheduler", "prefill_chunk_size"),
    "policy": ("scheduler", "policy"),
    "async_scheduling": ("scheduler", "async_scheduling"),
    "attention_backend": ("runner", "attention_backend"),
    "disable_cuda_graph": ("runner", "disable_cuda_graph"),
    "max_cuda_graph_batch": ("runner", "max_cuda_graph_batch"),
}


def config_from_kwargs(**kwargs: Any) -> Any:
    from tallow.config import config_from_mapping

    nested: dict[str, dict[str, Any]] = {}
    for key, value in kwargs.items():
        if key not in _FLAT_KEYS:
            raise TypeError(f"LLM() got an unexpected keyword argument {key!r} "
                            f"(known: {', '.join(sorted(_FLAT_KEYS))})")
        section, name = _FLAT_KEYS[key]
        nested.setdefault(section, {})[name] = value
    return config_from_mapping(nested, origin="LLM() arguments")


class LLM:
    """Generate from a local model: ``LLM(model="path/or/id").generate(prompts, params)``.

    With no ``model``, the embedded default model is used. Other keywords are engine settings
    (``dtype``, ``device``, ``max_model_len``, ``block_size``, ``prefill_chunk_size``, ...).
    """

    def __init__(self, model: str | None = None, **kwargs: Any) -> None:
        config = config_from_kwargs(model=model, **kwargs)
        self.engine = LLMEngine.from_config(config)
        self.config = config

    def get_tokenizer(self) -> Any:
        return self.engine.tokenizer

    def generate(self, prompts: str | list[int] | Sequence[str | list[int]],
                 params: SamplingParams | Sequence[SamplingParams] | None = None, *,
                 priority: Sequence[int] | None = None) -> list[RequestOutput]:
        """Outputs in the order of ``prompts``. A prompt is a string or a list of token ids."""
        if isinstance(prompts, str) or (isinstance(prompts, list) and prompts
                                        and isinstance(prompts[0], int)):
            prompts = [prompts]  # type: ignore[list-item]
        prompts = list(prompts)
        if params is None:
            params = SamplingParams()
        plist = list(params) if isinstance(params, (list, tuple)) else [params] * len(prompts)
        if len(plist) != len(prompts):
            raise ValueError(f"params: got {len(plist)} SamplingParams for {len(prompts)} "
                             "prompts")
        ids = []
        try:
            for i, (prompt, p) in enumerate(zip(prompts, plist)):
                rid = self.engine.next_request_id()
                self.engine.add_request(rid, prompt, p, stream=False,
                                        priority=priority[i] if priority else 0)
                ids.append(rid)
        except Exception:
            for rid in ids:
                self.engine.abort(rid)
            raise
        return self._run(ids)

    def _run(self, ids: list[str]) -> list[RequestOutput]:
        done: dict[str, RequestOutput] = {}
        while self.engine.has_unfinished():
            for out in self.engine.step():
                if out.finished:
                    done[out.request_id] = out
        return [done[rid] for rid in ids]

    def chat(self, messages: list[dict[str, Any]] | Sequence[list[dict[str, Any]]],
             params: SamplingParams | None = None, *, tools: list[dict] | None = None,
             add_generation_prompt: bool = True,
             chat_template_kwargs: dict[str, Any] | None = None) -> list[RequestOutput]:
        """Render each conversation through the model's chat template and generate."""
        conversations: Iterable[list[dict[str, Any]]]
        if messages and isinstance(messages[0], dict):
            conversations = [messages]  # type: ignore[list-item]
        else:
            conversations = messages  # type: ignore[assignment]
        tok = self.engine.tokenizer
        prompts = [tok.encode(tok.apply_chat_template(
            conv, tools=tools, add_generation_prompt=add_generation_prompt,
            **(chat_template_kwargs or {})), add_special_tokens=False) for conv in conversations]
        return self.generate(prompts, params)
