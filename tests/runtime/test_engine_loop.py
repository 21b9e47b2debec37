"""EngineLoop builds the engine on its own thread (one OpenMP pool for all the engine's torch work) and
reports a failed build to the constructing thread."""

from __future__ import annotations

import queue
import threading
from types import SimpleNamespace

import pytest

from radixlm.runtime.engine import Engine
from radixlm.runtime.engine_loop import EngineLoop
from radixlm.runtime.messages import FinishReason, RequestError, TokenOut
from radixlm.runtime.scheduler.transport import QueueTransport


class _IdleScheduler:
    running: list = []  # read by the loop's status log each turn
    waiting: list = []

    def __init__(self) -> None:
        self.settled = 0

    def has_work(self) -> bool:
        return False

    def settle(self) -> None:  # deferred housekeeping: the loop calls it when idle
        self.settled += 1

    def abort_all(self, reason: str) -> list:
        return []


def test_build_runs_on_the_loop_thread_and_calls_too():
    seen = {}

    def build():
        seen["build"] = threading.current_thread()
        return SimpleNamespace(scheduler=_IdleScheduler(), tag="built")

    loop = EngineLoop(build)
    try:
        assert loop.built.tag == "built" and isinstance(loop.scheduler, _IdleScheduler)
        assert seen["build"] is loop.call(threading.current_thread)
        assert seen["build"] is not threading.current_thread()
        assert loop.call(lambda: loop.scheduler.settled) >= 1  # the turn of the first call settled, idle
    finally:
        loop.stop()


def test_a_failed_build_raises_in_the_constructor():
    def build():
        raise ValueError("weight_layout must be one of ...")

    with pytest.raises(ValueError, match="weight_layout"):
        EngineLoop(build)


def test_engine_loads_its_model_on_the_loop_thread(tiny_llama_dir, monkeypatch):
    import radixlm.runtime.engine as engine_module

    real, seen = engine_module.build_scheduler, {}

    def recording_build(config):
        seen["thread"] = threading.current_thread()
        return real(config)

    monkeypatch.setattr(engine_module, "build_scheduler", recording_build)
    with Engine(str(tiny_llama_dir), num_threads=1) as engine:
        assert seen["thread"] is engine._loop.call(threading.current_thread)
        assert seen["thread"] is not threading.current_thread()
        out = engine.generate("Paris", {"max_new_tokens": 3, "temperature": 0})
        assert len(out["output_ids"]) == 3


def _out(rid: str, ids: list[int], finish=None) -> TokenOut:
    return TokenOut(rid=rid, new_ids=ids, prompt_tokens=3, completion_tokens=len(ids), cached_tokens=0,
                    finish=finish)


@pytest.mark.parametrize("at_finish", [False, True])
def test_queue_transport_delivers_per_token_or_at_the_finish(at_finish: bool) -> None:
    """A streaming caller gets each TokenOut as it comes; a caller that takes them at the finish gets them
    all then, in order (and nothing before), while another request's outputs still stream."""
    transport = QueueTransport()
    inbox, other = queue.Queue(), queue.Queue()
    msg = SimpleNamespace(child_rids=["a"])
    transport.submit(msg, inbox, at_finish)
    transport.submit(SimpleNamespace(child_rids=["b"]), other)
    transport.receive(0)
    transport.send_outputs([_out("a", [1]), _out("b", [7])])
    transport.send_outputs([_out("a", [2])])
    assert other.qsize() == 1
    assert inbox.qsize() == (0 if at_finish else 2)
    transport.send_outputs([_out("a", [3], FinishReason("length", length=3))])
    got = [inbox.get_nowait() for _ in range(inbox.qsize())]
    assert [o.new_ids for o in got] == [[1], [2], [3]] and got[-1].finish is not None


def test_queue_transport_hands_over_the_held_outputs_with_an_error() -> None:
    transport = QueueTransport()
    inbox = queue.Queue()
    transport.submit(SimpleNamespace(child_rids=["a"]), inbox, at_finish=True)
    transport.receive(0)
    transport.send_outputs([_out("a", [1])])
    failed = _out("a", [])
    failed.error = RequestError(code="internal_error", message="boom")
    transport.send_outputs([failed])
    assert [o.new_ids for o in (inbox.get_nowait(), inbox.get_nowait())] == [[1], []]
