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

A step's masks are filled on the grammar thread (:meth:`StructuredOutputs.start_fill`). In
async scheduling the fill is started before the step still on the device is read back: the
grammar thread waits for that step's tokens itself (:class:`CatchUp`), accepts them, works out
termination and fills, while the engine thread commits the same tokens. From the start of a
fill to the take of its masks its matchers are the grammar thread's; the engine thread reads
only their counts and termination, once the fill has caught up
(:meth:`StructuredOutputs.wait_caught_up`).
"""

from __future__ import annotations

import collections
import concurrent.futures
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from tallow.plugin import (
    Entry, GrammarBackend, GrammarError, GrammarMatcher, GrammarSpec, SelectionError,
    TokenizerInfo, select,
)

from ..errors import InvalidParameter

log = logging.getLogger("tallow.engine")

#: the first-party backend, named when none is installed
FIRST_PARTY_BACKEND = "tallow-grammar-xgrammar"


class GrammarState:
    """A constrained sequence's matcher and how many of its outputs it has accepted."""

    __slots__ = ("matcher", "accepted", "refused", "_terminated")

    def __init__(self, matcher: GrammarMatcher) -> None:
        self.matcher = matcher
        self.accepted = 0
        #: a token the matcher refused (the sequence cannot go on under its grammar)
        self.refused: int | None = None
        self._terminated: bool | None = None  # the matcher's, at ``accepted`` tokens

    def sync(self, outputs: Sequence[int], count: int) -> bool:
        """Bring the matcher to exactly ``outputs[:count]``: roll back what it accepted past
        ``count``, accept what it has not seen. False once a token was refused."""
        if self.refused is not None:
            return False
        if self.accepted > count:
            self.matcher.rollback(self.accepted - count)
            self.accepted = count
            self._terminated = None
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
            self._terminated = None
        else:
            self.refused = token
        return accepted

    @property
    def terminated(self) -> bool:
        """Whether the matcher has terminated, asked once per accepted count: the engine
        thread reads it (a plain attribute then) while the grammar thread fills the mask of
        the matcher that worked it out."""
        if self._terminated is None:
            self._terminated = self.matcher.is_terminated()
        return self._terminated


@dataclass
class CatchUp:
    """The tokens a fill's matchers accept before their masks are filled, on the grammar
    thread: ``tokens()`` waits for a step still on the device (with the GIL released) and
    returns its sampled token ids; state ``i`` of the fill accepts ``tokens()[rows[i]]``
    (``None``: nothing)."""

    tokens: Callable[[], Sequence[int]]
    rows: Sequence[int | None]


class MaskFill:
    """A fill of one step's masks running on the grammar thread
    (:meth:`StructuredOutputs.start_fill`)."""

    __slots__ = ("future", "rows", "live", "began", "caught_up")

    def __init__(self, rows: int) -> None:
        #: the masks (on a GPU: the device tensor and the event after its copy)
        self.future: "concurrent.futures.Future[Any] | None" = None
        self.rows = rows
        #: the indices of the fill's states that got a mask, row ``k`` of the masks for
        #: ``live[k]`` (a state that refused its caught-up token or terminated gets none)
        self.live: list[int] = []
        #: set by the grammar thread once it holds the caught-up tokens (or has begun)
        self.began = threading.Event()
        #: set by the grammar thread once its states have accepted the caught-up tokens and
        #: know their termination
        self.caught_up = threading.Event()


class StructuredOutputs:
    """Grammar compilation and masks for one engine (see the module docstring)."""

    def __init__(self, entry: Entry | None, tokenizer_info: Callable[[], TokenizerInfo], *,
                 config: Any = None, device: torch.device | str = "cpu",
                 cache_size: int = 256, unavailable: str = "") -> None:
        self.entry = entry
        self._tokenizer_info = tokenizer_info
        self.config = config
        self.device = torch.device(device)
        self.cache_size = cache_size
        #: why no backend serves (when ``entry`` is None): the message of a refused request
        self.unavailable = unavailable
        self._backend: GrammarBackend | None = None
        self._lock = threading.Lock()
        self._cache: collections.OrderedDict[str, Any] = collections.OrderedDict()
        self._host: torch.Tensor | None = None
        self._copied: Any = None  # the event after the last mask left the pinned buffer
        self._copy_stream: Any = None
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
    def for_engine(cls, registries: Any, config: Any,
                   tokenizer_info: Callable[[], TokenizerInfo], device: torch.device | str,
                   vocabulary_problem: str | None = None) -> "StructuredOutputs":
        """The grammar side of an engine: the backend ``runner.grammar_backend`` names (one
        that cannot serve stops start-up), or the first by priority that serves; with none,
        requests that need one are refused with a message saying which plugin provides it.
        ``vocabulary_problem`` says why the model's tokens cannot be matched by any grammar
        (then requests are refused with it)."""
        name = config.runner.grammar_backend
        registry = registries.grammar_backends
        if vocabulary_problem is not None:
            return cls(None, tokenizer_info, config=config, device=device,
                       cache_size=config.runner.grammar_cache_size,
                       unavailable=f"structured outputs are not available for this model: "
                                   f"{vocabulary_problem}")
        try:
            entry = select(registry, config, name)
        except SelectionError as exc:
            if name and name != "auto":
                raise SelectionError(f"runner.grammar_backend {name!r}: {exc}") from None
            hint = registry.missing_hint()
            if not hint:
                hint = (f"; install one: pip install {FIRST_PARTY_BACKEND} (the xgrammar "
                        "backend), or name a grammar-backend plugin in plugins.enable")
            refused = f" ({exc})" if len(registry) else ""
            unavailable = ("structured outputs need a grammar backend, and none is available"
                           + refused + hint)
            return cls(None, tokenizer_info, config=config, device=device,
                       cache_size=config.runner.grammar_cache_size, unavailable=unavailable)
        return cls(entry, tokenizer_info, config=config, device=device,
                   cache_size=config.runner.grammar_cache_size)

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
                    log.info("grammar backend %r (from %s) ready in %.2fs", self.entry.name,
                             self.entry.distribution, time.perf_counter() - started)
        return self._backend

    def compile(self, spec: GrammarSpec) -> Any:
        """The compiled grammar of ``spec``, from the cache when it was compiled before.
        Raises :class:`tallow.plugin.GrammarError` for a spec the backend refuses and
        InvalidParameter when no backend is available."""
        with self._lock:
            hit = self._cache.get(spec.key)
            if hit is not None:
                self._cache.move_to_end(spec.key)
                return hit
        backend = self.backend
        if spec.kind not in backend.kinds:
            raise GrammarError(f"the {self.entry.name} grammar backend does not compile "  # type: ignore[union-attr]
                               f"{spec.kind} specs (it compiles: {', '.join(backend.kinds)})")
        compiled = backend.compile(spec)
        with self._lock:
            self._cache[spec.key] = compiled
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        return compiled

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
        if batch:
            self._accept(self.backend, batch)

    @staticmethod
    def _accept(backend: GrammarBackend, batch: list[tuple[GrammarState, int]]) -> None:
        """Each ``(state, token)``'s matcher accepts its token, all in one backend call."""
        if not batch:
            return
        tokens = [token for _, token in batch]
        accepted = backend.accept_tokens([state.matcher for state, _ in batch], tokens)
        for (state, token), ok in zip(batch, accepted, strict=True):
            state.took(token, ok)

    # -- masks --------------------------------------------------------------------------
    def start_fill(self, states: Sequence[GrammarState],
                   catch_up: CatchUp | None = None) -> "MaskFill":
        """Start filling the masks of ``states`` on the grammar thread; each state is in step
        with its sequence, or one token behind when ``catch_up`` gives that token (then the
        grammar thread accepts it first). Until :meth:`take` returns, the matchers belong to
        that thread: accept nothing into them and roll nothing back, and read their counts
        and termination only after :meth:`wait_caught_up`."""
        if self._job is not None:  # never taken (its step was dropped): let it end first
            dropped, self._job = self._job.future, None
            if dropped.exception() is None and self.device.type == "cuda":
                self._copied = dropped.result()[1]  # its copy may still read the buffer
        backend = self.backend
        words = backend.tokenizer.bitmask_words
        n = len(states)
        if self._host is None or self._host.shape[0] < n:
            self._wait_copied()  # the old buffer may still be read by a copy
            rows = max(n, 2 * (self._host.shape[0] if self._host is not None else 16))
            self._host = torch.empty(rows, words, dtype=torch.int32,
                                     pin_memory=self.device.type == "cuda")
        if self._thread is None:
            self._thread = concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="tallow-grammar-masks")
        job = MaskFill(n)
        job.future = self._thread.submit(self._catch_up_and_fill, backend, list(states),
                                         catch_up, self._host[:n], job)
        self._job = job
        if catch_up is not None:
            # Block until the grammar thread holds the step's tokens: both threads then wake
            # on the device, and the grammar thread's accepts (native, GIL released) run
            # while this thread commits the same tokens. Were this thread to wait on the
            # device itself, whichever woke first would keep the GIL through its Python and
            # the other would start only when it next blocks.
            job.began.wait()
        return job

    def _catch_up_and_fill(self, backend: GrammarBackend, states: list[GrammarState],
                           catch_up: CatchUp | None, host: torch.Tensor,
                           job: MaskFill) -> torch.Tensor:
        """On the grammar thread: accept the caught-up tokens, then fill a mask for each state
        still going into ``host`` once the last masks have left it."""
        try:
            if catch_up is not None:
                tokens = catch_up.tokens()
                job.began.set()
                self._accept(backend, [(state, tokens[row])
                                       for state, row in zip(states, catch_up.rows)
                                       if row is not None and state.refused is None])
            job.live = [i for i, state in enumerate(states)
                        if state.refused is None and not state.terminated]
        finally:
            job.began.set()
            job.caught_up.set()
        self._wait_copied()
        started = time.perf_counter()
        # inference mode is per thread, and the buffer may have been made under it
        with torch.inference_mode():
            backend.fill_bitmasks([states[i].matcher for i in job.live], host,
                                  range(len(job.live)))
        self.mask_seconds += time.perf_counter() - started
        return self._upload(host[:len(job.live)])

    def _upload(self, host: torch.Tensor) -> Any:
        """On the grammar thread: the masks as they go to a GPU (a tensor of the device and
        the event after its copy), copied on a stream of their own as soon as they are
        filled, beside the device's work on the engine's stream; on a CPU, ``host``."""
        if self.device.type != "cuda":
            return host
        if self._copy_stream is None:
            self._copy_stream = torch.cuda.Stream(self.device)
        with torch.cuda.device(self.device), torch.cuda.stream(self._copy_stream):
            masks = host.to(self.device, non_blocking=True)
            copied = torch.cuda.Event()
            copied.record()
        return masks, copied

    def wait_caught_up(self) -> None:
        """Wait until the fill in flight, if any, has accepted its caught-up tokens: the
        engine thread reads its states' counts and termination only then."""
        job = self._job
        if job is not None:
            started = time.perf_counter()
            job.caught_up.wait()
            self.mask_wait_seconds += time.perf_counter() - started

    def _wait_copied(self) -> None:
        copied, self._copied = self._copied, None
        if copied is not None:
            copied.synchronize()

    def take(self, job: "MaskFill") -> torch.Tensor:
        """Wait for a fill :meth:`start_fill` started and return its masks on the device
        (the engine thread's stream waits for their copy), one row per state of
        ``job.live``. The matchers are the engine's again afterwards."""
        if job is not self._job:
            raise RuntimeError("these grammar masks were already taken, or a later fill "
                               "replaced them")
        self._job = None
        started = time.perf_counter()
        filled = job.future.result()  # waits with the GIL released
        self.mask_wait_seconds += time.perf_counter() - started
        self.mask_steps += 1
        self.mask_rows += len(job.live)
        if self.device.type != "cuda":
            return filled
        masks, self._copied = filled
        stream = torch.cuda.current_stream(self.device)
        stream.wait_event(self._copied)
        # made on the copy stream, read on this one: not to be reused before this one is done
        masks.record_stream(stream)
        return masks

    def warm_up(self, vocab_size: int, dtypes: Sequence[torch.dtype]) -> None:
        """Run the mask kernels once per logits dtype (a GPU compiles them now, not in the
        first constrained step): the mask applied before a draw, and greedy decoding under
        masks of every row or of some rows."""
        if self.entry is None or self.device.type != "cuda":
            return
        from tallow.kernels.token_bitmask import apply_token_bitmask, masked_argmax

        words = (vocab_size + 31) // 32
        mask = torch.zeros(1, words, dtype=torch.int32, device=self.device)
        rows = torch.zeros(1, dtype=torch.int64, device=self.device)
        for dtype in dict.fromkeys(dtypes):
            logits = torch.zeros(1, vocab_size, dtype=dtype, device=self.device)
            masked_argmax(logits, mask)
            masked_argmax(logits, mask, rows)
            apply_token_bitmask(logits, mask, rows)

    def stats(self) -> dict[str, Any]:
        return {"grammar_mask_seconds_total": self.mask_seconds,
                "grammar_mask_steps_total": self.mask_steps,
                "grammar_mask_rows_total": self.mask_rows,
                "grammar_mask_wait_seconds_total": self.mask_wait_seconds,
                "grammar_cache_entries": len(self._cache)}
