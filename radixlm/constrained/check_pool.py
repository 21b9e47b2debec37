"""Finished-output checks (validate.py) in killable worker processes, under the grammar compile deadline.

Runs in the server's detokenizer and HTTP processes. A check runs jsonschema and an ECMA-262 regex engine
that backtracks: a `pattern` with look-around (widened in the grammar) can take minutes on what the model
wrote, and a large schema's validator takes seconds to build; neither can be interrupted in-process, and
both would hold every other request's output. So checks run in GrammarCache workers (cache.py: a deadline
that SIGKILLs, a memory limit, a bounded number of processes; validators stay cached in each worker), and a
check that does not finish in time is reported unchecked (`JsonCheck.valid` None), never waited for longer.
"""

from __future__ import annotations

import json
import threading
from concurrent.futures import CancelledError, Future
from typing import Any

from radixlm.constrained.base import GrammarOptions
from radixlm.constrained.errors import GRAMMAR_TIMEOUT, GrammarError
from radixlm.constrained.validate import JsonCheck, check_json_output

KIND = "json_check"
_MAX_CACHED = 32  # finished checks kept (keyed by schema + text: a repeated greedy output is checked once)
# The HTTP process checks tool-call arguments and response_format content: awaited before a route builds
# its answer (check_async), or, where a route did not, waited for there (check_blocking): a short budget
# (a check of one output takes milliseconds once its validator is built).
BLOCKING_TIMEOUT_S = 1.0
_QUEUE_ALLOWANCE_S = 1.0  # on top of the worker's deadline: a check may wait for a free worker
_shared: "OutputChecker | None" = None
_shared_lock = threading.Lock()


class _CheckBackend:
    """What GrammarCache needs of a backend: the worker runs validate.check_serialized."""

    name = cache_key = KIND

    def worker_init_messages(self) -> list[bytes]:
        return [KIND.encode(), GrammarOptions().to_json().encode("utf-8"), b""]

    def load(self, data: bytes) -> JsonCheck:
        return JsonCheck.from_json(data)


class OutputChecker:
    def __init__(self, num_workers: int = 2, timeout_s: float = 5.0):
        from radixlm.constrained.cache import GrammarCache, GrammarCacheConfig

        self.timeout_s = timeout_s
        self._cache = GrammarCache(_CheckBackend(), GrammarCacheConfig(
            num_workers=num_workers, compile_timeout_s=timeout_s, max_entries=_MAX_CACHED))

    def submit(self, spec: str, text: str, complete: bool) -> "Future[Any]":
        """A Future for the check; read it with outcome(). An incomplete output needs no worker."""
        if not complete:
            fut: Future = Future()
            fut.set_result(check_json_output(spec, text, False))
            return fut
        return self._cache.submit(KIND, json.dumps({"schema": spec, "text": text, "complete": True}))

    def outcome(self, fut: "Future[Any]") -> JsonCheck:
        """The finished Future's check; a check stopped at the deadline (or its worker lost) is unchecked."""
        try:
            return fut.result(timeout=0)
        except CancelledError:  # another waiter of the same check gave up on it
            return JsonCheck(None, "unchecked: the output check was stopped")
        except GrammarError as e:
            if e.code == GRAMMAR_TIMEOUT:
                return JsonCheck(None, f"unchecked: the output check did not finish within {self.timeout_s:g} s")
            return JsonCheck(None, "unchecked: the output check failed")

    def check(self, spec: str, text: str, complete: bool) -> JsonCheck:
        """Blocking: the check, or unchecked at the deadline (waits at most about timeout_s)."""
        fut = self.submit(spec, text, complete)
        try:
            fut.exception(timeout=self.timeout_s + _QUEUE_ALLOWANCE_S)  # the worker's deadline ends it first
        except TimeoutError:  # queued behind other checks the whole time
            return self._gave_up()
        except CancelledError:
            pass  # outcome() says so
        return self.outcome(fut)

    async def check_async(self, spec: str, text: str, complete: bool) -> JsonCheck:
        """The same, awaited: the event loop serves others meanwhile."""
        import asyncio

        fut = self.submit(spec, text, complete)
        done = asyncio.Event()
        loop = asyncio.get_running_loop()
        fut.add_done_callback(lambda _: loop.call_soon_threadsafe(done.set))
        try:
            await asyncio.wait_for(done.wait(), self.timeout_s + _QUEUE_ALLOWANCE_S)
        except asyncio.TimeoutError:
            return self._gave_up()
        return self.outcome(fut)

    def _gave_up(self) -> JsonCheck:
        # The job itself is left to its worker's deadline: the Future may be shared with other waiters.
        return JsonCheck(None, f"unchecked: the output check did not finish within {self.timeout_s:g} s")

    def close(self) -> None:
        self._cache.close()


def shared_checker() -> OutputChecker:
    """This process's shared checker, started on first use (its workers start in the background: call this
    when a request that will need checks begins, so they are warm when it ends)."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = OutputChecker(num_workers=2, timeout_s=BLOCKING_TIMEOUT_S)
        return _shared


def check_blocking(spec: str, text: str, complete: bool) -> JsonCheck:
    """check_json_output for a caller that must answer now (the HTTP process): in this process's shared
    check workers, unchecked after about BLOCKING_TIMEOUT_S."""
    return shared_checker().check(spec, text, complete)
