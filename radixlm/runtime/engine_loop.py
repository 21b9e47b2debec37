"""EngineLoop: the Engine's background thread that owns the Scheduler.

Runs in the user's process. Only this thread touches the scheduler; other threads hand it work through
a command queue (submit, abort, or a function to call on the loop thread), so the scheduler needs no
locks and requests from many threads share every batch.

The model is loaded on this thread too, so all of the engine's torch work runs on one thread and uses
one OpenMP thread pool. Why: libgomp keeps a pool per thread that ever ran a parallel region, and once
the process holds more pooled threads than cores it stops spinning at barriers and sleeps instead; each
of the ~150 multi-threaded matmuls of a decode step then pays a wake-up. Measured on 2 cores
(SmolLM2, blocks weight layout, 2 threads): the layers' matmuls took 22.6 ms per pass with one pool and
35-42 ms once the loading thread had a pool of its own; batch-1 decode 44.7 vs 62.3 ms per token.
"""

from __future__ import annotations

import logging
import queue
import threading
from concurrent.futures import Future
from typing import Any, Callable

from radixlm.runtime.messages import TokenOut
from radixlm.runtime.scheduler.request import Req
from radixlm.runtime.scheduler.scheduler import Scheduler

logger = logging.getLogger(__name__)


class EngineLoop:
    scheduler: Scheduler  # set by the loop thread once build() has returned

    def __init__(self, build: Callable[[], Any]):
        """build() runs first on the loop thread (see the module docstring) and returns an object with a
        `scheduler`; it is kept as `built`. Its exception, if any, is raised here."""
        self._commands: queue.Queue = queue.Queue()
        self._inboxes: dict[str, queue.Queue] = {}
        self._stopped = False
        started: Future = Future()
        self._thread = threading.Thread(target=self._main, args=(build, started), name="radixlm-engine",
                                        daemon=True)
        self._thread.start()
        self.built = started.result()

    def _main(self, build: Callable[[], Any], started: Future) -> None:
        try:
            built = build()
        except BaseException as exc:  # noqa: BLE001 - handed to the constructing thread
            self._stopped = True
            started.set_exception(exc)
            return
        self.scheduler = built.scheduler
        started.set_result(built)
        self._run()

    # ---- called from user threads -----------------------------------------------------------------
    def submit(self, reqs: list[Req], inbox: queue.Queue) -> None:
        self._check_alive()
        self._commands.put(("submit", (reqs, inbox)))

    def abort(self, rid: str) -> None:
        if not self._stopped:
            self._commands.put(("abort", rid))

    def call(self, fn: Callable[[], Any]) -> Any:
        """Run fn on the loop thread (between steps) and return its result."""
        self._check_alive()
        fut: Future = Future()
        self._commands.put(("call", (fn, fut)))
        return fut.result()

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        self._commands.put(("stop", None))
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=30)

    def _check_alive(self) -> None:
        if self._stopped or not self._thread.is_alive():
            raise RuntimeError("the engine has been shut down")

    # ---- the loop thread --------------------------------------------------------------------------
    def _run(self) -> None:
        while self._drain_commands(self._wait_timeout()):
            if self.scheduler.has_work():
                self._step()

    def _wait_timeout(self) -> float | None:
        """How long to wait for a command: forever when idle, a few ms when the only work is grammars
        compiling elsewhere (poll them without spinning), not at all when a step can run."""
        if not self.scheduler.has_work():
            return None
        return 0.005 if not self.scheduler.has_runnable() else 0.0

    def _drain_commands(self, timeout: float | None) -> bool:
        """Handle every queued command (waiting up to `timeout` for the first); False on stop."""
        try:
            cmd, arg = self._commands.get_nowait() if timeout == 0.0 else self._commands.get(timeout=timeout)
            while True:
                if cmd == "stop":
                    self._dispatch(self.scheduler.abort_all("engine shut down"))
                    return False
                self._handle(cmd, arg)
                cmd, arg = self._commands.get_nowait()
        except queue.Empty:
            return True

    def _handle(self, cmd: str, arg: Any) -> None:
        if cmd == "submit":
            reqs, inbox = arg
            for req in reqs:
                self._inboxes[req.rid] = inbox
                try:
                    self.scheduler.add_request(req)
                except OverflowError as exc:
                    self._inboxes.pop(req.rid)
                    inbox.put(exc)
        elif cmd == "abort":
            self._dispatch(self.scheduler.abort(arg))
        elif cmd == "call":
            fn, fut = arg
            try:
                fut.set_result(fn())
            except BaseException as exc:  # report to the caller, keep serving
                fut.set_exception(exc)

    def _step(self) -> None:
        try:
            outputs = self.scheduler.step()
        except Exception as exc:  # a bug in a step must not hang every caller: fail what is in flight
            logger.exception("scheduler step failed")
            self._dispatch(self.scheduler.abort_all(f"internal error: {exc}"))
            return
        self._dispatch(outputs)

    def _dispatch(self, outputs: list[TokenOut]) -> None:
        for out in outputs:
            inbox = self._inboxes.get(out.rid)
            if inbox is None:
                continue
            inbox.put(out)
            if out.finish is not None:
                del self._inboxes[out.rid]
