"""The synchronous engine: the core and the output processor in one thread (``LLM`` uses it)."""

from __future__ import annotations

import itertools
from typing import Any, Sequence

from tallow.config import TallowConfig
from tallow.distributed.driver import GroupFailedError
from tallow.plugin.manager import PluginManager

from .builder import EngineFrontend, EngineParts, build_engine
from .core_output import CoreOutput
from .embedding import PoolingParams, finish_embedding
from .outputs import EmbeddingOutput, RequestOutput
from .sampling.params import SamplingParams
from .sequence import SequenceStatus


class LLMEngine(EngineFrontend):
    def __init__(self, parts: EngineParts) -> None:
        super().__init__(parts)
        self._ids = itertools.count()
        self._unprocessed: CoreOutput | None = None  # the last step, not yet turned into text
        self.last_step: CoreOutput | None = None
        #: embedding requests in the engine: request id → (token ids, params)
        self._embeddings: dict[str, tuple[list[int], PoolingParams]] = {}

    @classmethod
    def from_config(
        cls, config: TallowConfig, plugin_manager: PluginManager | None = None
    ) -> "LLMEngine":
        return cls(build_engine(config, plugin_manager))

    def next_request_id(self) -> str:
        return f"req-{next(self._ids)}"

    def add_request(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams | PoolingParams,
        *,
        priority: int = 0,
        stream: bool = True,
        images: Sequence[Any] | None = None,
    ) -> None:
        """Queue a request. With ``stream=False`` its output is produced only once, finished.
        An embedding request (``PoolingParams``, on an engine built to embed) takes token ids
        and yields one :class:`EmbeddingOutput`. ``images`` (PIL images, paths or encoded
        bytes) go with a prompt holding one image placeholder token per image, in order."""
        if isinstance(prompt, str):
            text, ids = prompt, self.tokenizer.encode(prompt)
        else:
            text, ids = None, list(prompt)
        if not ids:
            raise ValueError("prompt: must contain at least one token")
        ids, mm = self.expand_images(ids, images)
        self.core.add_request(request_id, ids, params, priority=priority, mm=mm)
        if isinstance(params, PoolingParams):
            self._embeddings[request_id] = (ids, params)
            return
        self.processor.add_request(request_id, text, ids, params, stream=stream)

    def abort(self, request_id: str) -> RequestOutput | None:
        self.core.abort(request_id)
        self._embeddings.pop(request_id, None)
        return self.processor.abort_request(request_id)

    def step(self) -> list[Any]:
        """One engine step: :class:`RequestOutput` of completions, :class:`EmbeddingOutput`
        of finished embedding requests. The text of step N is made while the device runs step
        N+1, so outputs trail the device by one step (and a stop string ends a completion one
        step late: the extra token is dropped)."""
        outputs: list[Any] = []
        previous, self._unprocessed = self._unprocessed, None

        def process_previous() -> None:
            if previous is not None:
                outputs.extend(self._process(previous))

        try:
            core_out = self.core.step(between=process_previous)
        except Exception as exc:
            reason = self.parts.parallel.diagnose() if self.parts.parallel is not None else None
            if reason is None:
                raise

            raise GroupFailedError(reason) from exc
        self.last_step = core_out  # what the device just did (timing tools read it)
        if self.core.has_unfinished():
            self._unprocessed = core_out
        else:
            outputs.extend(self._process(core_out))
        return outputs

    def _process(self, core_out: CoreOutput) -> list[Any]:
        outputs: list[Any] = []
        if core_out.pooled:
            outputs += self._embedding_outputs(core_out)
        generated, to_stop = self.processor.process(core_out)
        for request_id, index in to_stop:
            self.core.finish_sequence(request_id, index, SequenceStatus.FINISHED_STOPPED)
        return outputs + generated

    def _embedding_outputs(self, core_out: CoreOutput) -> list[EmbeddingOutput]:
        outputs = []
        for request_id, vector in core_out.pooled.items():
            request = self._embeddings.pop(request_id, None)
            if request is None:
                continue
            ids, params = request
            assert self.embedding is not None
            outputs.append(
                EmbeddingOutput(
                    request_id, ids, finish_embedding(vector, self.embedding, params.dimensions)
                )
            )
        return outputs

    def has_unfinished(self) -> bool:
        return self.core.has_unfinished() or self._unprocessed is not None

    def stats(self) -> dict[str, Any]:
        return self.core.stats()
