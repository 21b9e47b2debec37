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


def test_gemma3_sliding_window_with_triton_attention(tmp_path, device):
    """Gemma-3 with a 4-token window on its sliding layers, sequences past it: the kernels' window."""
    from radixlm.runtime.engine import Engine
    from radixlm.testing import build_tiny_model

    model_dir = build_tiny_model(tmp_path, arch="gemma3", sliding_window=4)
    expected = hf_greedy_ids(model_dir, PROMPTS, NEW_TOKENS)
    with Engine(str(model_dir), attention_backend="triton", device=str(device), dtype="float32",
                max_total_tokens=512, chunked_prefill_size=8) as engine:
        res = engine.generate(PROMPTS, {"max_new_tokens": NEW_TOKENS, "temperature": 0})
        assert [r["output_ids"] for r in res] == expected
        engine.check_integrity()


def test_greedy_parity_through_decode_graphs(tiny_llama_dir, device):
    """Decode steps replayed through the graph runner's static, padded buffers give the same outputs.

    On CPU the "graph" replays eagerly (EagerGraph): the static-buffer and padding path is what is
    tested; on CUDA the graphs are really captured."""
    from radixlm.runtime.engine import Engine
    from radixlm.runtime.model.cuda_graph import CudaGraph, EagerGraph

    prompts = PROMPTS + ["1 2 3"]  # 4 requests finishing at different steps: buckets 4, 2 and 1 replay
    lengths = [NEW_TOKENS, NEW_TOKENS - 1, NEW_TOKENS - 3, NEW_TOKENS - 2]
    expected = [ids[:n] for ids, n in zip(hf_greedy_ids(tiny_llama_dir, prompts, NEW_TOKENS), lengths)]
    graph_cls = CudaGraph if device.type == "cuda" else EagerGraph
    with Engine(str(tiny_llama_dir), attention_backend="triton", device=str(device), dtype="float32",
                max_total_tokens=512, disable_cuda_graph=True) as engine:
        runner = engine.runner
        engine._loop.call(lambda: runner.capture_decode_graphs(engine.scheduler.kv.table.table, 4, graph_cls))
        assert runner.graphs.buckets == [1, 2, 4]
        replayed: list[int] = []
        replay = runner.graphs.replay
        runner.graphs.replay = lambda ids, *a: replayed.append(int(ids.numel())) or replay(ids, *a)
        params = [{"max_new_tokens": n, "temperature": 0} for n in lengths]
        res = engine.generate(prompts, params)
        assert [r["output_ids"] for r in res] == expected
        assert {4, 3, 2, 1} & set(replayed) and max(replayed) <= 4, replayed
        engine.check_integrity()


def test_graph_buckets():
    from radixlm.runtime.model.cuda_graph import default_buckets

    assert default_buckets(1) == [1]
    assert default_buckets(12) == [1, 2, 4, 8, 12]
    b = default_buckets(160)
    assert b[:4] == [1, 2, 4, 8] and b[-1] == 160 and 64 in b and 80 in b and b == sorted(set(b))


def test_ngram_speculation_with_triton_attention(tiny_llama_dir, device):
    """NGRAM verify steps (extend rows of 1 + k tokens over cached prefixes) through the Triton backend: the
    same greedy ids as without speculation, and a repeat drafted from the cache is mostly accepted."""
    from radixlm.runtime.engine import Engine

    prompts = ["1 2 3 4 1 2 3 4 1 2", "def main():\n    print(1)\ndef main():"]
    params = {"max_new_tokens": 12, "temperature": 0}
    expected = hf_greedy_ids(tiny_llama_dir, prompts, params["max_new_tokens"])
    with Engine(str(tiny_llama_dir), attention_backend="triton", device=str(device), dtype="float32",
                max_total_tokens=512, speculative_algorithm="NGRAM", speculative_num_draft_tokens=4) as engine:
        assert [r["output_ids"] for r in engine.generate(prompts, params)] == expected
        again = engine.generate(prompts, params)  # the first run's outputs are in the cache: drafted
        assert [r["output_ids"] for r in again] == expected
        assert sum(r["meta_info"]["spec_accepted_tokens"] for r in again) >= params["max_new_tokens"]
        engine.check_integrity()


def test_ngram_speculation_through_verify_graphs(tiny_llama_dir, device):
    """Verify steps replayed through the verify graphs' padded rows (width 1 + k; short rows, plain decode
    rows and unused bucket rows padded) give the same greedy ids; on CPU the graphs replay eagerly."""
    from radixlm.runtime.engine import Engine
    from radixlm.runtime.model.cuda_graph import CudaGraph, EagerGraph

    prompts = ["1 2 3 4 1 2 3 4 1 2", "def main():\n    print(1)\ndef main():", "Paris"]
    lengths = [12, 10, 7]
    expected = [ids[:n] for ids, n in zip(hf_greedy_ids(tiny_llama_dir, prompts, max(lengths)), lengths)]
    graph_cls = CudaGraph if device.type == "cuda" else EagerGraph
    with Engine(str(tiny_llama_dir), attention_backend="triton", device=str(device), dtype="float32",
                max_total_tokens=512, disable_cuda_graph=True, speculative_algorithm="NGRAM",
                speculative_num_draft_tokens=4) as engine:
        runner = engine.runner
        engine._loop.call(lambda: runner.capture_verify_graphs(engine.scheduler.kv.table.table, 4, 5, graph_cls))
        assert runner.verify_graphs.buckets == [1, 2, 4]
        replayed: list[tuple[int, int]] = []  # (rows, tokens) of each replayed step
        replay = runner.verify_graphs.replay
        runner.verify_graphs.replay = lambda batch, idx: (replayed.append((len(batch.rows), batch.num_tokens))
                                                          or replay(batch, idx))
        params = [{"max_new_tokens": n, "temperature": 0} for n in lengths]
        assert [r["output_ids"] for r in engine.generate(prompts, params)] == expected
        again = engine.generate(prompts, params)  # drafted from the first run's outputs in the cache
        assert [r["output_ids"] for r in again] == expected
        assert sum(r["meta_info"]["spec_accepted_tokens"] for r in again) >= max(lengths)
        assert any(tokens > rows for rows, tokens in replayed), replayed  # steps with drafts were replayed
        assert {3, 2, 1} & {rows for rows, _ in replayed}, replayed
        engine.check_integrity()
