"""`weight_layout="auto"` takes packed_tiles where the compiled ops and oneDNN are there, and otherwise
measures the layouts on this machine (runtime/model/layout_probe.py) for models big enough to matter; the
model runner takes the layout and small-step thread count."""

from __future__ import annotations

import pytest
import torch

from radixlm.runtime.engine import Engine
from radixlm.runtime.model import layout_probe, model_runner
from radixlm.runtime.model.layout_probe import probe_layout
from radixlm.runtime.model.weight_layout import packed_available, tile_ops


@pytest.fixture
def without_tiles(monkeypatch):
    """The probe as it runs where the compiled ops do not build (it measures)."""
    monkeypatch.setattr(layout_probe, "tile_ops", lambda: None)
    probe_layout.cache_clear()
    yield
    probe_layout.cache_clear()


@pytest.mark.skipif(not packed_available() or tile_ops() is None, reason="needs oneDNN and the compiled ops")
def test_with_the_compiled_ops_auto_takes_packed_tiles_unmeasured(monkeypatch):
    def no_timing(*args):
        raise AssertionError("measured")

    monkeypatch.setattr(layout_probe, "_candidates", no_timing)
    probe_layout.cache_clear()
    try:
        assert probe_layout(512, 1536, 8, 2) == ("packed_tiles", 2)
        assert probe_layout(512, 1536, 8, 1) == ("packed_tiles", 1)
    finally:
        probe_layout.cache_clear()


def test_no_probe_for_a_tiny_model():
    assert probe_layout(64, 128, 2, 2) is None  # a test checkpoint: nothing to gain
    assert probe_layout(64, 128, 2, 1) is None


def test_one_thread_probes_only_with_onednn(without_tiles):
    picked = probe_layout(512, 1536, 8, 1)
    if packed_available():
        assert picked in {("column", 1), ("packed", 1), ("packed_blocks", 1)}
    else:
        assert picked is None  # one thread without oneDNN: the static rule (column)


def test_probe_picks_a_measured_candidate_and_restores_threads(without_tiles):
    before = torch.get_num_threads()
    picked = probe_layout(512, 1536, 8, 2)  # ~90 MB of fp32 weights
    assert picked in {("blocks", 2), ("column", 2), ("column", 1), ("packed", 2), ("packed", 1), ("packed_blocks", 2)}
    assert torch.get_num_threads() == before
    assert probe_layout(512, 1536, 8, 2) == picked  # once per process


@pytest.mark.parametrize("picked", [("column", 1), ("column", 2), ("blocks", 2), ("packed", 2),
                                    ("packed_blocks", 2), ("packed_tiles", 2)])
def test_runner_takes_the_measured_layout(tiny_llama_dir, monkeypatch, picked):
    monkeypatch.setattr(model_runner, "probe_layout", lambda *args: picked)
    with Engine(str(tiny_llama_dir), num_threads=2) as engine:
        assert (engine.runner.layout, engine.runner.threads.small) == picked
        out = engine.generate("Paris", {"max_new_tokens": 4, "temperature": 0})
        assert len(out["output_ids"]) == 4
        engine.check_integrity()


def test_explicit_layout_and_threads_win_over_the_probe(tiny_llama_dir, monkeypatch):
    monkeypatch.setattr(model_runner, "probe_layout", lambda *args: ("column", 1))
    with Engine(str(tiny_llama_dir), num_threads=2, weight_layout="blocks") as engine:
        assert engine.runner.layout == "blocks" and engine.runner.threads.small == 2
    with Engine(str(tiny_llama_dir), num_threads=2, small_step_threads=2) as engine:
        assert (engine.runner.layout, engine.runner.threads.small) == ("column", 2)


def test_quantized_models_keep_every_thread_for_small_steps(tiny_llama_dir, monkeypatch):
    # The probe times fp32 weights; int8's kernels decode faster on every thread.
    monkeypatch.setattr(model_runner, "probe_layout", lambda *args: ("blocks", 1))
    with Engine(str(tiny_llama_dir), num_threads=2, quantization="int8") as engine:
        assert engine.runner.threads.small == 2
