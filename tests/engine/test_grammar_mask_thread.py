"""The grammar thread's ordering: a step's tokens are accepted and the next step's masks
filled on it while the engine thread returns, plans and builds the next step. Matchers are
never touched by the engine thread; a request aborted, finished or preempted while its job is
pending ends cleanly; a finished row's mask never reaches another row; outputs equal those
computed alone."""

from __future__ import annotations

import json
import threading

import pytest

from tallow import LLM, SamplingParams, StructuredOutputsParams
from tallow.engine.sampling.structured import structured_spec
from tallow.plugin import GrammarSpec

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 6},
    "age": {"type": "integer", "minimum": 0, "maximum": 99}},
    "required": ["name", "age"], "additionalProperties": False}
PROMPTS = [[11 + i, 40 + 3 * i, 7, 90 + i, 23] for i in range(4)]


def _params(spec=None, max_tokens=40, **kw) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, structured_outputs=spec, **kw)


JSON = StructuredOutputsParams(json=SCHEMA)
CHOICE = {"choice": ["yes", "no"]}


class Watch:
    """Instruments an engine's grammar side: every matcher call must come from the grammar
    thread (the engine thread only builds matchers and reads verdicts), each matcher's
    accepted tokens are counted, and the next job can be held back on the grammar thread —
    before its fill (``armed``) or before its accepts (``armed_accept``) — until the test
    lets it go."""

    def __init__(self, llm: LLM, monkeypatch: pytest.MonkeyPatch) -> None:
        self.core = llm.engine.core
        structured = self.core.structured
        backend = structured.backend
        self.violations: list[str] = []
        self.accepts: dict[int, int] = {}
        self.armed = False
        self.armed_accept = False
        self.hold: set[int] | None = None  # the matchers of the fill to hold back
        self.hold_accept = False
        self.held = threading.Event()  # the held job is waiting on the grammar thread
        self.release = threading.Event()
        start_fill, fill, accept_tokens = (structured.start_fill, backend.fill_bitmasks,
                                           backend.accept_tokens)

        def watched_start_fill(work, advance=()):
            if self.armed and work:
                self.armed, self.hold = False, {id(s.matcher) for s, _, _ in work}
            if self.armed_accept and advance:
                self.armed_accept, self.hold_accept = False, True
            return start_fill(work, advance)

        def wait_for_test():
            self.held.set()
            assert self.release.wait(timeout=30), "the test never let the job go"

        def held_fill(matchers, bitmask, rows):
            if {id(m) for m in matchers} == self.hold:
                self.hold = None
                wait_for_test()
            fill(matchers, bitmask, rows)

        def held_accept_tokens(matchers, tokens):
            if self.hold_accept:
                self.hold_accept = False
                wait_for_test()
            return accept_tokens(matchers, tokens)

        monkeypatch.setattr(structured, "start_fill", watched_start_fill)
        monkeypatch.setattr(backend, "fill_bitmasks", held_fill)
        monkeypatch.setattr(backend, "accept_tokens", held_accept_tokens)
        cls = type(backend.matcher(structured.compile(GrammarSpec("choice", ("a",)))))
        watch = self
        for name in ("accept", "rollback", "fill_bitmask", "is_terminated"):
            original = getattr(cls, name)

            def watched(matcher, *args, _original=original, _name=name):
                watch.check(_name)
                return _original(matcher, *args)

            monkeypatch.setattr(cls, name, watched)
        accepted = cls._accepted

        def count_accepted(matcher, token):
            watch.check("accept")
            watch.accepts[id(matcher)] = watch.accepts.get(id(matcher), 0) + 1
            return accepted(matcher, token)

        monkeypatch.setattr(cls, "_accepted", count_accepted)

    def check(self, what: str) -> None:
        if not threading.current_thread().name.startswith("tallow-grammar"):
            self.violations.append(f"{what} on {threading.current_thread().name}")

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
    return LLM(model=str(tiny_llama), dtype="float32", device="cpu", num_blocks=256,
               block_size=4, async_scheduling=True)


@pytest.fixture(scope="module")
def alone(llm) -> dict[str, list[int]]:
    """Each request's tokens computed alone."""
    cases = {"json": (PROMPTS[0], _params(JSON)), "choice": (PROMPTS[1], _params(CHOICE)),
             "free": (PROMPTS[2], _params(None, max_tokens=12, ignore_eos=True)),
             "json2": (PROMPTS[3], _params(JSON))}
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

    out = _run(llm.engine.core, {"json": (PROMPTS[0], _params(JSON)),
                                 "choice": (PROMPTS[1], _params(CHOICE)),
                                 "free": (PROMPTS[2], _params(None, max_tokens=12,
                                                              ignore_eos=True))},
               on_step=on_step)
    out["json2"] = late["json2"]
    assert out == alone
    assert any(seen_in_flight), "no call returned with a fill in flight"
    assert watch.violations == []
    tokenizer = llm.engine.tokenizer
    for rid in ("json", "json2"):
        json.loads(tokenizer.decode(out[rid]))


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
    tight = LLM(model=str(tiny_llama), dtype="float32", device="cpu", num_blocks=16,
                block_size=4, max_model_len=64, async_scheduling=True)
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


def _step_until_held(core, watch, tokens, rid, after: int) -> int:
    """Step until ``rid`` has ``after`` tokens, then hold the next job that accepts tokens
    before its accepts, and return once the grammar thread waits there (with the tokens of
    ``rid`` reported so far)."""
    for _ in range(400):
        armed = len(tokens[rid]) >= after
        watch.armed_accept = armed
        for update in core.step().updates:
            tokens[update.request_id].append(update.token.token_id)
        if armed and not watch.armed_accept:  # this call started the job to hold
            assert watch.held.wait(timeout=30), "the held job never reached its accepts"
            return len(tokens[rid])
    raise AssertionError("no job was held")


def _drain(core, tokens, limit=400) -> dict[str, str | None]:
    finish: dict[str, str | None] = {}
    for _ in range(limit):
        if not core.has_unfinished():
            return finish
        for update in core.step().updates:
            tokens[update.request_id].append(update.token.token_id)
            if update.finish_reason is not None:
                finish[update.request_id] = update.finish_reason
    raise AssertionError("the engine did not finish")


@pytest.mark.parametrize("how", ["abort", "stop-string"])
def test_a_completion_ended_while_its_accept_is_pending_reports_nothing_more(
        llm, alone, monkeypatch, how):
    """The engine thread ends a completion (an abort; a stop string seen by the output
    processor) while the grammar thread has not yet accepted its last token: that token is
    not reported, nothing after it is, the request is gone, and the other request's output
    is its solo run's."""
    from tallow.engine.sequence import SequenceStatus

    watch = Watch(llm, monkeypatch)
    core = llm.engine.core
    core.add_request("doomed", PROMPTS[0], _params(JSON))
    core.add_request("json2", PROMPTS[3], _params(JSON))
    tokens: dict[str, list[int]] = {"doomed": [], "json2": []}
    reported = _step_until_held(core, watch, tokens, "doomed", 3)
    if how == "abort":
        core.abort("doomed")
    else:
        assert core.finish_sequence("doomed", 0, SequenceStatus.FINISHED_STOPPED)
    watch.release.set()
    _drain(core, tokens)
    assert tokens["doomed"] == alone["json"][:reported]
    assert tokens["json2"] == alone["json2"]
    assert watch.violations == []
    assert core.scheduler.num_constrained == 0 and not core.has_unfinished()


def test_a_request_preempted_while_its_accept_is_pending_resumes_its_grammar(
        tiny_llama, alone, monkeypatch):
    """A cache too small for the batch: the accept job of a step is held on the grammar
    thread while the engine plans the next steps (which preempts sequences); every output
    still equals its solo run, and every matcher took each of its tokens once."""
    tight = LLM(model=str(tiny_llama), dtype="float32", device="cpu", num_blocks=16,
                block_size=4, max_model_len=64, async_scheduling=True)
    watch = Watch(tight, monkeypatch)
    core = tight.engine.core
    requests = {f"r{i}": (PROMPTS[i % 4], _params(JSON)) for i in range(4)}
    seqs = []
    for rid, (prompt, params) in requests.items():
        core.add_request(rid, prompt, params)
        seqs.extend(core.scheduler.get_request(rid).seqs)
    tokens: dict[str, list[int]] = {rid: [] for rid in requests}
    _step_until_held(core, watch, tokens, "r0", 4)
    preempted = core.scheduler.num_preemptions
    for _ in range(2):  # the engine thread plans on while the accepts wait
        threading.Timer(0.2, watch.release.set).start()
        for update in core.step().updates:
            tokens[update.request_id].append(update.token.token_id)
    _drain(core, tokens)
    assert core.scheduler.num_preemptions > preempted or core.scheduler.num_preemptions > 0
    assert watch.violations == []
    for seq in seqs:
        assert seq.grammar.accepted == len(seq.output_token_ids)
        assert watch.accepts[id(seq.grammar.matcher)] == seq.grammar.accepted
    assert tokens["r0"] == alone["json"] and tokens["r3"] == alone["json2"]


@pytest.mark.parametrize("async_scheduling", [True, False], ids=["async", "sync"])
def test_an_ended_grammar_ends_its_output_at_its_last_token(tiny_llama, async_scheduling):
    """The grammar's end, found on the grammar thread a step after the token was sampled,
    still ends the output right after that token, with finish reason "stop": a fresh
    matcher fed the output accepts every token and ends after the last one only. With
    ``max_tokens`` equal to that length the reason stays "stop" (the grammar's end counts
    first, as the token that reached the limit also ended the grammar)."""
    llm = LLM(model=str(tiny_llama), dtype="float32", device="cpu", num_blocks=256,
              block_size=4, async_scheduling=async_scheduling)
    structured = llm.engine.core.structured
    specs = [StructuredOutputsParams(json=SCHEMA), {"choice": ["yes", "no"]},
             {"regex": "[a-c]{2,5}"}]
    prompts = [PROMPTS[i % 4] for i in range(len(specs))]
    outs = llm.generate(prompts, [_params(spec, max_tokens=60) for spec in specs])
    for spec, prompt, out in zip(specs, prompts, outs):
        done = out.outputs[0]
        assert done.finish_reason == "stop" and done.stop_reason is None
        state = llm.engine.core._grammar_state(structured_spec(spec))
        for i, token in enumerate(done.token_ids):
            assert not state.matcher.is_terminated(), (spec, i)
            assert state.matcher.accept(token), (spec, i)
        assert state.matcher.is_terminated(), spec
        exact = llm.generate(prompt, _params(spec, max_tokens=len(done.token_ids)))[0]
        assert exact.outputs[0].token_ids == done.token_ids
        assert exact.outputs[0].finish_reason == "stop"
    assert structured.stats()["grammar_accept_seconds_total"] > 0


def test_the_switch_interval_setting_applies_when_the_grammar_thread_starts(tiny_llama):
    import sys

    before = sys.getswitchinterval()
    try:
        llm = LLM(model=str(tiny_llama), dtype="float32", device="cpu", num_blocks=256,
                  block_size=4, grammar_switch_interval_ms=0.5)
        assert sys.getswitchinterval() == before  # nothing constrained yet
        out = llm.generate(PROMPTS[0], _params(CHOICE))[0].outputs[0]
        assert out.text in ("yes", "no")
        assert sys.getswitchinterval() == pytest.approx(0.0005)
    finally:
        sys.setswitchinterval(before)
