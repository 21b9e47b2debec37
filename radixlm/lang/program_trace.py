"""TraceRecorder: what a program run did, call by call (gen, select, fork, commit, join), for the trace
explorer. Runs in the user's process.

Every StreamExecutor of one run (or of one run_batch: its items and all their fork branches) shares one
recorder. Recording is cheap: a call keeps its times, character offsets into its state's text and the
token counts of its meta_info; the text itself is read from the executors only when the trace is exported
(`ProgramState.trace()` / `save_trace()` / `publish_trace()`). Not to be confused with tracer.py, which
finds a program's constant prefix.
"""

from __future__ import annotations

import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterator

from radixlm.trace.schema import MAX_CALLS, MAX_STATE_CHARS, MAX_STATES, ProgramTrace, TraceCall, TraceState

if TYPE_CHECKING:
    from radixlm.lang.interpreter import StreamExecutor


@dataclass
class _StateEntry:
    executor: "StreamExecutor"
    parent: str | None
    fork_pos: int
    item: int | None


@dataclass
class CallRecord:
    kind: str
    state: str
    start: float
    prompt_end: int
    name: Any = None
    end: float = 0.0
    output_end: int = 0
    usage: dict[str, Any] = field(default_factory=dict)  # prompt_tokens, cached_tokens, completion_tokens, finish
    error: str | None = None
    children: list[str] = field(default_factory=list)


class TraceRecorder:
    def __init__(self, name: str, backend: str = ""):
        self.name = name
        self.backend = backend
        self.id = uuid.uuid4().hex
        self.started_at = time.time()
        self._t0 = time.perf_counter()
        self._ended: float | None = None
        self._lock = threading.Lock()
        self._states: dict[str, _StateEntry] = {}
        self._calls: list[CallRecord] = []
        self._dropped = 0

    def now(self) -> float:
        return time.perf_counter() - self._t0

    def add_state(self, executor: "StreamExecutor", parent: str | None = None, fork_pos: int = 0,
                  item: int | None = None) -> None:
        with self._lock:
            self._states[executor.sid] = _StateEntry(executor, parent, fork_pos, item)

    def end(self) -> None:
        self._ended = self.now()

    @contextmanager
    def call(self, executor: "StreamExecutor", kind: str, name: Any = None) -> Iterator[CallRecord]:
        """Record one call around its execution: prompt = the state's text when it starts, output = what
        the call appended. A failing call is recorded with its error and re-raised."""
        rec = CallRecord(kind, executor.sid, self.now(), len(executor.text_), name)
        try:
            yield rec
        except BaseException as exc:
            rec.error = f"{type(exc).__name__}: {exc}"
            raise
        finally:
            rec.end = self.now()
            rec.output_end = len(executor.text_)
            with self._lock:
                if len(self._calls) < MAX_CALLS:
                    self._calls.append(rec)
                else:
                    self._dropped += 1

    def export(self) -> ProgramTrace:
        with self._lock:
            states, calls = dict(self._states), list(self._calls)
        out_states = []
        for sid, entry in states.items():
            text = entry.executor.text_[entry.fork_pos:] if entry.parent else entry.executor.text_
            out_states.append(TraceState(id=sid, text=text[:MAX_STATE_CHARS], parent=entry.parent,
                                         fork_pos=entry.fork_pos, item=entry.item,
                                         truncated=len(text) > MAX_STATE_CHARS))
        end = self._ended if self._ended is not None else self.now()
        return ProgramTrace(name=self.name, id=self.id, started_at=self.started_at, duration=end,
                            backend=self.backend, states=out_states[:MAX_STATES], dropped_calls=self._dropped,
                            calls=[_call_view(c) for c in sorted(calls, key=lambda c: c.start)])


def _call_view(rec: CallRecord) -> TraceCall:
    u = rec.usage
    return TraceCall(kind=rec.kind, state=rec.state, start=rec.start, end=rec.end,
                     name=None if rec.name is None else str(rec.name), prompt_end=rec.prompt_end,
                     output_end=rec.output_end, prompt_tokens=u.get("prompt_tokens"),
                     cached_tokens=u.get("cached_tokens"), completion_tokens=u.get("completion_tokens"),
                     finish=u.get("finish"), error=rec.error, children=rec.children)


def usage_of(meta: Any) -> dict[str, Any]:
    """Token counts from a gen's meta_info (a list of them when n > 1: prompt counted once, outputs summed)."""
    metas = [m for m in (meta if isinstance(meta, list) else [meta]) if isinstance(m, dict)]
    if not metas:
        return {}
    first = metas[0]
    usage: dict[str, Any] = {}
    for key in ("prompt_tokens", "cached_tokens"):
        if isinstance(first.get(key), int):
            usage[key] = first[key]
    outs = [m["completion_tokens"] for m in metas if isinstance(m.get("completion_tokens"), int)]
    if outs:
        usage["completion_tokens"] = sum(outs)
    finish = first.get("finish_reason")
    if isinstance(finish, dict):
        usage["finish"] = finish.get("type")
    elif isinstance(finish, str):
        usage["finish"] = finish
    return usage
