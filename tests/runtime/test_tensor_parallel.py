"""Tensor parallelism on CPU (gloo, loopback): TP=N greedy outputs and logprobs match TP=1.

Each TP engine spawns N-1 worker processes (a few seconds each to import torch), so the file keeps to
a handful of engines: Llama (kv heads split), Llama with tied embeddings as two "nodes" on loopback, Qwen2 with one kv head (kv heads
replicated, q/k/v bias), the SmolLM2 geometry (9 heads / 3 kv heads: refused at TP=2 with a clear error,
run at TP=3), and the real SmolLM2 config (refused at TP=2).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from radixlm.runtime.engine import Engine
from radixlm.runtime.model.dist_init import free_port
from radixlm.testing import build_tiny_model

PROMPTS = [
    "The quick brown fox jumps over",
    "Paris is the capital of",
    "Question: What is two plus two? Answer:",
    "def main():\n    print(",
    "A radix tree shares every common prefix",
    '{"name": "Alice", "age":',
    "Once upon a time there was a small",
    "1234567890 2024-01-31",
]
PARAMS = {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True}
OPTIONS = {"num_threads": 1, "max_total_tokens": 4096, "max_running_requests": 16}


def _run(engine: Engine) -> list[dict]:
    """Greedy outputs twice: the second round extends the first round's prompts, so it runs prefill on top
    of cached prefixes (the extend-with-prefix attention path) as well as batched decode."""
    first = engine.generate(PROMPTS, PARAMS, return_logprob=True, top_logprobs_num=3)
    longer = [p + o["text"] + " and" for p, o in zip(PROMPTS, first)]
    second = engine.generate(longer, PARAMS, return_logprob=True)
    return first + second


def _assert_same(ref: list[dict], got: list[dict]) -> None:
    for r, g in zip(ref, got, strict=True):
        assert g["output_ids"] == r["output_ids"]
        ref_lp = [e[0] for e in r["meta_info"]["output_token_logprobs"]]
        got_lp = [e[0] for e in g["meta_info"]["output_token_logprobs"]]
        # All-reduce sums partial products in another order: fp32 rounding, nothing more.
        assert got_lp == pytest.approx(ref_lp, abs=1e-4)
    assert [r["meta_info"]["cached_tokens"] for r in ref] == [g["meta_info"]["cached_tokens"] for g in got]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _check_parity(model_dir, tp_size: int) -> None:
    with Engine(str(model_dir), **OPTIONS) as ref_engine:
        ref = _run(ref_engine)
    engine = Engine(str(model_dir), tp_size=tp_size, **OPTIONS)
    workers = list(engine.runner.tp.workers)
    assert len(workers) == tp_size - 1 and all(w.poll() is None for w in workers)
    try:
        got = _run(engine)
        engine.check_integrity()
        assert engine.cache_stats()["cached_tokens"] > 0  # the second round really hit the cache
    finally:
        engine.shutdown()
    _assert_same(ref, got)
    # Shutdown reaps every worker rank: exited cleanly, no process left behind.
    assert [w.returncode for w in workers] == [0] * (tp_size - 1)
    assert not any(_alive(w.pid) for w in workers)


def test_llama_tp2_matches_tp1(tiny_llama_dir):
    # 4 heads / 2 kv heads: each rank holds 2 q heads and 1 kv head; vocab 384 splits 192/192.
    _check_parity(tiny_llama_dir, 2)


def test_two_node_layout_on_loopback(tmp_path):
    """nnodes=2 wired as a second machine would run it: `radixlm serve --node-rank 1` hosts rank 1 only.
    Also covers tied embeddings (the LM head is the vocab-parallel embedding)."""
    model_dir = build_tiny_model(tmp_path / "llama_tied", arch="llama", tie_word_embeddings=True)
    with Engine(str(model_dir), **OPTIONS) as ref_engine:
        ref = _run(ref_engine)
    addr = f"127.0.0.1:{free_port()}"
    node1 = subprocess.Popen([sys.executable, "-m", "radixlm.runtime.cli", "serve", "--model-path", str(model_dir),
                              "--tp-size", "2", "--nnodes", "2", "--node-rank", "1", "--dist-init-addr", addr,
                              "--num-threads", "1"])
    try:
        engine = Engine(str(model_dir), tp_size=2, nnodes=2, node_rank=0, dist_init_addr=addr, **OPTIONS)
        assert engine.runner.tp.workers == []  # rank 1 lives on "the other node"
        try:
            got = _run(engine)
            engine.check_integrity()
        finally:
            engine.shutdown()
        assert node1.wait(timeout=30) == 0  # the shutdown header ends the other node's ranks too
    finally:
        if node1.poll() is None:
            node1.kill()
    _assert_same(ref, got)


def test_qwen2_tp2_replicated_kv_head(tmp_path):
    # One kv head, two ranks: the kv head is replicated; q/k/v biases are split with their heads.
    model_dir = build_tiny_model(tmp_path / "qwen2", arch="qwen2", num_key_value_heads=1)
    _check_parity(model_dir, 2)


@pytest.fixture(scope="module")
def smollm2_geometry(tmp_path_factory):
    """A tiny model with SmolLM2's head layout: 9 heads, 3 kv heads."""
    return build_tiny_model(tmp_path_factory.mktemp("smol"), arch="llama", hidden_size=72,
                            num_attention_heads=9, num_key_value_heads=3, intermediate_size=144)


def _child_pids() -> set[int]:
    me = os.getpid()
    with open(f"/proc/{me}/task/{me}/children") as f:
        return {int(p) for p in f.read().split()}


def test_uneven_heads_refused_before_spawning(smollm2_geometry):
    before = _child_pids()
    with pytest.raises(ValueError, match=r"num_attention_heads=9 is not divisible by tp_size=2") as err:
        Engine(str(smollm2_geometry), tp_size=2, **OPTIONS)
    assert "num_key_value_heads=3" in str(err.value)
    assert _child_pids() == before  # refused at start-up: no worker was started


def test_smollm2_geometry_tp3_matches_tp1(smollm2_geometry):
    # 9 heads / 3 kv heads split three ways: 3 q heads and 1 kv head per rank; intermediate 144 -> 48.
    _check_parity(smollm2_geometry, 3)


def test_real_smollm2_tp2_refused():
    from radixlm.runtime.model.default_model import DEFAULT_MODEL_NAME
    from radixlm.runtime.model.loader import cache_root

    model_dir = cache_root(None) / "models" / DEFAULT_MODEL_NAME
    if not (model_dir / "config.json").is_file():
        pytest.skip("SmolLM2 is not cached on this machine (tests download nothing)")
    with pytest.raises(ValueError, match=r"num_attention_heads=9 is not divisible by tp_size=2"):
        Engine(str(model_dir), tp_size=2, **OPTIONS)


def test_failed_start_leaves_no_worker(tiny_llama_dir):
    before = _child_pids()
    with pytest.raises(ValueError, match="max_total_tokens"):  # fails after the worker has started
        Engine(str(tiny_llama_dir), tp_size=2, **{**OPTIONS, "max_total_tokens": 0})
    assert _child_pids() == before


def test_invalid_layout_options(tiny_llama_dir):
    with pytest.raises(ValueError, match="dist_init_addr"):
        Engine(str(tiny_llama_dir), tp_size=2, nnodes=2, **OPTIONS)
    with pytest.raises(ValueError, match="multiple of nnodes"):
        Engine(str(tiny_llama_dir), tp_size=4, nnodes=3, dist_init_addr="127.0.0.1:1", **OPTIONS)


def test_speculative_ngram_under_tp2(tiny_llama_dir):
    """NGRAM speculation at TP=2: verify rows are extend rows through every rank; greedy output identical
    to TP=1 without speculation, repeated prompts drafted and accepted, no slot leaked by rejected drafts."""
    prompts = ["1 2 3 4 1 2 3 4 1 2", "def main():\n    print(1)\ndef main():"]
    params = {"max_new_tokens": 16, "temperature": 0}
    with Engine(str(tiny_llama_dir), **OPTIONS) as ref_engine:
        want = [r["output_ids"] for r in ref_engine.generate(prompts, params)]
    engine = Engine(str(tiny_llama_dir), tp_size=2, speculative_algorithm="NGRAM", speculative_num_draft_tokens=4,
                    **OPTIONS)
    try:
        first = engine.generate(prompts, params)
        again = engine.generate(prompts, params)  # the first round's outputs are now in the n-gram tables
        engine.check_integrity()
        stats = engine.scheduler.spec.stats
    finally:
        engine.shutdown()
    assert [r["output_ids"] for r in first] == want == [r["output_ids"] for r in again]
    assert stats.num_accepted > 0 and stats.num_emitted > stats.num_verify_rows
