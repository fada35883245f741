"""The engine side of structured outputs: the grammar backend, the compile cache, each
constrained sequence's matcher, and the step's packed token masks.

The backend (a :class:`tallow.plugin.GrammarBackend`) is chosen at start-up by the rule every
component kind follows (``runner.grammar_backend``) and built on first use, since turning a
150k-token vocabulary into bytes takes a moment that engines which never constrain anything
should not pay. Compiled grammars are cached by the spec's key (a server compiles a request's
spec off its event loop, and the engine finds it in the cache when the request arrives).

A matcher must have seen every earlier token of its sequence before it fills a mask. The
sequence's token list is the truth: :meth:`GrammarState.sync` accepts the tokens the matcher
has not seen and rolls back tokens it saw that the sequence no longer has.
"""

from __future__ import annotations

import collections
import concurrent.futures
import logging
import threading
import time
from typing import Any, Callable, Sequence

import torch

from tallow.config import TallowConfig
from tallow.kernels.token_bitmask import apply_token_bitmask, masked_argmax
from tallow.plugin import (
    Entry,
    GrammarBackend,
    GrammarError,
    GrammarMatcher,
    GrammarSpec,
    Registries,
    SelectionError,
    TokenizerInfo,
    select,
)

from ..errors import InvalidParameter
from .grammar_worker import CompileWorker, GrammarBudgetError

log = logging.getLogger("tallow.engine")

#: the first-party backend, named when none is installed
FIRST_PARTY_BACKEND = "tallow-grammar-xgrammar"


class GrammarState:
    """A constrained sequence's matcher and how many of its outputs it has accepted."""

    __slots__ = ("matcher", "accepted", "refused")

    def __init__(self, matcher: GrammarMatcher) -> None:
        self.matcher = matcher
        self.accepted = 0
        #: a token the matcher refused (the sequence cannot go on under its grammar)
        self.refused: int | None = None

    def sync(self, outputs: Sequence[int], count: int) -> bool:
        """Bring the matcher to exactly ``outputs[:count]``: roll back what it accepted past
        ``count``, accept what it has not seen. False once a token was refused."""
        if self.refused is not None:
            return False
        if self.accepted > count:
            self.matcher.rollback(self.accepted - count)
            self.accepted = count
        while self.accepted < count:
            token = outputs[self.accepted]
            if not self.took(token, self.matcher.accept(token)):
                return False
        return True

    def next_token(self, outputs: Sequence[int], count: int) -> int | None:
        """The one token :meth:`sync` would accept to reach ``outputs[:count]`` when that is
        all it would do (the matcher is one token behind and has refused nothing), else
        None."""
        if self.refused is None and self.accepted == count - 1:
            return outputs[count - 1]
        return None

    def took(self, token: int, accepted: bool) -> bool:
        """Count ``token`` as accepted by the matcher, or as refused; returns ``accepted``."""
        if accepted:
            self.accepted += 1
        else:
            self.refused = token
        return accepted

    @property
    def terminated(self) -> bool:
        return self.matcher.is_terminated()


class MaskFill:
    """A fill of one step's masks running on the grammar thread
    (:meth:`StructuredOutputs.start_fill`)."""

    __slots__ = ("future", "rows", "began")

    def __init__(self, rows: int) -> None:
        self.future: "concurrent.futures.Future[torch.Tensor] | None" = None
        self.rows = rows
        #: set by the grammar thread as it hands the matchers to the backend
        self.began = threading.Event()


class StructuredOutputs:
    """Grammar compilation and masks for one engine (see the module docstring)."""

    def __init__(
        self,
        entry: Entry | None,
        tokenizer_info: Callable[[], TokenizerInfo],
        *,
        config: TallowConfig | None = None,
        device: torch.device | str = "cpu",
        cache_size: int = 256,
        unavailable: str = "",
    ) -> None:
        self.entry = entry
        self._tokenizer_info = tokenizer_info
        self.config = config
        self.device = torch.device(device)
        self.cache_size = cache_size
        #: why no backend serves (when ``entry`` is None): the message of a refused request
        self.unavailable = unavailable
        self._backend: GrammarBackend | None = None
        self._worker: CompileWorker | None = None
        runner = getattr(config, "runner", None)
        self.compile_timeout_s: float = getattr(runner, "grammar_compile_timeout_s", 10.0)
        self.max_spec_chars: int = getattr(runner, "grammar_max_spec_chars", 131072)
        self._lock = threading.Lock()
        self._cache: collections.OrderedDict[str, object] = collections.OrderedDict()
        self._host: torch.Tensor | None = None
        self._copied: torch.cuda.Event | None = (
            None  # the event after the last mask left the pinned buffer
        )
        #: the fill started and not yet taken (one at a time: they share the pinned buffer)
        self._job: MaskFill | None = None
        self._thread: concurrent.futures.ThreadPoolExecutor | None = None
        #: seconds spent filling masks (on the grammar thread), steps that filled any, rows
        #: filled, and seconds the engine thread waited for a fill to end
        self.mask_seconds = 0.0
        self.mask_steps = 0
        self.mask_rows = 0
        self.mask_wait_seconds = 0.0

    @classmethod
    def for_engine(
        cls,
        registries: Registries,
        config: TallowConfig,
        tokenizer_info: Callable[[], TokenizerInfo],
        device: torch.device | str,
        vocabulary_problem: str | None = None,
    ) -> "StructuredOutputs":
        """The grammar side of an engine: the backend ``runner.grammar_backend`` names (one
        that cannot serve stops start-up), or the first by priority that serves; with none,
        requests that need one are refused with a message saying which plugin provides it.
        ``vocabulary_problem`` says why the model's tokens cannot be matched by any grammar
        (then requests are refused with it)."""
        name = config.runner.grammar_backend
        registry = registries.grammar_backends
        if vocabulary_problem is not None:
            return cls(
                None,
                tokenizer_info,
                config=config,
                device=device,
                cache_size=config.runner.grammar_cache_size,
                unavailable=f"structured outputs are not available for this model: "
                f"{vocabulary_problem}",
            )
        try:
            entry = select(registry, config, name)
        except SelectionError as exc:
            if name and name != "auto":
                raise SelectionError(f"runner.grammar_backend {name!r}: {exc}") from None
            hint = registry.missing_hint()
            if not hint:
                hint = (
                    f"; install one: pip install {FIRST_PARTY_BACKEND} (the xgrammar "
                    "backend), or name a grammar-backend plugin in plugins.enable"
                )
            refused = f" ({exc})" if len(registry) else ""
            unavailable = (
                "structured outputs need a grammar backend, and none is available" + refused + hint
            )
            return cls(
                None,
                tokenizer_info,
                config=config,
                device=device,
                cache_size=config.runner.grammar_cache_size,
                unavailable=unavailable,
            )
        return cls(
            entry,
            tokenizer_info,
            config=config,
            device=device,
            cache_size=config.runner.grammar_cache_size,
        )

    # -- compiling ----------------------------------------------------------------------
    @property
    def available(self) -> bool:
        return self.entry is not None

    @property
    def backend(self) -> GrammarBackend:
        """The backend instance, built on first use; InvalidParameter when there is none."""
        if self.entry is None:
            raise InvalidParameter("structured_outputs", self.unavailable)
        if self._backend is None:
            with self._lock:
                if self._backend is None:
                    started = time.perf_counter()
                    self._backend = self.entry.load()(self._tokenizer_info(), self.config)
                    log.info(
                        "grammar backend %r (from %s) ready in %.2fs",
                        self.entry.name,
                        self.entry.distribution,
                        time.perf_counter() - started,
                    )
        return self._backend

    def compile(self, spec: GrammarSpec) -> object:
        """The compiled grammar of ``spec``, from the cache when it was compiled before.
        Raises :class:`tallow.plugin.GrammarError` for a spec the backend refuses and
        InvalidParameter when no backend is available."""
        with self._lock:
            hit = self._cache.get(spec.key)
            if hit is not None:
                self._cache.move_to_end(spec.key)
                return hit
        size = len(spec.value) if isinstance(spec.value, str) else sum(map(len, spec.value))
        if size > self.max_spec_chars:
            raise GrammarBudgetError(
                f"it has {size} characters, more than the server compiles "
                f"({self.max_spec_chars}, runner.grammar_max_spec_chars)",
                "runner.grammar_max_spec_chars",
            )
        backend = self.backend
        if spec.kind not in backend.kinds:
            raise GrammarError(
                f"the {self.entry.name} grammar backend does not compile "  # type: ignore[union-attr]
                f"{spec.kind} specs (it compiles: {', '.join(backend.kinds)})"
            )
        if backend.exports_compiled:
            compiled = backend.import_compiled(self._compile_worker(backend).compile(spec))
        else:
            compiled = backend.compile(spec)
        self._check_matchable(backend, compiled)
        with self._lock:
            self._cache[spec.key] = compiled
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        return compiled

    def _compile_worker(self, backend: GrammarBackend) -> CompileWorker:
        with self._lock:
            if self._worker is None:
                self._worker = CompileWorker(
                    type(backend), backend.tokenizer, self.config, self.compile_timeout_s
                )
            return self._worker

    @staticmethod
    def _check_matchable(backend: GrammarBackend, compiled: object) -> None:
        """GrammarError for a grammar no output can match: at its start no token may come
        (not even EOS), so any output would break it."""
        mask = torch.zeros(1, backend.tokenizer.bitmask_words, dtype=torch.int32)
        backend.matcher(compiled).fill_bitmask(mask, 0)
        if not bool(mask.any()):
            raise GrammarError(
                "no output can match it (no token of this model may start it, "
                "and it does not match the empty output)"
            )

    def close(self) -> None:
        """Stop the compile worker, if one runs."""
        if self._worker is not None:
            self._worker.stop()

    def new_state(self, spec: GrammarSpec) -> GrammarState:
        """A fresh matcher state for one sequence constrained by ``spec``."""
        return GrammarState(self.backend.matcher(self.compile(spec)))

    def advance(self, steps: Sequence[tuple[GrammarState, Sequence[int], int]]) -> None:
        """Bring each ``(state, outputs, count)``'s matcher to ``outputs[:count]``, as
        :meth:`GrammarState.sync` does, the usual case — one new token per sequence — for all
        of them in one :meth:`GrammarBackend.accept_tokens` call (one step's tokens)."""
        batch: list[tuple[GrammarState, int]] = []
        for state, outputs, count in steps:
            token = state.next_token(outputs, count)
            if token is None:
                state.sync(outputs, count)
            else:
                batch.append((state, token))
        if not batch:
            return
        tokens = [token for _, token in batch]
        accepted = self.backend.accept_tokens([state.matcher for state, _ in batch], tokens)
        for (state, token), ok in zip(batch, accepted, strict=True):
            state.took(token, ok)

    # -- masks --------------------------------------------------------------------------
    def fill(self, states: Sequence[GrammarState]) -> torch.Tensor:
        """The packed masks of ``states`` (each already in step with its sequence) on the
        engine's device, one row each ([len, words] int32); waits for them."""
        return self.take(self.start_fill(states))

    def start_fill(self, states: Sequence[GrammarState]) -> "MaskFill":
        """Start filling the masks of ``states`` (each already in step with its sequence) on
        the grammar thread. Until :meth:`take` returns, their matchers belong to that thread:
        accept nothing into them and roll nothing back."""
        if self._job is not None:  # never taken (its step was dropped): let it end first
            assert self._job.future is not None  # submitted when the job was started
            self._job.future.exception()
            self._job = None
        backend = self.backend
        words = backend.tokenizer.bitmask_words
        n = len(states)
        if self._host is None or self._host.shape[0] < n:
            self._wait_copied()  # the old buffer may still be read by a copy
            rows = max(n, 2 * (self._host.shape[0] if self._host is not None else 16))
            self._host = torch.empty(
                rows, words, dtype=torch.int32, pin_memory=self.device.type == "cuda"
            )
        host = self._host[:n]
        matchers = [s.matcher for s in states]
        if self._thread is None:
            self._thread = concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="tallow-grammar-masks"
            )
        job = MaskFill(n)
        job.future = self._thread.submit(self._fill_host, backend, matchers, host, job.began)
        self._job = job
        # Hand the GIL over until the fill has begun: a thread that wants the GIL waits until
        # its holder blocks or the interpreter's switch interval (5 ms) runs out, so the fill
        # would otherwise start only when this thread next blocks — in the next step's wait
        # for it. Once in the backend, the fill releases the GIL in its native part (as
        # xgrammar's calls do), and this thread goes on beside it.
        job.began.wait()
        return job

    def _fill_host(
        self,
        backend: GrammarBackend,
        matchers: list[GrammarMatcher],
        host: torch.Tensor,
        began: threading.Event,
    ) -> torch.Tensor:
        """On the grammar thread: fill ``host`` once the last masks have left it."""
        try:
            self._wait_copied()
        finally:
            began.set()
        started = time.perf_counter()
        # inference mode is per thread, and the buffer may have been made under it
        with torch.inference_mode():
            backend.fill_bitmasks(matchers, host, range(len(matchers)))
        self.mask_seconds += time.perf_counter() - started
        return host

    def _wait_copied(self) -> None:
        copied, self._copied = self._copied, None
        if copied is not None:
            copied.synchronize()

    def take(self, job: "MaskFill") -> torch.Tensor:
        """Wait for a fill :meth:`start_fill` started and return its masks on the device
        (the copy is queued on the engine thread's stream). The matchers are the engine's
        again afterwards."""
        if job is not self._job:
            raise RuntimeError(
                "these grammar masks were already taken, or a later fill replaced them"
            )
        self._job = None
        started = time.perf_counter()
        assert job.future is not None  # submitted by start_fill
        host = job.future.result()  # waits with the GIL released
        self.mask_wait_seconds += time.perf_counter() - started
        self.mask_steps += 1
        self.mask_rows += job.rows
        if self.device.type != "cuda":
            return host
        masks = host.to(self.device, non_blocking=True)
        self._copied = torch.cuda.Event()
        self._copied.record()
        return masks

    def warm_up(self, vocab_size: int, dtypes: Sequence[torch.dtype]) -> None:
        """Run the mask kernels once per logits dtype (a GPU compiles them now, not in the
        first constrained step): the mask applied before a draw, and greedy decoding under
        masks of every row or of some rows."""
        if self.entry is None or self.device.type != "cuda":
            return

        words = (vocab_size + 31) // 32
        mask = torch.zeros(1, words, dtype=torch.int32, device=self.device)
        rows = torch.zeros(1, dtype=torch.int64, device=self.device)
        for dtype in dict.fromkeys(dtypes):
            logits = torch.zeros(1, vocab_size, dtype=dtype, device=self.device)
            masked_argmax(logits, mask)
            masked_argmax(logits, mask, rows)
            apply_token_bitmask(logits, mask, rows)

    def stats(self) -> dict[str, Any]:
        return {
            "grammar_mask_seconds_total": self.mask_seconds,
            "grammar_mask_steps_total": self.mask_steps,
            "grammar_mask_rows_total": self.mask_rows,
            "grammar_mask_wait_seconds_total": self.mask_wait_seconds,
            "grammar_cache_entries": len(self._cache),
            "grammar_compile_timeouts_total": self._worker.timeouts
            if self._worker is not None
            else 0,
        }
