"""EngineLoop builds the engine on its own thread (one OpenMP pool for all the engine's torch work) and
reports a failed build to the constructing thread."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from radixlm.runtime.engine import Engine
from radixlm.runtime.engine_loop import EngineLoop


class _IdleScheduler:
    running: list = []  # read by the loop's status log each turn
    waiting: list = []

    def has_work(self) -> bool:
        return False

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
