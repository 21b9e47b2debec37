"""The one interface every frontend backend implements (in-process engine, native HTTP, OpenAI).

Runs in the user's process. The interpreter calls these methods from a program's worker thread, so
a backend must tolerate calls from many threads at once (run_batch runs one worker per program).
Each call receives the program's StreamExecutor `s`; backends read `s.text_` (the prompt so far),
`s.messages_` and `s.cur_role`, and never modify it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, Iterator

from radixlm.lang.chat_template import ChatTemplate, get_chat_template

if TYPE_CHECKING:
    from radixlm.lang.choices import ChoicesDecision, ChoicesSamplingMethod
    from radixlm.lang.interpreter import StreamExecutor
    from radixlm.lang.params import GenParams


class BaseBackend(ABC):
    # True when the backend can join forked KV caches server-side (join("concate_and_append")).
    support_concate_and_append: bool = False
    is_chat_model: bool = False

    def __init__(self) -> None:
        self.chat_template: ChatTemplate = get_chat_template("default")

    def get_model_name(self) -> str:
        return "unknown"

    def get_chat_template(self) -> ChatTemplate:
        return self.chat_template

    # ---- model calls --------------------------------------------------------------------------
    @abstractmethod
    def generate(self, s: "StreamExecutor", params: "GenParams") -> tuple[str | list[str], dict[str, Any]]:
        """Continue `s.text_`; returns the completion (a list when n > 1) and its meta_info."""

    @abstractmethod
    def generate_stream(self, s: "StreamExecutor", params: "GenParams") -> Iterator[tuple[str, dict[str, Any]]]:
        """Like generate, yielding (new text, meta_info so far) pieces in order."""

    @abstractmethod
    def select(self, s: "StreamExecutor", choices: list[str], temperature: float,
               choices_method: "ChoicesSamplingMethod") -> "ChoicesDecision":
        """Pick the choice that best continues `s.text_`."""

    # ---- cache management (optional) ----------------------------------------------------------
    def cache_prefix(self, prefix: str) -> None:
        """Prefill `prefix` so later requests sharing it hit the cache (run_batch warm-up)."""

    def commit_lazy_operations(self, s: "StreamExecutor") -> None:
        """Prefill `s.text_` before a fork, so the branches share its cache."""

    def concatenate_and_append(self, src_rids: list[str], dst_rid: str) -> None:
        raise NotImplementedError(f"{type(self).__name__} cannot concatenate KV caches")

    def end_program(self, s: "StreamExecutor") -> None:
        """A program state finished; release anything held for it."""

    def flush_cache(self) -> Any:
        return None

    def get_server_info(self) -> dict[str, Any] | None:
        return None

    # ---- program traces (radixlm/trace) ------------------------------------------------------------
    def can_publish_traces(self) -> bool:
        """Whether publish_trace can post a trace to a server's /dashboard/programs."""
        return False

    def publish_trace(self, trace: Any) -> dict[str, Any]:
        raise NotImplementedError(f"{type(self).__name__} has no server to post a trace to; "
                                  "use state.save_trace('run.html')")

    def shutdown(self) -> None:
        """Release the backend's resources (a launched server, an HTTP client)."""
