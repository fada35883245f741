"""A small engine that follows the ``AsyncEngine`` contract, for fast tests of the HTTP layer.

It uses tallow's real ``Tokenizer`` (over a byte-level BPE of 256 byte tokens plus the Qwen chat
markers, with the real Qwen2.5 chat template), the real ``SamplingParams`` and output classes,
and scripted model text instead of a network: ``script(prompt_text, params, index) -> str``.
Each step appends one token to every unfinished completion (text detokenized as the request's
``skip_special_tokens`` says); the end of the script is the EOS
token (in ``token_ids``, not in the text, ``stop_reason`` None), as the real engine ends. KV
blocks, admission, the waiting queue and aborts are accounted like the real engine does, so
tests can see that a client which disconnects frees its blocks.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any, AsyncIterator, Callable

from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers

from tallow.engine.errors import AdmissionError, QueueFullError
from tallow.engine.outputs import CompletionOutput, Logprob, RequestOutput
from tallow.engine.tokenizer import Tokenizer

# The chat template of Qwen2.5-Coder-0.5B-Instruct (read from its GGUF), tools included.
QWEN_TEMPLATE = (
    "{%- if tools %}\n    {{- '<|im_start|>system\\n' }}\n    {%- if messages[0]['role'] == "
    "'system' %}\n        {{- messages[0]['content'] }}\n    {%- else %}\n        {{- 'You are "
    "Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}\n    {%- endif %}\n    "
    '{{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.'
    "\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>"
    '" }}\n    {%- for tool in tools %}\n        {{- "\\n" }}\n        {{- tool | tojson }}\n'
    '    {%- endfor %}\n    {{- "\\n</tools>\\n\\nFor each function call, return a json object '
    "with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n"
    '{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call>'
    "<|im_end|>\\n\" }}\n{%- else %}\n    {%- if messages[0]['role'] == 'system' %}\n        {{- "
    "'<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n    {%- else %}\n"
    "        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
    "assistant.<|im_end|>\\n' }}\n    {%- endif %}\n{%- endif %}\n{%- for message in messages %}"
    '\n    {%- if (message.role == "user") or (message.role == "system" and not loop.first) '
    'or (message.role == "assistant" and not message.tool_calls) %}\n        {{- '
    "'<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n    "
    "{%- elif message.role == \"assistant\" %}\n        {{- '<|im_start|>' + message.role }}\n"
    "        {%- if message.content %}\n            {{- '\\n' + message.content }}\n        "
    "{%- endif %}\n        {%- for tool_call in message.tool_calls %}\n            {%- if "
    "tool_call.function is defined %}\n                {%- set tool_call = tool_call.function %}"
    '\n            {%- endif %}\n            {{- \'\\n<tool_call>\\n{"name": "\' }}\n'
    '            {{- tool_call.name }}\n            {{- \'", "arguments": \' }}\n            '
    "{{- tool_call.arguments | tojson }}\n            {{- '}\\n</tool_call>' }}\n        "
    "{%- endfor %}\n        {{- '<|im_end|>\\n' }}\n    {%- elif message.role == \"tool\" %}\n"
    '        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}\n'
    "            {{- '<|im_start|>user' }}\n        {%- endif %}\n        {{- "
    "'\\n<tool_response>\\n' }}\n        {{- message.content }}\n        {{- "
    "'\\n</tool_response>' }}\n        {%- if loop.last or (messages[loop.index0 + 1].role != "
    "\"tool\") %}\n            {{- '<|im_end|>\\n' }}\n        {%- endif %}\n    {%- endif %}\n"
    "{%- endfor %}\n{%- if add_generation_prompt %}\n    {{- '<|im_start|>assistant\\n' }}\n"
    "{%- endif %}\n"
)

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def byte_tokenizer(
    specials: list[str] | None = None, template: str = QWEN_TEMPLATE, eos_token: str = "<|im_end|>"
) -> Tokenizer:
    """tallow's Tokenizer over a byte-level BPE: one token per byte, ids 0..255, then
    ``specials`` (default: SPECIALS), with ``template`` as its chat template."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    byte_map = _bytes_to_unicode()
    vocab = {byte_map[b]: b for b in range(256)}
    assert set(vocab) == set(alphabet)
    hf = HFTokenizer(models.BPE(vocab=vocab, merges=[]))
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    hf.decoder = decoders.ByteLevel()
    hf.add_special_tokens(specials or SPECIALS)
    config = {
        "chat_template": template,
        "eos_token": eos_token,
        "pad_token": "<|endoftext|>",
        "add_bos_token": False,
    }
    return Tokenizer(hf, config)


def _bytes_to_unicode() -> dict[int, str]:
    # GPT-2's reversible byte → printable character map (the ByteLevel alphabet).
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(printable, map(chr, chars)))


Script = Callable[[str, Any, int], str]


def default_script(prompt: str, params: Any, index: int) -> str:
    return "Hello there, friend. How can I help you today?"


class FakeEngine:
    """Follows the ``AsyncEngine`` contract; see the module docstring."""

    def __init__(
        self,
        script: Script = default_script,
        *,
        model_name: str = "fake-model",
        max_model_len: int = 4096,
        num_blocks: int = 2048,
        block_size: int = 16,
        max_waiting: int = 64,
        step_delay: float = 0.0,
        plugin_manager: Any = None,
        admit_limit: int | None = None,
    ) -> None:
        self.script = script
        self.model_name = model_name
        self.tokenizer = byte_tokenizer()
        (self.eos_token_id,) = self.tokenizer.eos_token_ids
        self.max_model_len = max_model_len
        # prompts longer than this are refused at the engine's door (KV cache too small, say)
        self.admit_limit = admit_limit if admit_limit is not None else max_model_len
        self.plugin_manager = plugin_manager
        self.block_size = block_size
        self.num_total_blocks = num_blocks
        self.num_free_blocks = num_blocks
        self.max_waiting = max_waiting
        self.step_delay = step_delay
        self.active: dict[str, int] = {}  # request id → blocks held
        self.aborted: list[str] = []
        self.finished: list[str] = []
        self.requests: list[dict[str, Any]] = []  # what each request asked for
        self._seen_prompts: set[tuple[int, ...]] = set()
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.started = False
        self.error: BaseException | None = None

    async def start(self) -> None:
        self.started = True

    async def shutdown(self) -> None:
        self.started = False

    def stats(self) -> dict[str, Any]:
        used = self.num_total_blocks - self.num_free_blocks
        return {
            "num_waiting": 0,
            "num_running": len(self.active),
            "kv_usage": used / self.num_total_blocks,
            "num_free_blocks": self.num_free_blocks,
            "num_total_blocks": self.num_total_blocks,
            "kv_capacity_tokens": self.num_total_blocks * self.block_size,
            "prefix_cache_hit_rate": 0.0,
            "prompt_tokens_total": self.prompt_tokens_total,
            "generation_tokens_total": self.generation_tokens_total,
        }

    async def abort(self, request_id: str) -> None:
        self._release(request_id, aborted=True)

    def _release(self, request_id: str, *, aborted: bool) -> None:
        blocks = self.active.pop(request_id, None)
        if blocks is None:
            return
        self.num_free_blocks += blocks
        (self.aborted if aborted else self.finished).append(request_id)

    def _token_text(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id], skip_special_tokens=False)

    def _logprobs(self, token_id: int, k: int) -> dict[int, Logprob]:
        entry = {token_id: Logprob(-0.25, 1, self._token_text(token_id))}
        for rank in range(2, k + 1):
            alt = (token_id + rank) % 256
            entry.setdefault(alt, Logprob(-1.0 * rank, rank, self._token_text(alt)))
        return entry

    async def generate(
        self,
        prompt_token_ids: list[int],
        params: Any,
        request_id: str,
        *,
        prompt: str | None = None,
        priority: int = 0,
    ) -> AsyncIterator[RequestOutput]:
        if not prompt_token_ids:
            raise AdmissionError("prompt: must contain at least one token", field="prompt")
        if len(prompt_token_ids) > self.admit_limit:
            raise AdmissionError(
                f"a prompt of {len(prompt_token_ids)} tokens can never fit "
                f"(at most {self.admit_limit})",
                field="prompt",
            )
        if len(self.active) >= self.max_waiting:
            raise QueueFullError(f"{len(self.active)} requests are waiting")
        blocks = math.ceil((len(prompt_token_ids) + 1) / self.block_size) * params.n
        if blocks > self.num_free_blocks:
            raise QueueFullError("no KV blocks free")
        self.num_free_blocks -= blocks
        self.active[request_id] = blocks
        self.requests.append(
            {
                "request_id": request_id,
                "prompt": prompt,
                "prompt_token_ids": list(prompt_token_ids),
                "params": params,
                "priority": priority,
            }
        )
        key = tuple(prompt_token_ids)
        cached = (len(key) // self.block_size) * self.block_size if key in self._seen_prompts else 0
        self._seen_prompts.add(key)
        self.prompt_tokens_total += len(prompt_token_ids)
        prompt_text = (
            prompt
            if prompt is not None
            else self.tokenizer.decode(prompt_token_ids, skip_special_tokens=False)
        )
        targets = [
            self.tokenizer.encode(self.script(prompt_text, params, i), add_special_tokens=False)
            for i in range(params.n)
        ]
        outs = [
            CompletionOutput(index=i, logprobs=[] if params.logprobs is not None else None)
            for i in range(params.n)
        ]
        prompt_lps = None
        if params.prompt_logprobs is not None:
            prompt_lps = [None] + [
                self._logprobs(t, params.prompt_logprobs) for t in prompt_token_ids[1:]
            ]
        done = False
        try:
            while True:
                if self.step_delay:
                    await asyncio.sleep(self.step_delay)
                else:
                    await asyncio.sleep(0)
                for i, out in enumerate(outs):
                    if out.finish_reason is not None:
                        continue
                    pos = len(out.token_ids)
                    eos = pos >= len(targets[i])
                    # the end of the script is the EOS token, which ends with no text
                    token = self.eos_token_id if eos else targets[i][pos]
                    out.token_ids.append(token)
                    self.generation_tokens_total += 1
                    if out.logprobs is not None:
                        out.logprobs.append(self._logprobs(token, params.logprobs))
                    if eos and not params.ignore_eos:
                        out.finish_reason = "stop"  # stop_reason None: EOS, as the engine says
                        continue
                    text = self.tokenizer.decode(
                        out.token_ids, skip_special_tokens=bool(params.skip_special_tokens)
                    )
                    text = text.rstrip("\ufffd")
                    for stop in params.stop:
                        at = text.find(stop)
                        if at >= 0:
                            text = (
                                text[: at + len(stop)]
                                if params.include_stop_str_in_output
                                else text[:at]
                            )
                            out.finish_reason, out.stop_reason = "stop", stop
                            break
                    out.text = text
                    if out.finish_reason is None and len(out.token_ids) >= params.max_tokens:
                        out.finish_reason = "length"
                finished = all(o.finish_reason is not None for o in outs)
                result = RequestOutput(
                    request_id,
                    prompt,
                    list(prompt_token_ids),
                    [
                        CompletionOutput(
                            o.index,
                            o.text,
                            list(o.token_ids),
                            None,
                            list(o.logprobs) if o.logprobs is not None else None,
                            o.finish_reason,
                            o.stop_reason,
                        )
                        for o in outs
                    ],
                    finished=finished,
                    prompt_logprobs=prompt_lps,
                    num_cached_tokens=cached,
                )
                if finished:
                    done = True
                    self._release(request_id, aborted=False)
                yield result
                if finished:
                    return
        finally:
            if not done:
                self._release(request_id, aborted=True)
