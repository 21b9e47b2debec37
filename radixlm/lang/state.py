"""ProgramState (the `s` a program receives) and ProgramStateGroup (the result of `s.fork(n)`).

Runs in the user's process. Thin, blocking views over a StreamExecutor: appending submits an
expression (recording the program line for error messages); reads wait for the variable they need.
"""

from __future__ import annotations

import asyncio
import os
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable, Iterator

from radixlm.lang.interpreter import StreamExecutor
from radixlm.lang.origin import caller_origin
from radixlm.lang.ir import (SglConcateAndAppend, SglExpr, SglExprList, SglRoleBegin, SglRoleEnd,
                             SglVarScopeBegin, SglVarScopeEnd)

if TYPE_CHECKING:
    from radixlm.trace.schema import ProgramTrace


class ProgramState:
    """The state of one running program: text so far, chat messages, variables."""

    def __init__(self, stream_executor: StreamExecutor):
        self.stream_executor = stream_executor
        self.ret_value: Any = None

    # ---- building -----------------------------------------------------------------------------
    def __iadd__(self, other: SglExpr | str) -> "ProgramState":
        if other is None:
            raise ValueError("tried to append None to a program state")
        self.stream_executor.submit(other, caller_origin())
        return self

    def _role(self, role: str, expr: SglExpr | str | None):
        if expr is not None:
            self.stream_executor.submit(SglExprList([SglRoleBegin(role), expr, SglRoleEnd(role)]), caller_origin())
            return None
        return self._role_scope(role)

    @contextmanager
    def _role_scope(self, role: str) -> Iterator[None]:
        self.stream_executor.submit(SglRoleBegin(role), caller_origin())
        yield
        self.stream_executor.submit(SglRoleEnd(role), caller_origin())

    def system(self, expr: SglExpr | str | None = None):
        """`s.system("...")` appends a system message; `with s.system():` opens one."""
        return self._role("system", expr)

    def user(self, expr: SglExpr | str | None = None):
        return self._role("user", expr)

    def assistant(self, expr: SglExpr | str | None = None):
        return self._role("assistant", expr)

    @contextmanager
    def var_scope(self, name: str) -> Iterator[None]:
        """Everything appended inside the block becomes variable `name`."""
        self.stream_executor.submit(SglVarScopeBegin(name), caller_origin())
        yield
        self.stream_executor.submit(SglVarScopeEnd(name), caller_origin())

    def fork(self, size: int = 1, position_ids_offset: list[int] | None = None) -> "ProgramStateGroup":
        executors = self.stream_executor.fork(size)
        return ProgramStateGroup([ProgramState(e) for e in executors], self)

    @contextmanager
    def copy(self, position_ids_offset: list[int] | None = None) -> Iterator["ProgramState"]:
        group = self.fork(1)
        try:
            yield group[0]
        finally:
            group.join()

    # ---- reading ------------------------------------------------------------------------------
    def text(self) -> str:
        return self.stream_executor.text()

    def messages(self) -> list[dict[str, Any]]:
        return self.stream_executor.messages()

    def sync(self) -> None:
        self.stream_executor.sync()

    def error(self) -> BaseException | None:
        return self.stream_executor.error()

    def get_var(self, name: str) -> Any:
        return self.stream_executor.get_var(name)

    def set_var(self, name: str, value: Any) -> None:
        self.stream_executor.set_var(name, value)

    def get_meta_info(self, name: str) -> Any:
        return self.stream_executor.get_meta_info(name)

    def __getitem__(self, name: str) -> Any:
        return self.get_var(name)

    def __setitem__(self, name: str, value: Any) -> None:
        self.set_var(name, value)

    def __contains__(self, name: str) -> bool:
        return name in self.stream_executor.variables

    def __repr__(self) -> str:
        return f"ProgramState({self.text()!r})"

    # ---- the trace (program_trace.py; radixlm/trace) ------------------------------------------------
    def trace(self) -> "ProgramTrace":
        """What this run did, call by call (the whole batch's run for a run_batch state)."""
        recorder = self.stream_executor.trace
        if recorder is None:
            raise ValueError("this program state records no trace")
        self.stream_executor.sync()
        return recorder.export()

    def save_trace(self, path: "str | os.PathLike[str]") -> Path:
        """Write the trace as one self-contained HTML file (opens offline), or as JSON if path ends in .json."""
        from radixlm.trace.html import render_html
        from radixlm.trace.schema import encode_trace

        trace, out = self.trace(), Path(path)
        if out.suffix == ".json":
            out.write_bytes(encode_trace(trace))
        else:
            out.write_text(render_html(trace), encoding="utf-8")
        return out

    def publish_trace(self) -> dict[str, Any]:
        """Post the trace to the backend's server (RuntimeEndpoint): shown at its /dashboard/programs, to
        this API key only (and the admin key). Returns {"id", "url"}."""
        return self.stream_executor.backend.publish_trace(self.trace())

    def export_otel(self, tracer_provider: Any = None) -> None:
        """The trace as OpenTelemetry spans (needs `opentelemetry-sdk`: pip install radixlm[otel])."""
        from radixlm.trace.otel import export_spans

        export_spans(self.trace(), tracer_provider)

    def __del__(self) -> None:
        executor = getattr(self, "stream_executor", None)
        if executor is not None:
            executor.end()

    # ---- streaming ----------------------------------------------------------------------------
    def text_iter(self, var_name: str | None = None) -> Iterator[str]:
        """Yield text as it is produced: the whole text, or one variable. Non-streaming runs yield once."""
        exe = self.stream_executor
        if not exe.stream:
            yield self.text() if var_name is None else self.get_var(var_name)
            return
        for piece, _ in _stream_pieces(exe, var_name, _wait_blocking):
            yield piece
        if exe.error_ is not None:
            raise exe.error_

    async def text_async_iter(self, var_name: str | None = None,
                              return_meta_data: bool = False) -> AsyncIterator[Any]:
        """Async `text_iter`; with `return_meta_data` yields (text, meta_info) for a variable."""
        exe = self.stream_executor
        if not exe.stream:
            value = self.text() if var_name is None else self.get_var(var_name)
            yield (value, exe.meta_info.get(var_name)) if return_meta_data and var_name else value
            return
        loop = asyncio.get_running_loop()
        # The blocking generator advances on an executor thread, so the event loop stays free.
        pieces = _stream_pieces(exe, var_name, _wait_blocking)
        while True:
            item = await loop.run_in_executor(None, next, pieces, None)
            if item is None:
                break
            piece, meta = item
            yield (piece, meta) if return_meta_data and var_name is not None else piece
        if exe.error_ is not None:
            raise exe.error_


def _wait_blocking(event: Any) -> None:
    event.wait()


def _stream_pieces(exe: StreamExecutor, var_name: str | None,
                   wait: Callable[[Any], None]) -> Iterator[tuple[str, Any]]:
    """New text since the last piece, in order, until the text (or variable) is complete."""
    prev = 0
    if var_name is None:
        event = exe.stream_text_event
        while True:
            wait(event)
            event.clear()
            out = exe.text_[prev:]
            prev += len(out)
            if out:
                yield out, None
            if exe.is_finished:
                out = exe.text_[prev:]
                if out:
                    yield out, None
                return
    while var_name not in exe.stream_var_event:
        if exe.is_finished:
            return
        exe.stream_text_event.wait(0.05)
    event = exe.stream_var_event[var_name]
    while True:
        wait(event)
        event.clear()
        value = exe.variables.get(var_name, "")
        out = value[prev:] if isinstance(value, str) else ""
        prev += len(out)
        if out:
            yield out, exe.meta_info.get(var_name)
        if exe.variable_event[var_name].is_set():
            value = exe.variables.get(var_name, "")
            if isinstance(value, str) and value[prev:]:
                yield value[prev:], exe.meta_info.get(var_name)
            return


class ProgramStateGroup:
    """The branches of `s.fork(n)`; `join()` brings results back into the parent."""

    def __init__(self, states: list[ProgramState], src_state: ProgramState):
        self.states = states
        self.src_state = src_state

    def join(self, mode: str = "gather_variable") -> None:
        """gather_variable: each new branch variable becomes a list on the parent (in branch order).
        concate_and_append: append every branch's new text to the parent's text."""
        if mode == "gather_variable":
            parent_vars = self.src_state.stream_executor.variables
            known = set(parent_vars)
            for child in self.states:
                child.stream_executor.sync()
                for name, value in child.stream_executor.variables.items():
                    if name not in known:
                        parent_vars.setdefault(name, []).append(value)
        elif mode == "concate_and_append":
            self.src_state.stream_executor.submit(SglConcateAndAppend(self.states), caller_origin())
            self.src_state.stream_executor.sync()
        else:
            raise ValueError(f"invalid join mode {mode!r}; use 'gather_variable' or 'concate_and_append'")
        for child in self.states:
            child.stream_executor.end()

    def __getitem__(self, i: int) -> ProgramState:
        return self.states[i]

    def __setitem__(self, i: int, value: ProgramState) -> None:
        """`forks[i] += ...` (SGLang's idiom): Python stores the branch back after extending it in place.
        A branch can only be extended, never replaced by another state."""
        if value is not self.states[i]:
            raise TypeError("a fork's branch can only be extended in place (forks[i] += ...), not replaced")

    def __len__(self) -> int:
        return len(self.states)

    def __iter__(self) -> Iterator[ProgramState]:
        return iter(self.states)

    def __iadd__(self, other: Any) -> "ProgramStateGroup":
        if callable(other) and not isinstance(other, SglExpr):
            for i, state in enumerate(self.states):
                state += other(i)
        elif isinstance(other, (SglExpr, str)):
            for state in self.states:
                state += other
        elif isinstance(other, (list, tuple)):
            if len(other) != len(self.states):
                raise ValueError(f"expected {len(self.states)} expressions, got {len(other)}")
            for state, expr in zip(self.states, other):
                state += expr
        else:
            raise ValueError(f"cannot append {type(other).__name__} to forked states")
        return self
