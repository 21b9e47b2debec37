"""Engine-level greedy parity with transformers when the Triton attention backend is forced.

On CPU the kernels run under TRITON_INTERPRET=1 (set in this folder's conftest), so prompts and
lengths are small; chunked prefill makes extend batches with cached prefixes and mixed decode rows.
"""

from __future__ import annotations

import pytest

from radixlm.testing import hf_greedy_ids

pytest.importorskip("triton")

PROMPTS = ["Paris", "The quick brown fox jumps over the lazy dog.", "Question: What is two plus two? Answer:"]
NEW_TOKENS = 6


def test_greedy_parity_with_triton_attention(tiny_llama_dir, device):
    from radixlm.runtime.engine import Engine

    expected = hf_greedy_ids(tiny_llama_dir, PROMPTS, NEW_TOKENS)
    with Engine(str(tiny_llama_dir), attention_backend="triton", device=str(device), dtype="float32",
                max_total_tokens=512, chunked_prefill_size=8) as engine:
        assert type(engine.runner.backend).__name__ == "TritonAttentionBackend"
        res = engine.generate(PROMPTS, {"max_new_tokens": NEW_TOKENS, "temperature": 0})
        assert [r["output_ids"] for r in res] == expected
        engine.check_integrity()
