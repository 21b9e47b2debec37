"""Per-step CPU thread counts (model_runner.StepThreads): small steps leave the output consumer a core."""

from __future__ import annotations

import pytest
import torch

from radixlm.runtime.config import ModelConfig
from radixlm.runtime.model.model_runner import StepThreads


@pytest.fixture(autouse=True)
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("full,small", [(1, 1), (2, 1), (4, 3), (8, 7), (16, 16)])
def test_default_small_step_threads(full, small):
    t = StepThreads.for_config(ModelConfig(num_threads=full))
    assert (t.full, t.small) == (full, small)


def test_steps_switch_thread_count_by_size():
    t = StepThreads.for_config(ModelConfig(num_threads=2))
    assert torch.get_num_threads() == 2
    t.apply(1)  # one decode row
    assert torch.get_num_threads() == 1
    t.apply(StepThreads.SMALL_STEP_TOKENS - 1)
    assert torch.get_num_threads() == 1
    t.apply(StepThreads.SMALL_STEP_TOKENS)  # a prefill chunk or a large decode batch
    assert torch.get_num_threads() == 2


def test_explicit_and_invalid_values():
    t = StepThreads.for_config(ModelConfig(num_threads=3, small_step_threads=3))
    assert (t.full, t.small) == (3, 3)
    with pytest.raises(ValueError, match="small_step_threads"):
        StepThreads.for_config(ModelConfig(num_threads=2, small_step_threads=0))


def test_blocks_layout_keeps_every_thread_for_small_steps():
    # The blocks layout multiplies row blocks on every thread (weight_layout.py): small steps gain from it.
    t = StepThreads.for_config(ModelConfig(num_threads=2), layout="blocks")
    assert (t.full, t.small) == (2, 2)
