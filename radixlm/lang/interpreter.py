"""StreamExecutor: executes a program's expressions in order on a worker thread (one per program state).

Runs in the user's process. The program function only *submits* expressions; the worker calls the
backend, so a program can build up the next prompt while the previous `gen` is still running, and
`s["var"]` blocks only until that variable exists. A failure stops the worker; the exception is
annotated with the program line that submitted the failing expression and re-raised to the caller at
the next submit, read or sync.
"""

from __future__ import annotations

import contextlib
import contextvars
import queue
import threading
import uuid
from typing import TYPE_CHECKING, Any

from radixlm.lang.ir import (SglArgument, SglCommitLazy, SglConcateAndAppend, SglConstantText, SglExpr, SglExprList,
                             SglGen, SglRoleBegin, SglRoleEnd, SglSelect, SglVarScopeBegin, SglVarScopeEnd,
                             variable_names)
from radixlm.lang.origin import Origin, annotate
from radixlm.lang.params import GenParams
from radixlm.lang.program_trace import CallRecord, TraceRecorder, usage_of
from radixlm.sampling_params import SamplingParams

if TYPE_CHECKING:
    from radixlm.lang.backend.base import BaseBackend
    from radixlm.lang.chat_template import ChatTemplate

class StreamExecutor:
    """Holds one program state (text, messages, variables) and executes expressions against a backend."""

    def __init__(self, backend: "BaseBackend", arguments: dict[str, Any], default_params: GenParams,
                 chat_template: "ChatTemplate | None", stream: bool, num_api_spec_tokens: int | None = None,
                 use_thread: bool = True, trace: TraceRecorder | None = None):
        self.sid = uuid.uuid4().hex
        self.trace = trace  # the run's call record (program_trace.py), shared with fork branches
        self._call: CallRecord | None = None  # the call executing now (note_usage adds to it)
        self.backend = backend
        self.arguments = arguments
        self.default_params = default_params
        self.stream = stream
        self.num_api_spec_tokens = num_api_spec_tokens  # accepted for compatibility; no API speculation
        self.chat_template = chat_template or backend.get_chat_template()

        self.text_ = ""
        self.messages_: list[dict[str, Any]] = []
        self.cur_role: str | None = None
        self.cur_role_begin_pos: int | None = None
        self.fork_start_text_pos: int | None = None
        self.variables: dict[Any, Any] = {}
        self.meta_info: dict[Any, Any] = {}
        self.variable_event: dict[Any, threading.Event] = {}
        self.stream_var_event: dict[Any, threading.Event] = {}
        self.stream_text_event = threading.Event() if stream else None
        self.is_finished = False
        self.error_: BaseException | None = None

        self.use_thread = use_thread
        self._lock = threading.Lock()  # orders submit() against the worker's failure cleanup
        self._ended = False
        self._worker_failed = False
        # Submitted-but-unfinished writes per variable: a name reused by a later gen must not be
        # reported ready when the earlier gen finishes.
        self._pending: dict[Any, int] = {}
        if use_thread:
            self.queue: queue.Queue[tuple[SglExpr | str, Origin | None] | None] = queue.Queue()
            ctx = contextvars.copy_context()
            self.worker = threading.Thread(target=ctx.run, args=(self._worker_loop,), daemon=True,
                                           name=f"radixlm-program-{self.sid[:8]}")
            self.worker.start()

    # ---- submission and synchronization -------------------------------------------------------
    def submit(self, expr: SglExpr | str, origin: Origin | None = None) -> None:
        with self._lock:
            if self.error_ is not None:
                raise self.error_
            for name in variable_names(expr):
                self.variable_event.setdefault(name, threading.Event()).clear()
                self._pending[name] = self._pending.get(name, 0) + 1
                if self.stream:
                    self.stream_var_event.setdefault(name, threading.Event())
            if self.use_thread:
                self.queue.put((expr, origin))
                return
        try:
            self._execute(expr)
        except BaseException as e:
            raise annotate(e, origin)

    def sync(self) -> None:
        if self.use_thread:
            self.queue.join()
        if self.error_ is not None:
            raise self.error_

    def end(self) -> None:
        with self._lock:
            if self._ended:
                return
            self._ended = True
            if self.use_thread and not self._worker_failed:
                self.queue.put(None)
        self.backend.end_program(self)

    def record_error(self, error: BaseException) -> None:
        """A failure outside the worker (the program function itself, in stream mode)."""
        with self._lock:
            if self.error_ is None:
                self.error_ = error

    def get_var(self, name: Any) -> Any:
        if name in self.variable_event:
            self.variable_event[name].wait()
        if self.error_ is not None and name not in self.variables:
            raise self.error_
        return self.variables[name]

    def set_var(self, name: Any, value: Any) -> None:
        self.variables[name] = value

    def get_meta_info(self, name: Any, timeout: float | None = None) -> Any:
        if name in self.variable_event and not self.variable_event[name].wait(timeout):
            raise TimeoutError(f"timed out waiting for variable {name!r}")
        return self.meta_info.get(name)

    def text(self) -> str:
        self.sync()
        return self.text_

    def messages(self) -> list[dict[str, Any]]:
        self.sync()
        return self.messages_

    def error(self) -> BaseException | None:
        if self.use_thread:
            self.queue.join()
        return self.error_

    def fork(self, size: int = 1) -> list["StreamExecutor"]:
        size = int(size)
        self.sync()  # the branches copy the text, so everything before the fork must have run
        if size > 1 and self.text_:
            # Prefill the shared prefix once so every branch hits the cache instead of racing to fill it.
            self.submit(SglCommitLazy())
            self.sync()
        children = []
        for _ in range(size):
            child = StreamExecutor(self.backend, self.arguments, self.default_params, self.chat_template,
                                   self.stream, trace=self.trace)
            child.variables = dict(self.variables)
            child.text_ = self.text_
            child.messages_ = list(self.messages_)
            child.cur_role = self.cur_role
            child.cur_role_begin_pos = self.cur_role_begin_pos
            child.fork_start_text_pos = len(self.text_)
            children.append(child)
        if self.trace is not None:
            with self.trace.call(self, "fork") as rec:
                rec.children = [child.sid for child in children]
                for child in children:
                    self.trace.add_state(child, parent=self.sid, fork_pos=len(self.text_))
        return children

    # ---- worker -------------------------------------------------------------------------------
    def _worker_loop(self) -> None:
        while True:
            item = self.queue.get()
            if item is None:
                self.queue.task_done()
                break
            expr, origin = item
            try:
                self._execute(expr)
            except BaseException as e:  # noqa: BLE001 - every failure must reach the caller
                self._fail(annotate(e, origin))
                break
            self.queue.task_done()
            if self.stream_text_event is not None:
                self.stream_text_event.set()
        self.is_finished = True
        if self.stream_text_event is not None:
            self.stream_text_event.set()

    def _fail(self, error: BaseException) -> None:
        with self._lock:
            self.error_ = error
            self._worker_failed = True
            self.queue.task_done()  # the failed item
            while True:  # nothing after the failure runs; release anyone waiting in sync()
                try:
                    self.queue.get_nowait()
                except queue.Empty:
                    break
                self.queue.task_done()
        for event in [*self.variable_event.values(), *self.stream_var_event.values()]:
            event.set()

    def _var_done(self, name: Any) -> None:
        with self._lock:
            left = self._pending.get(name, 0) - 1
            if left > 0:
                self._pending[name] = left
                return
            self._pending.pop(name, None)
            event = self.variable_event.get(name)
        if event is not None:
            event.set()
        self._var_progress(name)

    def _var_progress(self, name: Any) -> None:
        event = self.stream_var_event.get(name)
        if event is not None:
            event.set()

    # ---- trace --------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _recorded(self, kind: str, name: Any = None) -> Any:
        """The call's trace record (None when this run is not traced) while it executes."""
        if self.trace is None:
            yield None
            return
        with self.trace.call(self, kind, name) as rec:
            self._call = rec
            try:
                yield rec
            finally:
                self._call = None

    def note_usage(self, meta_info: Any) -> None:
        """A backend reports the token counts of a request it made for the current call (select's prefill)."""
        if self._call is not None:
            self._call.usage.update(usage_of(meta_info))

    # ---- execution ----------------------------------------------------------------------------
    def _execute(self, expr: SglExpr | str) -> None:
        if isinstance(expr, str):
            expr = SglConstantText(expr)
        handler = _HANDLERS.get(type(expr))
        if handler is None:
            raise TypeError(f"cannot append {type(expr).__name__} to a program")
        handler(self, expr)

    def _execute_list(self, expr: SglExprList) -> None:
        for sub in expr.expr_list:
            self._execute(sub)

    def _execute_constant(self, expr: SglConstantText) -> None:
        self._fill(expr.value)

    def _fill(self, value: Any) -> None:
        self.text_ += str(value)

    def resolve_params(self, override: GenParams) -> GenParams:
        params = self.default_params.merged_with(override, self.chat_template.stop_str).with_dtype_applied()
        # Validate here, with the same rules the server applies, so the error names the program line.
        SamplingParams.from_dict(params.to_native_sampling_params())
        return params

    def _execute_gen(self, expr: SglGen) -> None:
        with self._recorded("gen", expr.name):
            self._gen(expr)

    def _gen(self, expr: SglGen) -> None:
        params = self.resolve_params(expr.sampling_params)
        name = expr.name
        if not self.stream:
            comp, meta_info = self.backend.generate(self, params)
            self.note_usage(meta_info)
            self.text_ += comp[0] if isinstance(comp, list) else comp
            self.variables[name] = comp
            self.meta_info[name] = meta_info
            self._var_done(name)
            return
        self.variables[name] = ""
        self._var_progress(name)
        for chunk, meta_info in self.backend.generate_stream(self, params):
            self.text_ += chunk
            self.variables[name] += chunk
            self.meta_info[name] = meta_info
            self._var_progress(name)
            self.stream_text_event.set()
        self.note_usage(self.meta_info.get(name))
        self._var_done(name)

    def _execute_select(self, expr: SglSelect) -> None:
        with self._recorded("select", expr.name) as rec:
            decision = self.backend.select(self, expr.choices, expr.temperature, expr.choices_method)
            self.text_ += decision.decision
            if rec is not None:  # the usage is its prefix prefill's, whose finish says nothing about the select
                rec.usage.pop("finish", None)
                rec.usage.pop("completion_tokens", None)
        if expr.name is not None:
            self.variables[expr.name] = decision.decision
            self.meta_info[expr.name] = decision.meta_info
            self._var_done(expr.name)

    def _execute_role_begin(self, expr: SglRoleBegin) -> None:
        if self.cur_role is not None:
            raise ValueError(f"role {expr.role!r} opened inside role {self.cur_role!r}; roles do not nest")
        default_system = self.chat_template.default_system_prompt
        if not self.messages_ and expr.role != "system" and default_system:
            self._execute_role_begin(SglRoleBegin("system"))
            self._fill(default_system)
            self._execute_role_end(SglRoleEnd("system"))
        prefix, _ = self.chat_template.get_prefix_and_suffix(expr.role, self.messages_)
        self.cur_role = expr.role
        self._fill(prefix)
        self.cur_role_begin_pos = len(self.text_)

    def _execute_role_end(self, expr: SglRoleEnd) -> None:
        if self.cur_role != expr.role:
            raise ValueError(f"role {expr.role!r} ended but the open role is {self.cur_role!r}")
        content = self.text_[self.cur_role_begin_pos:].lstrip()
        _, suffix = self.chat_template.get_prefix_and_suffix(expr.role, self.messages_)
        self._fill(suffix)
        self.messages_.append({"role": expr.role, "content": content})
        self.cur_role = None

    def _execute_var_scope_begin(self, expr: SglVarScopeBegin) -> None:
        self.variables[expr.name] = len(self.text_)

    def _execute_var_scope_end(self, expr: SglVarScopeEnd) -> None:
        self.variables[expr.name] = self.text_[self.variables[expr.name]:]
        self._var_done(expr.name)

    def _execute_commit(self, expr: SglCommitLazy) -> None:
        with self._recorded("commit"):
            self.backend.commit_lazy_operations(self)

    def _execute_concat(self, expr: SglConcateAndAppend) -> None:
        children = [state.stream_executor for state in expr.states]
        use_kv = self.backend.support_concate_and_append
        if use_kv:
            for child in children:
                child.submit(SglCommitLazy())
        for child in children:
            child.sync()
            if use_kv and child.fork_start_text_pos != len(self.text_):
                raise ValueError("concate_and_append needs every branch forked from this state's current text")
        with self._recorded("join") as rec:
            if rec is not None:
                rec.children = [child.sid for child in children]
            self.text_ += "".join(child.text_[child.fork_start_text_pos:] for child in children)
            if use_kv:
                self.backend.concatenate_and_append([child.sid for child in children], self.sid)

    def _execute_argument(self, expr: SglArgument) -> None:
        self._fill(expr)  # only while tracing: str() of a placeholder stops the trace


_HANDLERS = {
    SglExprList: StreamExecutor._execute_list,
    SglConstantText: StreamExecutor._execute_constant,
    SglGen: StreamExecutor._execute_gen,
    SglSelect: StreamExecutor._execute_select,
    SglRoleBegin: StreamExecutor._execute_role_begin,
    SglRoleEnd: StreamExecutor._execute_role_end,
    SglVarScopeBegin: StreamExecutor._execute_var_scope_begin,
    SglVarScopeEnd: StreamExecutor._execute_var_scope_end,
    SglCommitLazy: StreamExecutor._execute_commit,
    SglConcateAndAppend: StreamExecutor._execute_concat,
    SglArgument: StreamExecutor._execute_argument,
}
