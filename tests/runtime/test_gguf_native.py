"""A GGUF file runs from its own blocks (quantization=gguf, auto's choice on the CPU): tiny checkpoints written
as GGUFs that mix block types as a Q4_K_M file does, run greedily next to the same file dequantized to fp32
(quantization=none, the reference); nothing is written but the config and tokenizer; the loaded process holds
about the file's size, not an fp32 copy; a type without a kernel is refused by name."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from radixlm.runtime.engine import Engine
from radixlm.testing import build_tiny_model
from tests.runtime.test_gguf_loader import _random_blocks, write_gguf

PROMPTS = ["Hello there", "A radix tree", "The capital of"]


def mixed_types(name: str, w: np.ndarray) -> Q:
    """A Q4_K_M-like mix for the tensors the gguf package can quantize (the K-quants come as raw blocks)."""
    if "v_proj" in name:
        return Q.Q8_0
    if "o_proj" in name or "embed" in name:
        return Q.Q5_0
    return Q.Q4_0 if "gate" in name else Q.Q4_1


def mixed_gguf(tmp_path: Path, arch: str) -> Path:
    src = build_tiny_model(tmp_path / f"{arch}-src", arch, hidden_size=256, intermediate_size=512)
    rng = np.random.default_rng(0)
    raw = {"blk.0.ffn_up.weight": (_random_blocks(rng, 512, 144, [0, 2]), Q.Q4_K),   # [512 out, 256 in]
           "blk.1.ffn_down.weight": (_random_blocks(rng, 256, 420, [208, 418]), Q.Q6_K)}  # [256, 512]
    return write_gguf(src, tmp_path / f"{arch}.gguf", arch, qtype=mixed_types, raw=raw)


def greedy(path: Path, **kwargs) -> tuple[list[list[int]], dict]:
    with Engine(str(path), max_total_tokens=512, **kwargs) as engine:
        out = engine.generate(PROMPTS, {"max_new_tokens": 8, "temperature": 0})
        engine.check_integrity()
        return [r["output_ids"] for r in out], engine.get_server_info()


@pytest.mark.parametrize("arch", ["llama", "qwen2"])  # llama: q/k rows unpermuted; qwen2: q/k/v biases
def test_a_mixed_gguf_runs_from_its_blocks_as_its_dequantized_weights_do(tmp_path, monkeypatch, caplog, arch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("RADIXLM_CACHE_DIR", str(cache))
    path = mixed_gguf(tmp_path, arch)
    with caplog.at_level(logging.INFO, logger="radixlm.runtime.model.memory"):
        blocks, info = greedy(path)
    assert info["quantization"] == "gguf"
    dense, dense_info = greedy(path, quantization="none")
    assert dense_info["quantization"] == "none"
    assert blocks == dense
    assert all(len(ids) == 8 for ids in blocks)
    written = [f for f in (cache / "gguf").rglob("*") if f.is_file()]
    assert written and not [f for f in written if f.suffix == ".safetensors"]  # no fp32 copy, ever
    assert sum(f.stat().st_size for f in written) < path.stat().st_size  # config + tokenizer only
    # The start-up line says what the run takes: the blocks' bytes (about the file), the pool, the RSS.
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("memory:"))
    weights = float(line.split("weights ")[1].split(" MB")[0]) * 1e6
    assert 0.8 * path.stat().st_size < weights < 1.1 * path.stat().st_size
    assert "KV pool" in line and "(512 tokens)" in line and "process RSS" in line


def test_a_type_without_a_kernel_is_refused_by_name(tmp_path, monkeypatch):
    monkeypatch.setenv("RADIXLM_CACHE_DIR", str(tmp_path / "cache"))
    src = build_tiny_model(tmp_path / "src", "llama", hidden_size=256, intermediate_size=512)
    iq4 = _random_blocks(np.random.default_rng(0), 512, 8 * 18, [0])  # IQ4_NL: [512 out, 256 in]
    path = write_gguf(src, tmp_path / "m.gguf", "llama", qtype=lambda n, w: Q.Q8_0,
                      raw={"blk.0.ffn_gate.weight": (iq4, Q.IQ4_NL)})
    with pytest.raises(Exception, match="blk.0.ffn_gate.weight.*type IQ4_NL.*quantization=none"):
        Engine(str(path), max_total_tokens=256)


_RSS_CHECK = """
import json, resource, sys
from pathlib import Path
import torch
from transformers import AutoConfig
from radixlm.kernels import cpu
from radixlm.runtime.model.gguf_loader import prepare_gguf
from radixlm.runtime.model.gguf_model import load_gguf_blocks
from radixlm.runtime.model.registry import build_model
def rss():
    return int(next(l for l in open("/proc/self/status") if l.startswith("VmRSS")).split()[1]) * 1024
cpu.load()
model_dir = prepare_gguf(sys.argv[1], Path(sys.argv[2]))
config = AutoConfig.from_pretrained(model_dir)
with torch.device("meta"):
    build_model(config, 64)  # the imports a first build pulls in are not the weights
before = rss()
model = build_model(config, 64)
load_gguf_blocks(model, Path(sys.argv[1]), config)
x = model.embedding(torch.tensor([1, 2]), model.embed_tokens)
for layer in model.layers:  # touch every weight once, as a forward does
    layer.linear(x[:1], layer.gate_up_weight)
    layer.linear(torch.zeros(1, layer.down_weight.in_features), layer.down_weight)
    layer.linear(x[:1], layer.self_attn.qkv_weight)
    layer.linear(torch.zeros(1, layer.self_attn.o_weight.in_features), layer.self_attn.o_weight)
model.linear(x[:1], model.lm_head_matmul)
print(json.dumps({"grown": rss() - before}))
"""


def test_loading_holds_about_the_files_size_not_an_fp32_copy(tmp_path):
    """In a fresh process: the memory that loading and touching every weight adds is close to the file's
    size, where the fp32 weights would take about 7x (4.5-bit blocks)."""
    src = build_tiny_model(tmp_path / "src", "llama", hidden_size=512, intermediate_size=2048, num_hidden_layers=6)
    path = write_gguf(src, tmp_path / "m.gguf", "llama", qtype=lambda n, w: Q.Q4_0)
    # The machine's cache: its compiled ops are reused (the model's directory is tmp_path / "dir").
    proc = subprocess.run([sys.executable, "-c", _RSS_CHECK, str(path), str(tmp_path / "dir")],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    grown = json.loads(proc.stdout.strip().splitlines()[-1])["grown"]
    size = path.stat().st_size
    fp32 = sum(np.prod(s) for s in _shapes(src)) * 4
    assert fp32 > 6 * size  # the test can tell the two apart
    assert grown < 1.3 * size + (16 << 20), (grown, size)


def _shapes(model_dir: Path) -> list[tuple[int, ...]]:
    from safetensors import safe_open

    with safe_open(str(model_dir / "model.safetensors"), framework="np") as f:
        return [tuple(f.get_slice(k).get_shape()) for k in f.keys()]


def test_a_model_that_cannot_fit_fails_at_start_with_the_numbers(tmp_path, monkeypatch):
    from radixlm.runtime.model import memory

    monkeypatch.setenv("RADIXLM_CACHE_DIR", str(tmp_path / "cache"))
    path = mixed_gguf(tmp_path, "llama")
    monkeypatch.setattr(memory, "available_bytes", lambda: path.stat().st_size)  # less than the weights + room
    with pytest.raises(Exception, match=r"weights need 0\.0 GiB \(gguf, float32\) and this machine has 0\.0 GiB"):
        Engine(str(path), max_total_tokens=256)
    monkeypatch.setattr(memory, "available_bytes", lambda: 4 * path.stat().st_size)
    with pytest.raises(Exception, match="a KV pool of 1000000 tokens needs .* lower --max-total-tokens"):
        Engine(str(path), max_total_tokens=1_000_000)


_HF_PEAK = """
import json, sys
from radixlm.kernels import cpu
from radixlm.runtime.engine import Engine
def status(key):
    return int(next(l for l in open("/proc/self/status") if l.startswith(key)).split()[1]) * 1024
cpu.load()
with Engine(sys.argv[1], dtype="bfloat16", max_total_tokens=64, num_threads=1) as warm:
    pass  # the imports and threads a first engine brings are not the weights
before = status("VmRSS")
with Engine(sys.argv[2], dtype="bfloat16", max_total_tokens=64, num_threads=1) as engine:
    grown = status("VmHWM") - before
    print(json.dumps({"grown": grown, "dtype": engine.get_server_info()["dtype"]}))
"""


def _big_bf16_checkpoint(small: Path, out: Path, layers: int, hidden: int, inter: int) -> int:
    """The small checkpoint's tokenizer with random bf16 weights of a bigger Llama, written tensor by
    tensor; returns the weights' bytes."""
    import shutil

    import torch
    from safetensors.torch import save_file

    shutil.copytree(small, out)
    cfg = json.loads((out / "config.json").read_text())
    cfg.update(hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers, head_dim=hidden // 4,
               tie_word_embeddings=True, torch_dtype="bfloat16", dtype="bfloat16")
    (out / "config.json").write_text(json.dumps(cfg))
    kv = cfg["num_key_value_heads"] * hidden // 4
    shapes = {"model.embed_tokens.weight": (cfg["vocab_size"], hidden), "model.norm.weight": (hidden,)}
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes |= {p + "input_layernorm.weight": (hidden,), p + "post_attention_layernorm.weight": (hidden,),
                   p + "self_attn.q_proj.weight": (hidden, hidden), p + "self_attn.k_proj.weight": (kv, hidden),
                   p + "self_attn.v_proj.weight": (kv, hidden), p + "self_attn.o_proj.weight": (hidden, hidden),
                   p + "mlp.gate_proj.weight": (inter, hidden), p + "mlp.up_proj.weight": (inter, hidden),
                   p + "mlp.down_proj.weight": (hidden, inter)}
    tensors = {name: (torch.randn(shape) * 0.02).to(torch.bfloat16) for name, shape in shapes.items()}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return sum(t.nbytes for t in tensors.values())


def test_a_bf16_checkpoint_streams_into_bf16_weights(tmp_path):
    """dtype=bfloat16 on a CPU that computes it natively: each tensor is cast into its parameter as it is
    read, so loading peaks near the bf16 weights' size, not at an fp32 copy of the model (twice that)."""
    from radixlm.runtime.model.quant.cpu_caps import cpu_caps

    if not cpu_caps().native_bf16:
        pytest.skip("this CPU has no native bf16: dtype=bfloat16 runs float32 here")
    small = build_tiny_model(tmp_path / "small", "llama")
    size = _big_bf16_checkpoint(small, tmp_path / "big", layers=12, hidden=1024, inter=4096)
    # HF directories write nothing to the cache; the machine's compiled ops are reused.
    proc = subprocess.run([sys.executable, "-c", _HF_PEAK, str(small), str(tmp_path / "big")],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["dtype"] == "bfloat16"
    assert got["grown"] < 1.3 * size + (64 << 20), (got["grown"], size)  # an fp32 copy would be 2x size


def test_the_fast_reader_sees_what_the_gguf_package_sees(tmp_path):
    """gguf_file.GGUFFile against gguf.GGUFReader on one file of every layout: names, types, shapes, the
    bytes of every tensor, and the scalar metadata the loader reads."""
    import gguf

    from radixlm.runtime.model.gguf_file import GGUFFile
    from radixlm.runtime.model.gguf_meta import read_field

    src = build_tiny_model(tmp_path / "src", "qwen2", hidden_size=256, intermediate_size=512)
    types = {"q_proj": Q.F16, "k_proj": Q.BF16, "v_proj": Q.Q8_0, "o_proj": Q.Q5_1, "gate": Q.Q4_0}
    path = write_gguf(src, tmp_path / "m.gguf", "qwen2", raw={"blk.0.ffn_up.weight": (
        _random_blocks(np.random.default_rng(0), 512, 144, [0, 2]), Q.Q4_K)},
        qtype=lambda n, w: next((t for k, t in types.items() if k in n), Q.F32))
    fast, ref = GGUFFile(path), gguf.GGUFReader(str(path))
    assert [t.name for t in fast.tensors] == [t.name for t in ref.tensors]
    for a, b in zip(fast.tensors, ref.tensors):
        assert (a.tensor_type, list(a.shape), a.data.shape, a.data.dtype) == (
            b.tensor_type, list(b.shape), b.data.shape, b.data.dtype), a.name
        assert np.array_equal(np.asarray(a.data).view(np.uint8), np.asarray(b.data).view(np.uint8)), a.name
    for key in ("general.architecture", "qwen2.block_count", "qwen2.rope.freq_base", "tokenizer.chat_template",
                "tokenizer.ggml.eos_token_id", "qwen2.attention.layer_norm_rms_epsilon"):
        assert read_field(fast, key) == read_field(ref, key), key
