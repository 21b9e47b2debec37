"""`radixlm chat` on the tiny model: Ctrl-C stops a reply (the request is aborted, the engine is idle) and
the chat goes on; /reset forgets the conversation; Ctrl-C or Ctrl-D at the prompt quits; chat's sampling
defaults include a repetition penalty."""

from __future__ import annotations

import io
from typing import Any, Iterator

import pytest

from radixlm.runtime.chat_repl import run_chat
from radixlm.runtime.cli import CHAT_REPETITION_PENALTY, build_parser
from radixlm.runtime.engine import Engine

LONG = {"max_new_tokens": 400, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def engine(tiny_llama_dir):
    with Engine(str(tiny_llama_dir), max_total_tokens=2048) as eng:
        yield eng


class Recorder:
    """The engine, recording each prompt and the aborts; optionally Ctrl-C inside the stream itself."""

    def __init__(self, engine: Engine, interrupt_after: int | None = None):
        self.engine, self.tokenizer, self.prompts = engine, engine.tokenizer, []
        self.interrupt_after = interrupt_after

    def generate(self, prompt: str, params: dict, stream: bool) -> Iterator[dict[str, Any]]:
        self.prompts.append(prompt)
        chunks = self.engine.generate(prompt, params, stream=True)
        if self.interrupt_after is None:
            return chunks
        return self._interrupting(chunks)

    def _interrupting(self, chunks: Iterator[dict]) -> Iterator[dict]:
        try:
            for i, chunk in enumerate(chunks):
                if i == self.interrupt_after:
                    raise KeyboardInterrupt  # as if SIGINT landed while waiting for the next token
                yield chunk
        finally:
            chunks.close()


class CtrlCOut(io.StringIO):
    """stdout where Ctrl-C arrives on every n-th write (the user stops each looping reply)."""

    def __init__(self, every: int):
        super().__init__()
        self.every, self.writes = every, 0

    def write(self, s: str) -> int:
        self.writes += 1
        if self.writes % self.every == 0:
            raise KeyboardInterrupt
        return super().write(s)


def lines(*items: str | type[BaseException]):
    feed = iter(items)

    def read(_prompt: str) -> str:
        item = next(feed)
        if isinstance(item, type):
            raise item()
        return item

    return read


def assert_idle(engine: Engine) -> None:
    engine.check_integrity()  # idle: no request left, every KV slot free or cached


def test_ctrl_c_during_a_reply_stops_it_and_the_chat_goes_on(engine):
    rec, err = Recorder(engine), io.StringIO()
    out = CtrlCOut(every=5)
    assert run_chat(rec, None, LONG, lines("Tell me a story", "And another", EOFError), out, err) == 0
    assert len(rec.prompts) == 2  # the second turn ran after the first was stopped
    assert err.getvalue().count("[stopped;") == 2, err.getvalue()
    assert rec.prompts[1].count("Tell me a story") == 1  # the stopped reply stays in the conversation
    assert_idle(engine)  # the stopped request was aborted and its KV freed


def test_ctrl_c_while_waiting_for_a_token_stops_the_reply_too(engine):
    rec, err = Recorder(engine, interrupt_after=3), io.StringIO()
    assert run_chat(rec, None, LONG, lines("Hello", KeyboardInterrupt), io.StringIO(), err) == 0
    assert "[stopped;" in err.getvalue()
    assert_idle(engine)


def test_reset_forgets_the_conversation_but_keeps_the_system_prompt(engine):
    rec = Recorder(engine)
    params = {"max_new_tokens": 3, "temperature": 0}
    run_chat(rec, "Be brief.", params, lines("first question", "/reset", "second question", ""), io.StringIO(),
             io.StringIO())
    assert "first question" in rec.prompts[0] and "first question" not in rec.prompts[1]
    assert "Be brief." in rec.prompts[1] and "second question" in rec.prompts[1]


def test_chat_defaults_to_a_repetition_penalty_and_generate_does_not():
    parser = build_parser()
    assert parser.parse_args(["chat"]).repetition_penalty == CHAT_REPETITION_PENALTY > 1.0
    assert parser.parse_args(["chat", "--repetition-penalty", "1.0"]).repetition_penalty == 1.0
    assert parser.parse_args(["generate", "hi"]).repetition_penalty == 1.0
