"""The synchronous engine: the core and the output processor in one thread (``LLM`` uses it)."""

from __future__ import annotations

import itertools
from typing import Any

from .builder import EngineParts, build_engine
from .output_processor import OutputProcessor
from .outputs import RequestOutput
from .sampling_params import SamplingParams
from .sequence import SequenceStatus


class LLMEngine:
    def __init__(self, parts: EngineParts) -> None:
        self.parts = parts
        self.core = parts.core
        self.tokenizer = parts.tokenizer
        self.model_name = parts.model_name
        self.max_model_len = parts.max_model_len
        self.plugin_manager = parts.plugin_manager
        self.processor = OutputProcessor(parts.tokenizer)
        self._ids = itertools.count()

    @classmethod
    def from_config(cls, config: Any, plugin_manager: Any = None) -> "LLMEngine":
        engine = cls(build_engine(config, plugin_manager))
        engine.plugin_manager.hook.tallow_engine_ready(engine=engine)
        return engine

    def next_request_id(self) -> str:
        return f"req-{next(self._ids)}"

    def add_request(self, request_id: str, prompt: str | list[int], params: SamplingParams,
                    *, priority: int = 0) -> None:
        if isinstance(prompt, str):
            text, ids = prompt, self.tokenizer.encode(prompt)
        else:
            text, ids = None, list(prompt)
        if not ids:
            raise ValueError("prompt: must contain at least one token")
        self.core.add_request(request_id, ids, params, priority=priority)
        self.processor.add_request(request_id, text, ids, params)

    def abort(self, request_id: str) -> RequestOutput | None:
        self.core.abort(request_id)
        return self.processor.abort_request(request_id)

    def step(self) -> list[RequestOutput]:
        core_out = self.core.step()
        outputs, to_stop = self.processor.process(core_out)
        for request_id, index in to_stop:
            self.core.finish_sequence(request_id, index, SequenceStatus.FINISHED_STOPPED)
        return outputs

    def has_unfinished(self) -> bool:
        return self.core.has_unfinished()

    def stats(self) -> dict[str, Any]:
        return self.core.stats()
