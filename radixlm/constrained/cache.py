"""GrammarCache: compile specs off the scheduler loop in killable worker processes; LRU of results.

Runs in the scheduler process (one dispatcher thread per worker; the workers are worker.py). submit()
never blocks: it returns a Future that the scheduler polls while the request waits in its grammar
queue. Identical specs share one Future (compiled once); failures are cached like successes; a
compile that outlives the wall-clock limit gets its worker SIGKILLed and replaced, and the spec's
Future fails with grammar_timeout; so does one that nobody waits for any more (abandon: its requests
went away). check_pool.py runs finished-output checks through the same machinery.
"""

from __future__ import annotations

import json
import queue
import socket
import subprocess
import sys
import threading
import time
from collections import OrderedDict, deque
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Callable

from radixlm.constrained.errors import GRAMMAR_TIMEOUT, GRAMMAR_TOO_LARGE, INVALID_GRAMMAR, GrammarError
from multiprocessing.connection import Connection

from radixlm.constrained.worker import READY, TOO_LARGE_MESSAGE, param_for

_ABANDON_POLL_S = 0.05  # how often a waiting dispatcher checks whether its job was abandoned


@dataclass(frozen=True)
class GrammarCacheConfig:
    num_workers: int = 2
    compile_timeout_s: float = 5.0
    max_entries: int = 512
    worker_start_timeout_s: float = 120.0  # spawn + imports on a loaded machine; not the compile limit
    worker_memory_bytes: int = 4 << 30  # address-space limit of a worker (0: none)


class _Worker:
    """One compile process and its pipe; used only by its dispatcher thread."""

    def __init__(self, init_messages: list[bytes], config: GrammarCacheConfig):
        self._init = init_messages
        self._config = config
        self._proc: Any = None
        self._conn: Any = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def start(self) -> None:
        # A fresh interpreter running worker.py (not multiprocessing's spawn, which re-imports the user's
        # __main__ module: a script without an `if __name__ == "__main__"` guard would run twice).
        # The pipe is a Unix socketpair wrapped as a Connection: bytes only, never pickle.
        parent_sock, child_sock = socket.socketpair()
        proc = subprocess.Popen([sys.executable, "-m", "radixlm.constrained.worker", str(child_sock.fileno())],
                                pass_fds=(child_sock.fileno(),), stdin=subprocess.DEVNULL,
                                start_new_session=True)  # a terminal's Ctrl-C drains the server, not us
        child_sock.close()
        parent = Connection(parent_sock.detach())
        try:
            parent.send_bytes(json.dumps({"memory_bytes": self._config.worker_memory_bytes}).encode())
            for message in self._init:
                parent.send_bytes(message)
            ready = parent.poll(self._config.worker_start_timeout_s) and parent.recv_bytes() == READY
        except (EOFError, OSError):  # died while starting
            ready = False
        if not ready:
            proc.kill()
            proc.wait()
            parent.close()
            raise RuntimeError("grammar compile worker did not start")
        self._proc, self._conn = proc, parent

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.kill()  # SIGKILL: outlines-core does not check for signals mid-compile
            self._proc.wait()
            self._conn.close()
        self._proc = self._conn = None

    def warm(self) -> None:
        """Start a stopped worker before the next job (whose time limit starts after startup anyway)."""
        if self._proc is None:
            try:
                self.start()
            except RuntimeError:
                pass  # compile() retries the start

    def compile(self, kind: str, spec: str, abandoned: Callable[[], bool] = lambda: False) -> bytes:
        """Index bytes, or GrammarError (timeouts included). Restarts the process when needed. `abandoned`
        is asked while waiting: True (nobody wants the result any more) stops the compile like a timeout."""
        if self._proc is None or self._proc.poll() is not None:
            self.stop()
            self.start()
        try:
            self._conn.send_bytes(json.dumps({"kind": kind, "spec": spec}).encode("utf-8"))
            if not self._wait(abandoned):
                self.stop()  # the dispatcher warms a new one after failing this job
                raise GrammarError(param_for(kind, spec), GRAMMAR_TIMEOUT,
                                   f"grammar did not compile within {self._config.compile_timeout_s:g} s")
            header = json.loads(self._conn.recv_bytes())
            if not header.get("ok"):
                raise GrammarError.from_dict(header["error"])
            return self._conn.recv_bytes()
        except (EOFError, OSError):  # the worker died mid-compile
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
            aborted = self._proc.returncode in (-6, -9)  # SIGABRT: failed allocation; SIGKILL: OOM killer
            self.stop()
            if aborted:
                raise GrammarError(param_for(kind, spec), GRAMMAR_TOO_LARGE, TOO_LARGE_MESSAGE) from None
            raise GrammarError(param_for(kind, spec), INVALID_GRAMMAR, "grammar could not be compiled") from None

    def _wait(self, abandoned: Callable[[], bool]) -> bool:
        """True once the worker answered; False at the deadline or when the job was abandoned."""
        deadline = time.monotonic() + self._config.compile_timeout_s
        while not abandoned():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            if self._conn.poll(min(left, _ABANDON_POLL_S)):
                return True
        return False


class GrammarCache:
    """Bounded LRU of Futures keyed by (backend key, kind, spec); the backend key covers tokenizer,
    vocab size and options. The backend must offer worker_init_messages() and load(bytes)."""

    def __init__(self, backend: Any, config: GrammarCacheConfig | None = None):
        self.backend = backend
        self.config = config or GrammarCacheConfig()
        self._entries: OrderedDict[tuple[str, str, str], Future] = OrderedDict()
        self._lock = threading.Lock()
        self._jobs: queue.Queue = queue.Queue()
        self._abandoned: set[Future] = set()  # running jobs nobody waits for: their workers are stopped
        self.num_compiles = 0  # jobs sent to workers (tests check dedup with it)
        # Wall time of each finished compile (failures included); the server's metrics drain it.
        self.compile_seconds: deque[float] = deque(maxlen=1024)
        init = backend.worker_init_messages()
        self._workers = [_Worker(init, self.config) for _ in range(self.config.num_workers)]
        self._threads = [threading.Thread(target=self._dispatch, args=(w,), daemon=True,
                                          name=f"grammar-dispatch-{i}") for i, w in enumerate(self._workers)]
        for t in self._threads:
            t.start()

    def submit(self, kind: str, spec: str) -> "Future[Any]":
        """The compiled grammar's Future (shared by identical specs). Never blocks on compiling."""
        key = (self.backend.cache_key, kind, spec)
        with self._lock:
            fut = self._entries.get(key)
            if fut is not None:
                self._entries.move_to_end(key)
                return fut
            fut = Future()
            self._entries[key] = fut
            while len(self._entries) > self.config.max_entries:
                # An evicted pending Future still completes for whoever holds it.
                self._entries.popitem(last=False)
            self.num_compiles += 1
        self._jobs.put((kind, spec, fut))
        return fut

    def abandon(self, fut: "Future[Any]") -> None:
        """Nobody waits for this Future any more (its requests went away): a queued job is dropped, a running
        one's worker is stopped and restarted; the spec leaves the cache, so a later request compiles it anew."""
        with self._lock:
            if fut.done():
                return
            for key in [k for k, f in self._entries.items() if f is fut]:
                del self._entries[key]
            if not fut.cancel():  # already running in a dispatcher
                self._abandoned.add(fut)

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def worker_pids(self) -> list[int | None]:
        return [w.pid for w in self._workers]

    def _dispatch(self, worker: _Worker) -> None:
        try:
            worker.start()  # warm up before the first job
        except Exception:  # noqa: BLE001 - compile() retries the start and reports per job
            pass
        while True:
            job = self._jobs.get()
            if job is None:
                break
            kind, spec, fut = job
            if not fut.set_running_or_notify_cancel():
                continue
            start = time.perf_counter()
            try:
                fut.set_result(self.backend.load(worker.compile(kind, spec, lambda: fut in self._abandoned)))
            except GrammarError as e:
                fut.set_exception(e)
            except Exception:  # noqa: BLE001 - never let one spec take the dispatcher down
                fut.set_exception(GrammarError(param_for(kind), INVALID_GRAMMAR, "grammar could not be compiled"))
            with self._lock:
                self._abandoned.discard(fut)
            self.compile_seconds.append(time.perf_counter() - start)
            worker.warm()
        worker.stop()

    def close(self) -> None:
        """Stop dispatchers and kill workers (pending jobs behind the sentinels are dropped)."""
        for _ in self._threads:
            self._jobs.put(None)
        for t in self._threads:
            t.join(timeout=30)
        while True:  # jobs queued behind the sentinels: fail them rather than leave waiters hanging
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                break
            if job is not None and job[2].set_running_or_notify_cancel():
                job[2].set_exception(GrammarError(param_for(job[0]), INVALID_GRAMMAR, "grammar cache closed"))

    def __enter__(self) -> "GrammarCache":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
