"""The model with radixlm's compiled CPU ops (runtime/model/cpu_ops.py) against transformers: greedy outputs
stay token-identical for lone requests (every layer of a one-token step in one call: DecodeStack; or layer by
layer: decode_layer), batched ones (the paged decode attention), radix-cache hits (K/V slots that are not one
ascending run), and with the ops turned off."""

from __future__ import annotations

import shutil

import pytest

from radixlm.kernels.cpu import build
from radixlm.runtime.engine import Engine
from radixlm.runtime.model.llama import DecoderLayer
from radixlm.testing import hf_greedy_ids

needs_compiler = pytest.mark.skipif(shutil.which("g++") is None, reason="no C++ compiler: the ops fall back to torch")

PROMPTS = ["The quick brown fox jumps over the lazy dog. A radix tree",
           "Question: What is two plus two? Answer:", "def main():\n    print("]
NEW = 10


def _greedy(engine: Engine, prompts: list[str]) -> list[list[int]]:
    res = engine.generate(prompts, {"max_new_tokens": NEW, "temperature": 0})
    return [r["output_ids"] for r in res]


class _CountedStack:
    """Stands in for the model's DecodeStack (a TorchScript object, whose methods cannot be patched) and
    counts the steps it serves."""

    def __init__(self, stack) -> None:
        self.stack, self.steps = stack, 0

    def forward(self, *args):
        self.steps += 1
        return self.stack.forward(*args)


@needs_compiler
@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
@pytest.mark.parametrize("layout", ["blocks", "packed", "packed_blocks", "packed_tiles", "row", "column"])
def test_lone_and_batched_requests_match_transformers(request, monkeypatch, arch: str, layout: str) -> None:
    model_dir = request.getfixturevalue(f"tiny_{arch}_dir")
    fused_steps = []
    one_token = DecoderLayer._decode_one_token
    monkeypatch.setattr(DecoderLayer, "_decode_one_token", lambda *a: fused_steps.append(1) or one_token(*a))
    expected = hf_greedy_ids(str(model_dir), PROMPTS, NEW)
    with Engine(str(model_dir), max_total_tokens=4096, weight_layout=layout, num_threads=2) as engine:
        runner = engine.runner
        assert runner.cpu_ops is not None
        model = runner.model
        # Qwen3's q/k norms come before the rotary: its layers keep the module-by-module attention.
        assert (model.layers[0].decode_weights is None) == (arch == "qwen3")
        assert (model.decode_stack is None) == (arch == "qwen3")
        if model.decode_stack is not None:
            model.decode_stack = stack = _CountedStack(model.decode_stack)
            assert [_greedy(engine, [p])[0] for p in PROMPTS] == expected  # one at a time: the stack
            assert stack.steps >= len(PROMPTS) * (NEW - 1) and not fused_steps
            model.decode_stack = None
            engine.flush_cache()
        assert [_greedy(engine, [p])[0] for p in PROMPTS] == expected  # layer by layer: decode_layer
        assert bool(fused_steps) == (arch != "qwen3")
        assert _greedy(engine, PROMPTS) == expected  # batched decode: the paged attention
        # The radix cache now holds the prompts: a hit puts cached slots before fresh ones.
        assert _greedy(engine, [PROMPTS[0] + " and more"])[0] == hf_greedy_ids(str(model_dir), [PROMPTS[0] + " and more"], NEW)[0]
        engine.check_integrity()


@needs_compiler
def test_int8_one_token_steps_run_as_one_op_and_match_the_module_path(tiny_llama_dir, monkeypatch) -> None:
    """int8 layers with the tiled copy go through decode_layer (its int8 GEMV is the one quant_linear runs at
    one row), and give the same tokens as the module-by-module path."""
    fused_steps = []
    one_token = DecoderLayer._decode_one_token
    monkeypatch.setattr(DecoderLayer, "_decode_one_token", lambda *a: fused_steps.append(1) or one_token(*a))
    with Engine(str(tiny_llama_dir), max_total_tokens=4096, quantization="int8", num_threads=2) as engine:
        layers = engine.runner.model.layers
        quantized = [layer for layer in layers if layer.decode_weights is not None and layer.decode_weights.tiled[0]]
        assert quantized and all(s is not None for layer in quantized for s in layer.decode_weights.scales)
        stacked = [_greedy(engine, [p])[0] for p in PROMPTS]
        engine.runner.model.decode_stack = None
        engine.flush_cache()
        fused = [_greedy(engine, [p])[0] for p in PROMPTS]
        assert fused_steps and fused == stacked
        engine.runner.model.decode_stack = None  # it holds the layers' one-row weights too
        for layer in layers:
            layer.decode_weights = None  # the module-by-module path, the same kernels
        engine.flush_cache()
        assert [_greedy(engine, [p])[0] for p in PROMPTS] == fused
        engine.check_integrity()


def test_with_the_ops_off_the_model_keeps_torch(tiny_llama_dir, monkeypatch) -> None:
    monkeypatch.setenv(build.DISABLE_ENV, "0")
    build._load.cache_clear()
    try:
        with Engine(str(tiny_llama_dir), max_total_tokens=4096) as engine:
            assert engine.runner.cpu_ops is None and engine.runner.model.layers[0].decode_weights is None
            assert [_greedy(engine, [p])[0] for p in PROMPTS] == hf_greedy_ids(str(tiny_llama_dir), PROMPTS, NEW)
    finally:
        build._load.cache_clear()


@needs_compiler
def test_batched_decode_over_a_shared_cached_prefix_keeps_the_cascade(tiny_llama_dir, monkeypatch) -> None:
    """Requests decoding together over >= MIN_SHARED_TOKENS cached slots take the cascade path (the prefix
    read once) with the compiled ops on, and still match transformers."""
    from radixlm.runtime.model.layers import attention

    cascades = []
    cascade = attention.cascade_decode
    monkeypatch.setattr(attention, "cascade_decode", lambda *a: cascades.append(1) or cascade(*a))
    prefix = "Once upon a time there was a small language model that loved to answer questions. " * 6
    prompts = [prefix + tail for tail in ("It said", "Then", "The end")]
    with Engine(str(tiny_llama_dir), max_total_tokens=4096) as engine:
        assert engine.runner.cpu_ops is not None
        assert len(engine.tokenizer.encode(prefix)) >= attention.MIN_SHARED_TOKENS
        _greedy(engine, [prefix])  # the prefix now sits in the radix cache
        assert _greedy(engine, prompts) == hf_greedy_ids(str(tiny_llama_dir), prompts, NEW)
    assert cascades


@needs_compiler
@pytest.mark.parametrize("layout", ["packed_tiles", "blocks"])
def test_the_stack_gives_the_same_bits_as_layer_by_layer(tiny_llama_dir, layout: str) -> None:
    """DecodeStack chains decode_layer itself: every logprob of a lone greedy request is the same float."""
    params = {"max_new_tokens": NEW, "temperature": 0}

    def run(engine: Engine) -> list:
        engine.flush_cache()
        res = engine.generate(PROMPTS[0], params, return_logprob=True, top_logprobs_num=3)
        return [res["output_ids"], res["meta_info"]["output_token_logprobs"], res["meta_info"]["output_top_logprobs"]]

    with Engine(str(tiny_llama_dir), max_total_tokens=4096, weight_layout=layout, num_threads=2) as engine:
        model = engine.runner.model
        stack = model.decode_stack
        assert stack is not None and stack.num_layers() == len(model.layers)
        stacked = run(engine)
        model.decode_stack = None
        assert run(engine) == stacked
        engine.check_integrity()
