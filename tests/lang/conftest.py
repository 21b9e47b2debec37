"""Fixtures for frontend tests: a scripted backend (deterministic, records every call)."""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Iterator

import pytest

from radixlm.lang.backend.base import BaseBackend
from radixlm.lang.chat_template import ChatTemplate, get_chat_template
from radixlm.lang.choices import ChoicesDecision, ChoicesSamplingMethod, normalized_logprob
from radixlm.lang.global_config import global_config


def default_reply(prompt: str, params: Any) -> str:
    # Depends only on the prompt, so replies do not depend on thread scheduling.
    return f"<{len(prompt)}>"


class ScriptedBackend(BaseBackend):
    """Replies with `reply(prompt, params)`; select scores come from `logprobs[choice]` (one float per
    token) and, for unconditional scoring, `unconditional[choice]`. Every call is appended to `calls`."""

    def __init__(self, reply: Callable[[str, Any], str] = default_reply, template: str | ChatTemplate = "chatml",
                 logprobs: dict[str, list[float]] | None = None,
                 unconditional: dict[str, list[float | None]] | None = None,
                 chunk_size: int = 1, concat_kv: bool = False):
        super().__init__()
        self.reply = reply
        self.chat_template = template if isinstance(template, ChatTemplate) else get_chat_template(template)
        self.logprobs = logprobs or {}
        self.unconditional = unconditional or {}
        self.chunk_size = chunk_size
        self.support_concate_and_append = concat_kv
        self.calls: list[tuple[str, Any, Any]] = []
        self.lock = threading.Lock()

    def record(self, kind: str, prompt: Any, params: Any = None) -> None:
        with self.lock:
            self.calls.append((kind, prompt, params))

    def kinds(self) -> list[str]:
        return [c[0] for c in self.calls]

    def generate(self, s, params):
        self.record("generate", s.text_, params)
        if params.n and params.n > 1:
            return [self.reply(s.text_, params) + f"#{i}" for i in range(params.n)], {"n": params.n}
        return self.reply(s.text_, params), {"prompt": s.text_}

    def generate_stream(self, s, params) -> Iterator[tuple[str, dict[str, Any]]]:
        self.record("generate_stream", s.text_, params)
        text = self.reply(s.text_, params)
        for i in range(0, len(text), self.chunk_size):
            time.sleep(0.001)
            yield text[i:i + self.chunk_size], {"sent": i + self.chunk_size}

    def select(self, s, choices: list[str], temperature: float, choices_method: ChoicesSamplingMethod) -> ChoicesDecision:
        self.record("select", s.text_, list(choices))
        inputs = [[[lp, 1000 + j, c] for j, lp in enumerate(self.logprobs.get(c, [-1.0]))] for c in choices]
        uncond = None
        if choices_method.requires_unconditional_logprobs:
            uncond = [[[lp, 1000 + j, c] for j, lp in enumerate(self.unconditional[c])] for c in choices]
        return choices_method(choices=choices, normalized_prompt_logprobs=[normalized_logprob(e) for e in inputs],
                              input_token_logprobs=inputs, output_token_logprobs=[[] for _ in choices],
                              unconditional_token_logprobs=uncond)

    def cache_prefix(self, prefix: str) -> None:
        self.record("cache_prefix", prefix)

    def commit_lazy_operations(self, s) -> None:
        self.record("commit", s.text_)

    def concatenate_and_append(self, src_rids: list[str], dst_rid: str) -> None:
        self.record("concatenate_and_append", list(src_rids), dst_rid)


@pytest.fixture
def scripted():
    """Factory for ScriptedBackend; restores the default backend afterwards."""
    saved = global_config.default_backend
    yield ScriptedBackend
    global_config.default_backend = saved


# ---- the real default model (SmolLM2-135M-Instruct), for the `slow` program suite ---------------
@pytest.fixture(scope="session")
def smol_engine():
    """ONE in-process Engine on the default model, shared by every slow frontend test (loading is the
    expensive part; tests that need their own cache numbers take deltas of engine.cache_stats())."""
    from radixlm.runtime.engine import Engine

    engine = Engine(None, max_total_tokens=32768)
    yield engine
    engine.shutdown()


@pytest.fixture(scope="session")
def smol_runtime():
    """A launched radixlm server (`Runtime(...)`) on the default model, or a skip that says why not."""
    import importlib.util

    if importlib.util.find_spec("radixlm.launch_server") is None:
        pytest.skip("HTTP backend: radixlm.launch_server is not importable (server not built)")
    from radixlm.lang.backend.runtime import Runtime

    try:
        # One torch thread: the server's HTTP, tokenizer and detokenizer processes need the other core (with
        # two threads the scheduler is oversubscribed and decodes ~5x slower on a 2-core machine).
        runtime = Runtime(None, log_level="error", launch_timeout=240, num_threads=1)
    except (RuntimeError, TimeoutError, OSError) as e:
        pytest.skip(f"HTTP backend: `python -m radixlm.launch_server` did not start on the default model ({e})")
    yield runtime
    runtime.shutdown()
