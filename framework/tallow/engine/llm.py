"""The offline Python API: ``from tallow import LLM, SamplingParams``."""

from __future__ import annotations

import os
from typing import Any, Iterable, Sequence

from tallow.config import TallowConfig, load_config
from tallow.plugin.manager import PluginManager

from .builder import resolve_engine_config
from .embedding import PoolingParams, input_token_ids, truncation_length
from .llm_engine import LLMEngine
from .multimodal import chat_images
from .outputs import EmbeddingOutput, RequestOutput
from .sampling.params import SamplingParams
from .tokenizer import Tokenizer


def config_from_kwargs(**kwargs: object) -> TallowConfig:
    """The configuration that ``kwargs`` (the keywords of :class:`LLM`) give on their own, with
    no file and no environment: for tests and embedders that must not depend on the process's
    environment. :class:`LLM` itself layers them over the file and the environment."""
    return load_config(env={}, keywords=kwargs, caller="config_from_kwargs()")


class LLM:
    """Generate from a local model: ``LLM(model="path/or/id").generate(prompts, params)``.

    The configuration is resolved as ``tallow serve`` resolves it: the defaults, then the YAML
    file (``config=``, else ``$TALLOW_CONFIG``), then ``TALLOW_<SECTION>__<FIELD>`` environment
    variables, then the keyword arguments. Every setting is a keyword
    (:mod:`tallow.config.keywords`): ``model`` (the source; None: the embedded default model),
    the other fields of the model, cache, scheduler, runner and server sections by name
    (``dtype``, ``device``, ``max_model_len``, ``tokenizer``, ``block_size``, ``kv_codec``,
    ``max_num_seqs``, ...), and the other sections whole (``plugins={"disable": [...]}``). A
    keyword left at None leaves its setting to the lower sources; an unknown one is a TypeError.
    ``plugin_manager`` replaces the plugins the configuration would load.
    """

    def __init__(
        self,
        model: str | None = None,
        *,
        config: str | os.PathLike[str] | None = None,
        plugin_manager: PluginManager | None = None,
        **settings: object,
    ) -> None:
        self.config = resolve_engine_config(model, config, settings, caller="LLM()")
        self.engine = LLMEngine.from_config(self.config, plugin_manager)

    @classmethod
    def from_config(
        cls, config: TallowConfig, plugin_manager: PluginManager | None = None
    ) -> "LLM":
        """An ``LLM`` for an already resolved configuration, used as it is (no file, no
        environment, no keywords)."""
        llm = cls.__new__(cls)
        llm.config = config
        llm.engine = LLMEngine.from_config(config, plugin_manager)
        return llm

    def get_tokenizer(self) -> Tokenizer:
        return self.engine.tokenizer

    def generate(
        self,
        prompts: str | list[int] | Sequence[str | list[int]],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        priority: Sequence[int] | None = None,
        images: Sequence[Any] | None = None,
    ) -> list[RequestOutput]:
        """Outputs in the order of ``prompts``. A prompt is a string or a list of token ids.

        ``images`` (a vision-language model): for one prompt, its images (PIL images, paths or
        encoded bytes); for a list of prompts, one list of images per prompt. A prompt holds
        one image placeholder token (Qwen2-VL: ``<|image_pad|>``) per image, in order; the
        engine expands it into the image's tokens."""
        single = isinstance(prompts, str) or (
            isinstance(prompts, list) and bool(prompts) and isinstance(prompts[0], int)
        )
        batch: list[Any] = [prompts] if single else list(prompts)
        per_prompt = _images_per_prompt(images, len(batch), single)
        if params is None:
            params = SamplingParams()
        plist = list(params) if isinstance(params, (list, tuple)) else [params] * len(batch)
        if len(plist) != len(batch):
            raise ValueError(f"params: got {len(plist)} SamplingParams for {len(batch)} prompts")
        return self._run(
            [
                (prompt, p, priority[i] if priority else 0)
                for i, (prompt, p) in enumerate(zip(batch, plist))
            ],
            per_prompt,
        )

    def embed(
        self,
        inputs: str | list[int] | Sequence[str | list[int]],
        *,
        dimensions: int | None = None,
        truncate_prompt_tokens: int | None = None,
    ) -> list[EmbeddingOutput]:
        """Embeddings of ``inputs`` (texts or token-id lists), in their order, all in the
        engine at once; needs an engine built to embed (``task="embed"``, or an embedding
        model). ``dimensions`` shortens the vectors and ``truncate_prompt_tokens`` cuts
        inputs longer than the model accepts, as for ``POST /v1/embeddings``
        (:mod:`tallow.engine.embedding`)."""
        info = self.engine.embedding
        if info is None:
            raise ValueError(
                f"LLM.embed(): this engine serves {self.engine.model_name} for the "
                f"{self.engine.task!r} task; load an embedding model, or pass "
                "task='embed'"
            )
        if isinstance(inputs, str) or (
            isinstance(inputs, list) and inputs and isinstance(inputs[0], int)
        ):
            inputs = [inputs]
        problem = info.dimensions_problem(dimensions)
        if problem:
            raise ValueError(f"LLM.embed(): dimensions: {problem}")
        limit = self.engine.max_model_len
        try:
            truncate_to = truncation_length(truncate_prompt_tokens, limit)
        except ValueError as exc:
            raise ValueError(f"LLM.embed(): truncate_prompt_tokens: {exc}") from None
        tokenizer = self.engine.tokenizer
        prompts = []
        for i, item in enumerate(inputs):
            try:
                prompts.append(input_token_ids(tokenizer, info, item, limit, truncate_to))
            except ValueError as exc:
                raise ValueError(f"LLM.embed(): inputs[{i}]: {exc}") from None
        params = PoolingParams(dimensions)
        return self._run([(prompt, params, 0) for prompt in prompts])

    def _run(
        self, requests: list[tuple[Any, Any, int]], images: list[list[Any] | None] | None = None
    ) -> list[Any]:
        """Add every ``(prompt, params, priority)`` (none, if one is refused), with its
        ``images``, run the engine until all are done and return their final outputs in
        order."""
        ids: list[str] = []
        try:
            for i, (prompt, params, priority) in enumerate(requests):
                rid = self.engine.next_request_id()
                self.engine.add_request(
                    rid,
                    prompt,
                    params,
                    stream=False,
                    priority=priority,
                    images=images[i] if images else None,
                )
                ids.append(rid)
        except Exception:
            for rid in ids:
                self.engine.abort(rid)
            raise
        done: dict[str, Any] = {}
        while self.engine.has_unfinished():
            for out in self.engine.step():
                if out.finished:
                    done[out.request_id] = out
        return [done[rid] for rid in ids]

    def chat(
        self,
        messages: list[dict[str, Any]] | Sequence[list[dict[str, Any]]],
        params: SamplingParams | None = None,
        *,
        tools: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> list[RequestOutput]:
        """Render each conversation through the model's chat template and generate."""
        conversations: Iterable[list[dict[str, Any]]]
        if messages and isinstance(messages[0], dict):
            conversations = [messages]  # type: ignore[list-item]
        else:
            conversations = messages  # type: ignore[assignment]
        tok = self.engine.tokenizer
        prompts, images = [], []
        for conv in conversations:
            conv, found = chat_images(conv)
            prompts.append(
                tok.encode(
                    tok.apply_chat_template(
                        conv,
                        tools=tools,
                        add_generation_prompt=add_generation_prompt,
                        **(chat_template_kwargs or {}),
                    ),
                    add_special_tokens=False,
                )
            )
            images.append(found)
        if any(images):
            return self.generate(prompts, params, images=images)
        return self.generate(prompts, params)


def _images_per_prompt(
    images: Sequence[Any] | None, count: int, single: bool
) -> list[list[Any] | None] | None:
    """``images`` of :meth:`LLM.generate` as one list (or None) per prompt."""
    if images is None:
        return None
    if isinstance(images, (str, bytes)) or not isinstance(images, Sequence):
        raise TypeError(
            "images: expected a list of images (or, for several prompts, one list "
            f"per prompt), got {type(images).__name__}"
        )
    if single:
        return [list(images)]
    if len(images) != count:
        raise ValueError(f"images: got {len(images)} lists of images for {count} prompts")
    out: list[list[Any] | None] = []
    for i, item in enumerate(images):
        if item is not None and (isinstance(item, (str, bytes)) or not isinstance(item, Sequence)):
            raise TypeError(
                f"images[{i}]: expected the list of images of prompt {i}, got {type(item).__name__}"
            )
        out.append(list(item) if item else None)
    return out
