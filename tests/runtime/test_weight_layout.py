"""The CPU weight layout (runtime/model/weight_layout.py): applied where chosen, same greedy outputs."""

from __future__ import annotations

import pytest
import torch

from radixlm.runtime.engine import Engine
from radixlm.runtime.model.weight_layout import apply_weight_layout, column_major
from radixlm.testing import hf_greedy_ids

PROMPTS = ["Paris", "The quick brown fox jumps over the lazy dog", "1 2 3 4 5 6 7 8"]


def _is_column_major(w: torch.Tensor) -> bool:
    return w.t().is_contiguous() and not w.is_contiguous()


def test_column_major_keeps_values_and_shape():
    w = torch.randn(7, 5)
    c = column_major(w)
    assert c.shape == w.shape and torch.equal(c, w) and _is_column_major(c)


@pytest.mark.parametrize("layout", ["auto", "row"])
def test_layouts_give_transformers_greedy_outputs(tiny_llama_dir, layout):
    with Engine(str(tiny_llama_dir), weight_layout=layout) as engine:
        model = engine.runner.model
        layer = model.layers[0]
        if layout == "auto":
            assert _is_column_major(layer.self_attn.qkv_weight) and _is_column_major(layer.gate_up_weight)
            assert layer.down_weight.is_contiguous()  # measured faster row-major
            assert model.lm_head_single_row is not None and _is_column_major(model.lm_head_single_row)
        else:
            assert layer.self_attn.qkv_weight.is_contiguous() and model.lm_head_single_row is None
        # One prompt alone (single-row LM head) and several together (row-major LM head).
        single = engine.generate(PROMPTS[0], {"max_new_tokens": 8, "temperature": 0})["output_ids"]
        many = [r["output_ids"] for r in engine.generate(PROMPTS, {"max_new_tokens": 8, "temperature": 0})]
        engine.scheduler.check_integrity()
    expected = hf_greedy_ids(tiny_llama_dir, PROMPTS, 8)
    assert many == expected and single == expected[0]


def test_layout_is_only_for_fp32_cpu_and_validated(tiny_llama_dir):
    with Engine(str(tiny_llama_dir), dtype="bfloat16") as engine:
        assert engine.runner.model.layers[0].gate_up_weight.is_contiguous()
        assert engine.runner.model.lm_head_single_row is None
        model = engine.runner.model
    with pytest.raises(ValueError, match="weight_layout"):
        apply_weight_layout(model, "columns", torch.device("cpu"), torch.float32)
