"""EngineLoop: the Engine's background thread, which owns the Scheduler and runs the scheduler loop.

Runs in the user's process. The loop is scheduler/loop.py's SchedulerLoop, the same one the scheduler
process runs, over a queue transport (scheduler/transport.py) instead of ZMQ: other threads hand it work
(a request, an abort, or a function to call on the loop thread) through one queue, so the scheduler needs
no locks and requests from many threads share every batch.

The model is loaded on this thread too, so all of the engine's torch work runs on one thread and uses
one OpenMP thread pool. Why: libgomp keeps a pool per thread that ever ran a parallel region, and once
the process holds more pooled threads than cores it stops spinning at barriers and sleeps instead; each
of the ~150 multi-threaded matmuls of a decode step then pays a wake-up. Measured on 2 cores
(SmolLM2, blocks weight layout, 2 threads): the layers' matmuls took 22.6 ms per pass with one pool and
35-42 ms once the loading thread had a pool of its own; batch-1 decode 44.7 vs 62.3 ms per token.
"""

from __future__ import annotations

import queue
import threading
from concurrent.futures import Future
from typing import Any, Callable

from radixlm.runtime.messages import AbortReq, ControlReq, GenerateReq
from radixlm.runtime.scheduler.loop import SchedulerLoop
from radixlm.runtime.scheduler.scheduler import Scheduler
from radixlm.runtime.scheduler.transport import LocalCall, QueueTransport


class EngineLoop:
    scheduler: Scheduler  # set by the loop thread once build() has returned

    def __init__(self, build: Callable[[], Any]):
        """build() runs first on the loop thread (see the module docstring) and returns an object with a
        `scheduler` (and a `runner`, read when a request is added); it is kept as `built`. Its exception,
        if any, is raised here."""
        self.transport = QueueTransport()
        self._stopped = False
        started: Future = Future()
        self._thread = threading.Thread(target=self._main, args=(build, started), name="radixlm-engine",
                                        daemon=True)
        self._thread.start()
        self.built = started.result()

    def _main(self, build: Callable[[], Any], started: Future) -> None:
        from radixlm.runtime.builder import make_req

        try:
            built = build()
        except BaseException as exc:  # noqa: BLE001 - handed to the constructing thread
            self._stopped = True
            started.set_exception(exc)
            return
        self.scheduler = built.scheduler
        started.set_result(built)
        SchedulerLoop(built.scheduler, self.transport,
                      lambda msg, params, rid, child: make_req(msg, params, rid, child, built.runner.device),
                      shutdown_message="engine shut down").run()

    # ---- called from user threads -----------------------------------------------------------------
    def submit(self, msg: GenerateReq, inbox: queue.Queue, at_finish: bool = False) -> None:
        """Run the request; every child rid's TokenOuts arrive in inbox (a refusal is one with `error`), as
        they come or (at_finish) together when the rid finishes."""
        self._check_alive()
        self.transport.submit(msg, inbox, at_finish)

    def abort(self, rid: str) -> None:
        if not self._stopped:
            self.transport.put(AbortReq(rid=rid))

    def call(self, fn: Callable[[], Any]) -> Any:
        """Run fn on the loop thread (between steps) and return its result."""
        self._check_alive()
        fut: Future = Future()
        self.transport.put(LocalCall(fn, fut))
        return fut.result()

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        self.transport.put(ControlReq(req_id="", kind="shutdown"))
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=30)

    def _check_alive(self) -> None:
        if self._stopped or not self._thread.is_alive():
            raise RuntimeError("the engine has been shut down")
