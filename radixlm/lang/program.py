"""SglFunction (what `@function` returns) and how programs run: run, run_batch, trace.

Runs in the user's process. `run` executes one program (its expressions on a worker thread);
`run_batch` runs many, one thread per program, after prefilling the program's constant prefix once
so every item hits the radix cache.
"""

from __future__ import annotations

import inspect
import multiprocessing
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Union

import tqdm

from radixlm.lang.backend.base import BaseBackend
from radixlm.lang.global_config import global_config
from radixlm.lang.interpreter import StreamExecutor
from radixlm.lang.params import RUN_OPTION_NAMES, GenParams
from radixlm.lang.program_trace import TraceRecorder
from radixlm.lang.state import ProgramState

# run(trace=...) / run_batch(trace=...): a path writes the trace's HTML (.json: its JSON) when the run ends;
# True posts it to the server of a RuntimeEndpoint backend (its /dashboard/programs).
TraceOption = Union[str, "os.PathLike[str]", bool, None]


def resolve_backend(backend: Any) -> BaseBackend:
    """The backend to run on: the argument, else the default; a Runtime means its endpoint and a
    radixlm.Engine gets its (shared) in-process backend."""
    backend = backend if backend is not None else global_config.default_backend
    if backend is None:
        raise ValueError("no backend: call radixlm.set_default_backend(...) or pass backend=")
    if hasattr(backend, "endpoint"):
        backend = backend.endpoint
    if isinstance(backend, BaseBackend):
        return backend
    from radixlm.lang.backend.engine import backend_for_engine, looks_like_engine

    if looks_like_engine(backend):
        return backend_for_engine(backend)
    raise TypeError(f"{type(backend).__name__} is not a radixlm backend")


class SglFunction:
    """A program: a Python function whose first parameter `s` is the program state."""

    def __init__(self, func: Callable[..., Any], num_api_spec_tokens: int | None = None,
                 bind_arguments: dict[str, Any] | None = None):
        self.func = func
        # Accepted for SGLang compatibility; radixlm backends do not speculate over chat APIs.
        self.num_api_spec_tokens = num_api_spec_tokens
        self.bind_arguments = bind_arguments or {}
        spec = inspect.getfullargspec(func)
        if not spec.args or spec.args[0] != "s":
            raise TypeError(f'the first argument of program {func.__name__!r} must be "s"')
        self.arg_names = spec.args[1:]
        self.arg_defaults = spec.defaults or ()
        self.__name__ = func.__name__
        self.__doc__ = func.__doc__

    def bind(self, **kwargs: Any) -> "SglFunction":
        unknown = [k for k in kwargs if k not in self.arg_names]
        if unknown:
            raise TypeError(f"program {self.__name__!r} has no arguments {unknown}")
        return SglFunction(self.func, self.num_api_spec_tokens, {**self.bind_arguments, **kwargs})

    def run(self, *args: Any, stream: bool = False, backend: Any = None, **kwargs: Any) -> ProgramState:
        """Run once. Keyword arguments that name a sampling option (any SamplingParams field, or a logprob
        field: lang/params.py) are the defaults of every gen, unless the program itself declares an
        argument of that name; all others are the program's arguments. `trace=` (unless the program has an
        argument of that name): see TraceOption."""
        trace = kwargs.pop("trace", None) if "trace" not in self.arg_names else None
        defaults, program_kwargs = self._split_options(kwargs)
        backend = resolve_backend(backend)
        _check_trace_option(trace, backend, stream)
        state = run_program(self, backend, args, program_kwargs, defaults, stream)
        if not stream:
            apply_trace_option(state, trace, backend)
        return state

    def run_batch(self, batch_kwargs: list[dict[str, Any]] | list[tuple[Any, ...]], *, backend: Any = None,
                  num_threads: int | str = "auto", progress_bar: bool = False, trace: TraceOption = None,
                  **options: Any) -> list[ProgramState]:
        """Run once per item (a dict of arguments, or a tuple in parameter order); results in input order.
        `options`: sampling options, as for run(). Every item records into one trace (each state's
        `trace()` is the whole batch's); `trace=`: see TraceOption."""
        if not isinstance(batch_kwargs, (list, tuple)):
            raise TypeError("run_batch takes a list of argument dicts")
        items = [self._as_kwargs(item) for item in batch_kwargs]
        defaults, unknown = self._split_options(options)
        if unknown:
            raise TypeError(f"run_batch got unknown keyword arguments {sorted(unknown)}")
        backend = resolve_backend(backend)
        _check_trace_option(trace, backend, False)
        states = run_program_batch(self, backend, items, defaults, num_threads, progress_bar)
        if states:
            apply_trace_option(states[0], trace, backend)
        return states

    def _split_options(self, kwargs: dict[str, Any]) -> tuple[GenParams, dict[str, Any]]:
        """(the sampling defaults, the program's own arguments) among run()'s keywords."""
        options = {k: v for k, v in kwargs.items() if k in RUN_OPTION_NAMES and k not in self.arg_names}
        rest = {k: v for k, v in kwargs.items() if k not in options}
        return GenParams.from_options(options), rest

    def _as_kwargs(self, item: Any) -> dict[str, Any]:
        if isinstance(item, dict):
            return item
        if isinstance(item, (list, tuple)) and \
                len(self.arg_names) - len(self.arg_defaults) <= len(item) <= len(self.arg_names):
            return dict(zip(self.arg_names, item))
        raise TypeError(f"run_batch item {item!r} does not match the arguments of {self.__name__!r}")

    def trace(self, *, backend: Any = None, **kwargs: Any):
        """The constant prefix of this program (see radixlm.lang.tracer)."""
        from radixlm.lang.tracer import trace_program

        return trace_program(self, resolve_backend(backend), kwargs)

    def cache(self, backend: Any = None) -> None:
        cache_program(self, resolve_backend(backend))

    def __call__(self, *args: Any, **kwargs: Any) -> ProgramState:
        return self.run(*args, **kwargs)


def _check_trace_option(trace: TraceOption, backend: BaseBackend, stream: bool) -> None:
    if trace is None or trace is False:
        return
    if stream:
        raise ValueError("trace= does not apply to stream=True; call state.save_trace(path) once the stream ends")
    if trace is True and not backend.can_publish_traces():
        raise ValueError(f"trace=True posts the trace to a server, which {type(backend).__name__} has none of; "
                         "pass a file name (trace='run.html') instead")


def apply_trace_option(state: ProgramState, trace: TraceOption, backend: BaseBackend) -> None:
    """After a run: write or post its trace as asked (RuntimeEndpoint(publish_traces=True): always post)."""
    if trace is True or (trace is None and getattr(backend, "publish_traces", False)):
        state.publish_trace()
    elif trace:
        state.save_trace(trace)


def run_program(program: SglFunction, backend: BaseBackend, args: tuple[Any, ...], kwargs: dict[str, Any],
                defaults: GenParams, stream: bool, use_thread: bool = True,
                recorder: TraceRecorder | None = None, item: int | None = None) -> ProgramState:
    """One run; `recorder`: the batch's shared trace (a run of its own gets a new one), `item` its index."""
    kwargs = {**kwargs, **program.bind_arguments}
    own_trace = recorder is None
    if recorder is None:
        recorder = TraceRecorder(program.__name__, backend.get_model_name())
    exe = StreamExecutor(backend, kwargs, defaults, None, stream, program.num_api_spec_tokens, use_thread,
                         trace=recorder)
    recorder.add_state(exe, item=item)
    state = ProgramState(exe)
    if stream:
        threading.Thread(target=_run_in_background, args=(state, program, args, kwargs), daemon=True).start()
        return state
    try:
        state.ret_value = program.func(state, *args, **kwargs)
    finally:
        exe.end()
    try:
        exe.sync()  # surfaces a failure of the last expressions, with their program line
    finally:
        if own_trace:
            recorder.end()  # once the last expression has run
    return state


def _run_in_background(state: ProgramState, program: SglFunction, args: tuple[Any, ...],
                       kwargs: dict[str, Any]) -> None:
    try:
        state.ret_value = program.func(state, *args, **kwargs)
    except BaseException as e:  # noqa: BLE001 - handed to whoever reads the stream
        state.stream_executor.record_error(e)
    finally:
        state.stream_executor.end()


def cache_program(program: SglFunction, backend: BaseBackend) -> None:
    """Prefill the program's constant prefix once, if it is long enough to matter."""
    from radixlm.lang.tracer import extract_prefix_by_tracing

    prefix = extract_prefix_by_tracing(program, backend)
    if prefix and len(prefix) > global_config.min_precache_prefix_chars:
        backend.cache_prefix(prefix)


def run_program_batch(program: SglFunction, backend: BaseBackend, items: list[dict[str, Any]],
                      defaults: GenParams, num_threads: int | str, progress_bar: bool) -> list[ProgramState]:
    if not items:
        return []
    if global_config.enable_precache_with_tracing and len(items) > 1:
        cache_program(program, backend)
    if num_threads == "auto":
        num_threads = max(96, multiprocessing.cpu_count() * 16)
    num_threads = max(1, min(int(num_threads), len(items)))
    pbar = tqdm.tqdm(total=len(items), disable=not progress_bar)
    recorder = TraceRecorder(f"{program.__name__} (run_batch of {len(items)})", backend.get_model_name())

    def one(index: int, item: dict[str, Any]) -> ProgramState:
        state = run_program(program, backend, (), item, defaults, stream=False, recorder=recorder, item=index)
        pbar.update(1)
        return state

    try:
        if num_threads == 1:
            return [one(i, item) for i, item in enumerate(items)]
        with ThreadPoolExecutor(num_threads, thread_name_prefix="radixlm-batch") as pool:
            futures = [pool.submit(one, i, item) for i, item in enumerate(items)]
            return [f.result() for f in futures]
    finally:
        recorder.end()
        pbar.close()
