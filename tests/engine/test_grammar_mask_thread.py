"""The grammar thread's ordering: a step's masks are filled on it while the engine thread
returns, plans and builds the next step. The matchers of a fill in flight are never touched
by the engine thread; a request aborted, finished or preempted while its mask is being filled
ends cleanly; a finished row's mask never reaches another row; outputs equal those computed
alone."""

from __future__ import annotations

import json
import threading

import pytest

from tallow import LLM, SamplingParams, StructuredOutputsParams
from tallow.plugin import GrammarSpec

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "age": {"type": "integer", "minimum": 0, "maximum": 99},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}
PROMPTS = [[11 + i, 40 + 3 * i, 7, 90 + i, 23] for i in range(4)]


def _params(spec=None, max_tokens=40, **kw) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, structured_outputs=spec, **kw)


JSON = StructuredOutputsParams(json=SCHEMA)
CHOICE = {"choice": ["yes", "no"]}


class Watch:
    """Instruments an engine's grammar side: which matchers a fill holds (from its start to
    the take of its masks), every accept (one by one or a step's at once) and rollback (each
    must find its matcher free), and
    a way to hold the next fill back on the grammar thread until the test lets it go."""

    def __init__(self, llm: LLM, monkeypatch: pytest.MonkeyPatch) -> None:
        self.core = llm.engine.core
        structured = self.core.structured
        backend = structured.backend
        self.busy: dict[int, set[int]] = {}  # id(fill) → ids of its matchers
        self.violations: list[str] = []
        self.accepts: dict[int, int] = {}
        self.armed = False
        self.hold: set[int] | None = None  # the matchers of the fill to hold back
        self.held = threading.Event()  # the held fill is waiting on the grammar thread
        self.release = threading.Event()
        start_fill, take, fill = structured.start_fill, structured.take, backend.fill_bitmasks

        def watched_start_fill(states):
            ids = {id(s.matcher) for s in states}
            if self.armed:
                self.armed, self.hold = False, ids
            job = start_fill(states)
            self.busy[id(job)] = ids
            return job

        def watched_take(job):
            masks = take(job)
            self.busy.pop(id(job), None)
            return masks

        def held_fill(matchers, bitmask, rows):
            if {id(m) for m in matchers} == self.hold:
                self.hold = None
                self.held.set()
                assert self.release.wait(timeout=30), "the test never let the fill go"
            fill(matchers, bitmask, rows)

        monkeypatch.setattr(structured, "start_fill", watched_start_fill)
        monkeypatch.setattr(structured, "take", watched_take)
        monkeypatch.setattr(backend, "fill_bitmasks", held_fill)
        cls = type(backend.matcher(structured.compile(GrammarSpec("choice", ("a",)))))
        accept, rollback = cls.accept, cls.rollback
        watch = self

        def watched_accept(matcher, token):
            watch.check(matcher, "accept into")
            watch.accepts[id(matcher)] = watch.accepts.get(id(matcher), 0) + 1
            return accept(matcher, token)

        def watched_rollback(matcher, n):
            watch.check(matcher, "rollback of")
            return rollback(matcher, n)

        accept_tokens = backend.accept_tokens

        def watched_accept_tokens(matchers, tokens):  # a step's tokens at once
            for matcher in matchers:
                watch.check(matcher, "accept into")
                watch.accepts[id(matcher)] = watch.accepts.get(id(matcher), 0) + 1
            return accept_tokens(matchers, tokens)

        monkeypatch.setattr(cls, "accept", watched_accept)
        monkeypatch.setattr(cls, "rollback", watched_rollback)
        monkeypatch.setattr(backend, "accept_tokens", watched_accept_tokens)

    def check(self, matcher, what: str) -> None:
        if any(id(matcher) in ids for ids in self.busy.values()):
            self.violations.append(f"{what} a matcher whose mask is being filled")

    def fill_in_flight(self) -> bool:
        step = self.core._in_flight
        return step is not None and bool(step.pending.mask_fill)


def _run(core, requests, *, on_step=None, limit=400) -> dict[str, list[int]]:
    """Add ``requests`` (id → (prompt, params)), step to the end; tokens per request id."""
    for rid, (prompt, params) in requests.items():
        core.add_request(rid, prompt, params)
    tokens: dict[str, list[int]] = {rid: [] for rid in requests}
    for i in range(limit):
        if not core.has_unfinished():
            return tokens
        for update in core.step().updates:
            tokens[update.request_id].append(update.token.token_id)
        if on_step is not None:
            on_step(i, tokens)
    raise AssertionError("the engine did not finish")


@pytest.fixture(scope="module")
def llm(tiny_llama):
    return LLM(
        model=str(tiny_llama),
        dtype="float32",
        device="cpu",
        num_blocks=256,
        block_size=4,
        async_scheduling=True,
    )


@pytest.fixture(scope="module")
def alone(llm) -> dict[str, list[int]]:
    """Each request's tokens computed alone."""
    cases = {
        "json": (PROMPTS[0], _params(JSON)),
        "choice": (PROMPTS[1], _params(CHOICE)),
        "free": (PROMPTS[2], _params(None, max_tokens=12, ignore_eos=True)),
        "json2": (PROMPTS[3], _params(JSON)),
    }
    return {rid: _run(llm.engine.core, {rid: case})[rid] for rid, case in cases.items()}


def test_fills_overlap_and_never_share_their_matchers(llm, alone, monkeypatch):
    """Requests of every kind at once: the engine thread starts fills that the next launch
    takes (the fill is in flight when a call returns), never touches a matcher a fill holds,
    and every output equals its solo run: a choice row that ends after a token or two never
    hands its mask to the free row or to the JSON row admitted later."""
    watch = Watch(llm, monkeypatch)
    seen_in_flight = []
    late = {}

    def on_step(i, tokens):
        seen_in_flight.append(watch.fill_in_flight())
        if i == 3:  # a constrained request joins once the choice request has ended
            llm.engine.core.add_request("json2", PROMPTS[3], _params(JSON))
            tokens["json2"] = late.setdefault("json2", [])

    out = _run(
        llm.engine.core,
        {
            "json": (PROMPTS[0], _params(JSON)),
            "choice": (PROMPTS[1], _params(CHOICE)),
            "free": (PROMPTS[2], _params(None, max_tokens=12, ignore_eos=True)),
        },
        on_step=on_step,
    )
    out["json2"] = late["json2"]
    assert out == alone
    assert any(seen_in_flight), "no call returned with a fill in flight"
    assert watch.violations == []
    tokenizer = llm.engine.tokenizer
    for rid in ("json", "json2"):
        json.loads(tokenizer.decode(out[rid]))


def test_the_callers_work_runs_while_the_masks_are_filled(llm, alone, monkeypatch):
    """A call whose launched step waits for its grammars collects the step before first and
    starts the masks' fill, so the caller's ``between`` work (turning earlier tokens into
    text) runs beside the fill, not before it."""
    watch = Watch(llm, monkeypatch)
    core = llm.engine.core
    core.add_request("json", PROMPTS[0], _params(JSON))
    beside_a_fill = []
    tokens = []
    while core.has_unfinished():
        out = core.step(between=lambda: beside_a_fill.append(bool(watch.busy)))
        tokens += [update.token.token_id for update in out.updates]
    assert tokens == alone["json"]
    # every call but the first (nothing in flight yet) and the last two: the collect of the
    # next to last ends the request (its grammar ended), so its launched row gets no mask,
    # and the last launches nothing
    assert beside_a_fill[0] is False and beside_a_fill[-2:] == [False, False]
    assert all(beside_a_fill[1:-2]), str(beside_a_fill)
    assert watch.violations == []


def test_a_request_aborted_while_its_mask_is_filled_ends_there(llm, alone, monkeypatch):
    watch = Watch(llm, monkeypatch)
    core = llm.engine.core
    core.add_request("doomed", PROMPTS[0], _params(JSON))
    core.add_request("json2", PROMPTS[3], _params(JSON))
    tokens: dict[str, list[int]] = {"doomed": [], "json2": []}
    aborted_at = None
    for _ in range(400):
        if not core.has_unfinished():
            break
        if aborted_at is None and len(tokens["doomed"]) >= 3:
            watch.armed = True  # hold back the fill this call starts
        for update in core.step().updates:
            tokens[update.request_id].append(update.token.token_id)
        if watch.armed or watch.hold is not None or watch.held.is_set():
            if aborted_at is None:
                assert watch.held.wait(timeout=30) and watch.fill_in_flight()
                core.abort("doomed")  # while the grammar thread holds its matcher
                aborted_at = len(tokens["doomed"])
                watch.release.set()
    assert aborted_at is not None
    # at most the token of the step read back right after the abort is reported; it is
    # dropped because the request is finished, so nothing arrives after the abort
    assert len(tokens["doomed"]) == aborted_at
    assert tokens["doomed"] == alone["json"][:aborted_at]
    assert tokens["json2"] == alone["json2"]
    assert watch.violations == []
    assert core.scheduler.num_constrained == 0 and not core.has_unfinished()


def test_no_matcher_advances_twice_across_preemptions(tiny_llama, alone, monkeypatch):
    """A cache too small for the batch preempts sequences while their masks may be filling;
    each matcher accepts exactly its sequence's tokens, once each."""
    tight = LLM(
        model=str(tiny_llama),
        dtype="float32",
        device="cpu",
        num_blocks=16,
        block_size=4,
        max_model_len=64,
        async_scheduling=True,
    )
    watch = Watch(tight, monkeypatch)
    core = tight.engine.core
    seqs = []
    requests = {f"r{i}": (PROMPTS[i % 4], _params(JSON)) for i in range(4)}
    for rid, (prompt, params) in requests.items():
        core.add_request(rid, prompt, params)
        seqs.extend(core.scheduler.get_request(rid).seqs)
    tokens: dict[str, list[int]] = {rid: [] for rid in requests}
    while core.has_unfinished():
        for update in core.step().updates:
            tokens[update.request_id].append(update.token.token_id)
    assert core.scheduler.num_preemptions > 0
    assert watch.violations == []
    for seq in seqs:
        state = seq.grammar
        assert state.accepted == len(seq.output_token_ids)
        assert watch.accepts[id(state.matcher)] == state.accepted
    assert tokens["r0"] == alone["json"] and tokens["r3"] == alone["json2"]
