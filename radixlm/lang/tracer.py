"""Tracing: run a program without a model to find the constant prefix every call shares.

Runs in the user's process. The program runs synchronously against a backend that stops the trace
at the first model call, with placeholder arguments that stop it when their value is used; the text
accumulated by then (role prefixes included, rendered with the real chat template) is the prefix.
`run_batch` prefills it once (max_new_tokens 0) so every batch item hits the radix cache.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator

from radixlm.lang.backend.base import BaseBackend
from radixlm.lang.interpreter import StreamExecutor
from radixlm.lang.ir import SglArgument
from radixlm.lang.params import GenParams
from radixlm.lang.state import ProgramState

if TYPE_CHECKING:
    from radixlm.lang.chat_template import ChatTemplate
    from radixlm.lang.choices import ChoicesDecision, ChoicesSamplingMethod
    from radixlm.lang.program import SglFunction


class StopTracing(Exception):
    """The trace reached something that depends on an argument or on the model."""


@dataclass(frozen=True)
class TraceResult:
    prefix: str  # constant text every run of the program starts with
    stopped_at: str  # what ended the trace


class _TracingBackend(BaseBackend):
    """Has the real backend's chat template; any model call ends the trace."""

    def __init__(self, chat_template: "ChatTemplate"):
        super().__init__()
        self.chat_template = chat_template

    def generate(self, s: StreamExecutor, params: GenParams) -> tuple[str, dict[str, Any]]:
        raise StopTracing("gen")

    def generate_stream(self, s: StreamExecutor, params: GenParams) -> Iterator[tuple[str, dict[str, Any]]]:
        raise StopTracing("gen")

    def select(self, s: StreamExecutor, choices: list[str], temperature: float,
               choices_method: "ChoicesSamplingMethod") -> "ChoicesDecision":
        raise StopTracing("select")

    def commit_lazy_operations(self, s: StreamExecutor) -> None:
        raise StopTracing("fork")


def trace_program(program: "SglFunction", backend: BaseBackend, arguments: dict[str, Any] | None = None) -> TraceResult:
    """Trace with the given arguments (missing ones become placeholders)."""
    args: dict[str, Any] = {name: SglArgument(name) for name in program.arg_names}
    args.update(program.bind_arguments)
    args.update(arguments or {})
    exe = StreamExecutor(_TracingBackend(backend.get_chat_template()), args, GenParams(), None,
                         stream=False, use_thread=False)
    state = ProgramState(exe)
    stopped_at = "end"
    try:
        program.func(state, **args)
    except StopTracing as e:
        stopped_at = str(e)
    except Exception as e:  # noqa: BLE001 - placeholders break arbitrary program logic; the prefix still counts
        stopped_at = f"{type(e).__name__}: {e}"
    return TraceResult(prefix=exe.text_, stopped_at=stopped_at)


def extract_prefix_by_tracing(program: "SglFunction", backend: BaseBackend) -> str:
    return trace_program(program, backend).prefix
