"""Grammar compiles in a worker process, so that a compile can be given a time budget.

A JSON Schema with thousands of optional properties can keep a grammar compiler busy for
minutes, and a compile running in a thread cannot be stopped. A backend that can hand compiled
grammars across processes (:attr:`tallow.plugin.GrammarBackend.exports_compiled`) compiles in
a child process instead: the child builds its own instance of the backend for the same
vocabulary, compiles one spec at a time and sends the result back as bytes. A compile that
overruns ``runner.grammar_compile_timeout_s`` ends the child (its CPU is freed at once); the
next compile starts a fresh one.

The child is a fresh interpreter (``python -m tallow.engine.sampling.grammar_worker``: never a
``fork`` of the engine's process, which runs threads, and never a re-import of the parent's
main script) started on the first compile; it exits with its parent (it reads its requests
from a socket whose other end closes then).
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Connection
from typing import Any

from tallow.plugin import GrammarError, GrammarSpec, TokenizerInfo

log = logging.getLogger("tallow.engine")

#: seconds a new worker may take to import its backend and build it for the vocabulary
_START_TIMEOUT_S = 300.0


class GrammarBudgetError(GrammarError):
    """A spec over a limit of the server (its size, or its compile time): ``setting`` names
    the limit's setting."""

    def __init__(self, problem: str, setting: str) -> None:
        super().__init__(problem)
        self.setting = setting


def _serve(conn: Connection) -> None:
    """The child: build the backend it is sent, then compile each spec it is sent until the
    socket closes."""
    try:
        backend_cls, tokenizer, config = conn.recv()
        backend = backend_cls(tokenizer, config)
    except BaseException as exc:
        conn.send(("failed", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready", None))
    while True:
        try:
            spec = conn.recv()
        except (EOFError, OSError):
            return
        try:
            conn.send(("ok", backend.export_compiled(backend.compile(spec))))
        except GrammarError as exc:
            conn.send(("refused", (exc.problem, exc.path)))
        except Exception as exc:
            conn.send(("failed", f"{type(exc).__name__}: {exc}"))


class CompileWorker:
    """Compiles specs in a child process (see the module docstring); thread-safe (one compile
    at a time)."""

    def __init__(
        self, backend_cls: type, tokenizer: TokenizerInfo, config: Any, timeout_s: float
    ) -> None:
        self.backend_cls = backend_cls
        self.tokenizer = tokenizer
        self.config = config
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._conn: Connection | None = None
        #: compiles stopped at the time budget
        self.timeouts = 0

    def _start(self) -> Connection:
        ours, theirs = socket.socketpair()
        started = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, "-m", "tallow.engine.sampling.grammar_worker", str(theirs.fileno())],
            pass_fds=(theirs.fileno(),),
            stdin=subprocess.DEVNULL,
            env={**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")},
        )
        theirs.close()
        conn = Connection(ours.detach())
        self._proc, self._conn = proc, conn
        try:
            conn.send((self.backend_cls, self.tokenizer, self.config))
            if not conn.poll(_START_TIMEOUT_S):
                raise RuntimeError(f"it did not start in {_START_TIMEOUT_S:.0f} s")
            status, detail = conn.recv()
        except (EOFError, OSError) as exc:
            self.stop()
            raise RuntimeError(
                f"the grammar compile worker failed to start: {type(exc).__name__} (see the log)"
            ) from None
        except RuntimeError as exc:
            self.stop()
            raise RuntimeError(f"the grammar compile worker failed to start: {exc}") from None
        if status != "ready":
            self.stop()
            raise RuntimeError(f"the grammar compile worker failed to start: {detail}")
        log.info(
            "grammar compile worker (pid %d) ready in %.2fs",
            proc.pid,
            time.perf_counter() - started,
        )
        return conn

    def compile(self, spec: GrammarSpec) -> bytes:
        """``spec`` compiled and exported by the backend. Raises :class:`GrammarError` for a
        spec the backend refuses and :class:`GrammarBudgetError` for one whose compile
        overran the budget (the worker is stopped)."""
        with self._lock:
            conn = self._conn if self.pid is not None and self._conn is not None else self._start()
            conn.send(spec)
            if not conn.poll(self.timeout_s):
                self.stop()
                self.timeouts += 1
                raise GrammarBudgetError(
                    f"compiling it takes longer than the server allows "
                    f"({self.timeout_s:g} s, runner.grammar_compile_timeout_s); simplify it "
                    "(fewer optional properties, alternatives or repetitions)",
                    "runner.grammar_compile_timeout_s",
                )
            try:
                status, payload = conn.recv()
            except EOFError:  # the child died (out of memory, a crash in the backend)
                self.stop()
                raise RuntimeError("the grammar compile worker exited while compiling") from None
        if status == "ok":
            assert isinstance(payload, bytes)
            return payload
        if status == "refused":
            raise GrammarError(*payload)
        raise RuntimeError(f"the grammar compile worker failed: {payload}")

    def stop(self) -> None:
        """End the child (a compile in progress is abandoned)."""
        proc, conn = self._proc, self._conn
        self._proc = self._conn = None
        if conn is not None:
            conn.close()
        if proc is not None:
            if proc.poll() is None:
                proc.kill()
            proc.wait(5)

    @property
    def pid(self) -> int | None:
        """The child's process id while it runs."""
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None


if __name__ == "__main__":
    _serve(Connection(int(sys.argv[1])))
