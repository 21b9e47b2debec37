"""Gemma-3 (text) and Phi-3: the Engine's greedy tokens against transformers' generate on the same fp32 weights."""

from __future__ import annotations

import pytest
import torch

from radixlm.runtime.engine import Engine
from radixlm.runtime.model.model_runner import _context_len
from radixlm.testing import _config, build_tiny_model, hf_greedy_ids

PROMPTS = [
    "Paris",
    "The quick brown fox jumps over the lazy dog. A radix tree",
    "Question: What is two plus two? Answer:",
    '{"name": "Alice", "age"',
    "Once upon a time there was a small language model that loved to answer questions politely. It",
    "def main():\n    print(",
]
NEW_TOKENS = 12


def engine_greedy(model_dir, **options) -> list[list[int]]:
    with Engine(str(model_dir), max_total_tokens=4096, **options) as engine:
        res = engine.generate(PROMPTS, {"max_new_tokens": NEW_TOKENS, "temperature": 0})
        engine.check_integrity()
    return [r["output_ids"] for r in res]


@pytest.fixture(scope="module")
def gemma3_expected(tiny_gemma3_dir) -> list[list[int]]:
    return hf_greedy_ids(tiny_gemma3_dir, PROMPTS, NEW_TOKENS)


@pytest.mark.parametrize("options", [{}, {"chunked_prefill_size": 5}])
def test_gemma3_greedy_matches_transformers(tiny_gemma3_dir, gemma3_expected, options):
    assert len({tuple(ids) for ids in gemma3_expected}) == len(PROMPTS)  # real decisions, not one repeated token
    assert engine_greedy(tiny_gemma3_dir, **options) == gemma3_expected


def test_gemma3_without_compiled_ops(tiny_gemma3_dir, gemma3_expected, monkeypatch):
    monkeypatch.setenv("RADIXLM_CPU_OPS", "0")
    assert engine_greedy(tiny_gemma3_dir) == gemma3_expected


def test_gemma3_scaled_rope_and_logit_softcap(tmp_path):
    """Linear rope scaling on the full-attention layers only, and Gemma-2's final logit softcapping."""
    model_dir = build_tiny_model(tmp_path, arch="gemma3", rope_scaling={"rope_type": "linear", "factor": 4.0},
                                 final_logit_softcapping=0.5, num_hidden_layers=3,
                                 layer_types=["sliding_attention", "full_attention", "sliding_attention"])
    assert engine_greedy(model_dir) == hf_greedy_ids(model_dir, PROMPTS, NEW_TOKENS)


def test_context_is_capped_only_where_the_window_is_not_honoured():
    gemma3 = _config("gemma3", 384, 1, 2, sliding_window=64, max_position_embeddings=512)
    gemma3.architectures = ["Gemma3ForCausalLM"]
    mistral = _config("mistral", 384, 1, 2, sliding_window=64, max_position_embeddings=512)
    mistral.architectures = ["MistralForCausalLM"]
    assert (_context_len(gemma3, None), _context_len(mistral, None)) == (512, 64)


@pytest.fixture(scope="module")
def gemma3_window8_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("gemma3_w8"), arch="gemma3", sliding_window=8,
                            num_hidden_layers=3, layer_types=["sliding_attention", "full_attention",
                                                              "sliding_attention"])


@pytest.mark.parametrize("options", [
    {},
    {"chunked_prefill_size": 5},  # extends whose prefix reaches past the window
    {"disable_radix_cache": True, "max_running_requests": 2},  # decode rows beside prefill rows
    {"cpu_ops": False},  # the SDPA paths instead of the compiled decode attention
])  # fmt: skip
def test_gemma3_sliding_window_past_the_window(gemma3_window8_dir, monkeypatch, options):
    """Window 8, sequences of 20-50 tokens: every attention path must drop the keys that left the window."""
    options = dict(options)
    if not options.pop("cpu_ops", True):
        monkeypatch.setenv("RADIXLM_CPU_OPS", "0")
    prompts = [p * 2 for p in PROMPTS]
    expected = hf_greedy_ids(gemma3_window8_dir, prompts, 20)
    with Engine(str(gemma3_window8_dir), max_total_tokens=4096, **options) as engine:
        assert engine.runner.context_len == 512
        first = engine.generate(prompts, {"max_new_tokens": 20, "temperature": 0})
        again = engine.generate(prompts[:2], {"max_new_tokens": 20, "temperature": 0})  # cached prefixes
        engine.check_integrity()
    assert [r["output_ids"] for r in first] == expected
    assert [r["output_ids"] for r in again] == expected[:2]


def test_gemma3_unsupported_variants_are_refused(tmp_path):
    from radixlm.runtime.model.registry import build_model

    config = _config("gemma3", 384, 1, 2, attn_logit_softcapping=50.0)
    config.architectures = ["Gemma3ForCausalLM"]
    with pytest.raises(ValueError, match="attn_logit_softcapping"):
        build_model(config, 64)


def test_gemma3_norm_matches_transformers_bit_for_bit():
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm

    from radixlm.runtime.model.layers.norm import GemmaRMSNorm

    g = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16):
        ours, ref = GemmaRMSNorm(64, 1e-6), Gemma3RMSNorm(64, 1e-6)
        weight = torch.randn(64, generator=g) * 0.3
        ours.weight.data.copy_(weight)
        ref.weight.data.copy_(weight)
        ours.to(dtype)
        ref.to(dtype)
        for shape in [(1, 64), (37, 64), (5, 3, 64)]:
            x = (torch.randn(*shape, generator=g) * 4).to(dtype)
            with torch.no_grad():
                assert torch.equal(ours(x), ref(x))


@pytest.mark.parametrize("options", [{}, {"chunked_prefill_size": 5}])
def test_phi3_greedy_matches_transformers(tiny_phi3_dir, options):
    expected = hf_greedy_ids(tiny_phi3_dir, PROMPTS, NEW_TOKENS)
    assert engine_greedy(tiny_phi3_dir, **options) == expected


def test_phi3_partial_rotary_and_longrope(tmp_path):
    """Phi-4-mini style: a quarter of each head passes the rotary untouched; longrope's short factors, with
    the context kept within original_max_position_embeddings."""
    rotary_half = 16 * 3 // 4 // 2
    model_dir = build_tiny_model(
        tmp_path, arch="phi3", partial_rotary_factor=0.75, max_position_embeddings=1024,
        original_max_position_embeddings=256,
        rope_scaling={"type": "longrope", "short_factor": [1.0 + 0.3 * i for i in range(rotary_half)],
                      "long_factor": [4.0] * rotary_half})
    with Engine(str(model_dir), max_total_tokens=4096) as engine:
        assert engine.runner.context_len == 256
        assert engine.runner.dims.rotary_dim == 12
    assert engine_greedy(model_dir) == hf_greedy_ids(model_dir, PROMPTS, NEW_TOKENS)
