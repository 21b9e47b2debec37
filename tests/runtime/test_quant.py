"""CPU weight quantization (runtime/model/quant): kernels vs dequantized references, the Engine in each
mode, GGUF 4-bit blocks read exactly, capability dispatch (the AVX2 path forced in a subprocess)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from radixlm.runtime.engine import Engine
from radixlm.runtime.model.quant.apply import resolve_quantization
from radixlm.runtime.model.quant.cpu_caps import CpuCaps
from radixlm.runtime.model.quant.kernels import (
    DENSE_MIN_ROWS, GEMV_MAX_ROWS, GROUP, dequantize, int4_qparams, pack_int4, quant_linear, quantize_int4, quantize_int8,
    with_dense,
)
from radixlm.runtime.model.quant.setup import resolve_cpu_dtype
from radixlm.runtime.model.weight_layout import apply_weight_layout, packed_available

BF16_EPS = 2.0 ** -8  # relative rounding of a bf16 value


def _bf16(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.bfloat16).float()


@pytest.mark.parametrize("rows", [1, 5, 64])
@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_quant_linear_matches_dequantized_reference(kind, rows):
    g = torch.Generator().manual_seed(rows)
    w, x = torch.randn(96, 128, generator=g) * 0.05, torch.randn(rows, 128, generator=g)
    bias = torch.randn(96, generator=g)
    q = quantize_int8(w, torch.bfloat16) if kind == "int8" else quantize_int4(w, torch.bfloat16)
    y = quant_linear(x, q, bias)
    assert y.dtype == torch.float32 and y.shape == (rows, 96)
    # The kernel multiplies bf16-rounded activations by the dequantized weight and rounds its output to
    # bf16: against that reference only the output rounding (and fp32 summation order) remains.
    ref = F.linear(_bf16(x), dequantize(q))
    torch.testing.assert_close(y - bias, ref, rtol=2 * BF16_EPS, atol=1e-3)
    # Against the fp32 weight: each |w - w_q| is at most half a quantization step, so each output moves by
    # at most sum_k |x_k| * step_k / 2 (plus the bf16 roundings above).
    if kind == "int8":
        step = (w.abs().amax(1) / 127)[None, :].expand(rows, -1) * _bf16(x).abs().sum(1, keepdim=True)
    else:
        lo, hi = (f(w.view(96, -1, GROUP), -1) for f in (torch.amin, torch.amax))
        step = _bf16(x).abs().view(rows, -1, GROUP).sum(-1) @ ((hi - lo) / 15).t()
    exact = F.linear(x, w)
    assert bool(((y - bias - exact).abs() <= step / 2 + 2 * BF16_EPS * exact.abs() + 1e-3).all())


@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_dense_copy_serves_many_row_steps_with_the_same_values(kind):
    g = torch.Generator().manual_seed(11)
    w = torch.randn(96, 128, generator=g) * 0.05
    q = quantize_int8(w, torch.bfloat16) if kind == "int8" else quantize_int4(w, torch.bfloat16)
    qd = with_dense(q)
    ref_w = dequantize(q)
    # The copy holds the dequantized weight, rounded to bf16.
    torch.testing.assert_close(qd.dense.float(), ref_w, rtol=BF16_EPS, atol=1e-6)
    assert qd.nbytes() == q.nbytes() + qd.dense.nbytes
    for rows in (1, DENSE_MIN_ROWS - 1, DENSE_MIN_ROWS, 64):
        x = torch.randn(rows, 128, generator=g)
        y = quant_linear(x, qd)
        if rows < DENSE_MIN_ROWS:  # few rows: the weight-only kernel, exactly as without the copy
            assert torch.equal(y, quant_linear(x, q))
        # Either path: bf16 activations times the dequantized weight, up to bf16 roundings of the
        # weight copy and the output.
        bound = 3 * BF16_EPS * (_bf16(x).abs() @ ref_w.abs().t()) + 1e-4
        assert bool(((y - F.linear(_bf16(x), ref_w)).abs() <= bound).all())


@pytest.mark.parametrize("isa", ["native", "avx2"])
def test_int8_few_row_steps_run_the_compiled_gemv_in_fp32(isa):
    """With the compiled ops, int8 steps of <= GEMV_MAX_ROWS rows multiply fp32 activations by the int8
    values and their fp32 scales (no bf16 rounding anywhere); more rows take torch's kernel as before."""
    from radixlm.kernels import cpu as cpu_ops

    ops = cpu_ops.load(isa)
    if ops is None:
        pytest.skip("the compiled CPU ops are not available here")
    g = torch.Generator().manual_seed(5)  # 144 inputs: torch's int8 kernel crashes unless a multiple of 16
    w, bias = torch.randn(96, 144, generator=g) * 0.05, torch.randn(96, generator=g)
    plain, tiled = quantize_int8(w, torch.bfloat16), quantize_int8(w, torch.bfloat16, ops)
    assert torch.equal(tiled.qweight, plain.qweight) and tiled.nbytes() > plain.nbytes()
    exact_w = tiled.qweight.float() * tiled.tiles.scales[:, None]
    for rows in (1, GEMV_MAX_ROWS, GEMV_MAX_ROWS + 1):
        x = torch.randn(rows, 144, generator=g)
        y = quant_linear(x, tiled, bias)
        if rows <= GEMV_MAX_ROWS:
            torch.testing.assert_close(y, F.linear(x, exact_w, bias), rtol=1e-5, atol=1e-5)
            assert torch.equal(quant_linear(x.view(rows, 1, 144), tiled, bias), y.view(rows, 1, 96))
        else:
            assert torch.equal(y, quant_linear(x, plain, bias))


def test_int4_kernel_computes_q_minus_8_times_scale_plus_zero():
    w = torch.randn(64, 96, generator=torch.Generator().manual_seed(3))
    q, scale, zero = int4_qparams(w)
    expect = (q.float() - 8) * scale.repeat_interleave(GROUP, 1) + zero.repeat_interleave(GROUP, 1)
    got = dequantize(quantize_int4(w, torch.float32))
    torch.testing.assert_close(got, expect, rtol=1e-5, atol=1e-5)


def test_bad_quantization_options_are_clear():
    cpu = torch.device("cpu")
    with pytest.raises(ValueError, match="quantization must be one of auto, none, int8, int4, gguf; got 'fp8'"):
        resolve_quantization("fp8", cpu, 1, False)
    with pytest.raises(ValueError, match="CPU only"):
        resolve_quantization("int8", torch.device("cuda"), 1, False)
    with pytest.raises(ValueError, match="tp_size"):
        resolve_quantization("int4", cpu, 2, False)
    with pytest.raises(ValueError, match="not a GGUF file"):
        resolve_quantization("gguf", cpu, 1, False)
    assert resolve_quantization("auto", torch.device("cuda"), 1, True) == "none"
    assert resolve_quantization("auto", cpu, 1, True) == "gguf"
    assert resolve_quantization("auto", cpu, 2 - 1, False) == "none"


def test_engine_rejects_unknown_quantization(tiny_llama_dir):
    with pytest.raises(ValueError, match="quantization must be one of"):
        Engine(str(tiny_llama_dir), quantization="fp8", max_total_tokens=256)


def test_bf16_falls_back_to_fp32_without_native_bf16(caplog):
    avx2 = CpuCaps("AVX2", frozenset({"avx2", "fma"}))
    with caplog.at_level(logging.WARNING):
        assert resolve_cpu_dtype(torch.bfloat16, "bfloat16", avx2) == torch.float32
    assert "no native bf16" in caplog.text
    native = CpuCaps("AVX512", frozenset({"avx512f", "avx512_bf16"}))
    assert resolve_cpu_dtype(torch.bfloat16, "bfloat16", native) == torch.bfloat16
    # AVX512-BF16 in the flags, but torch dispatching to its AVX2 kernels (ATEN_CPU_CAPABILITY): not native.
    assert not CpuCaps("AVX2", frozenset({"avx512_bf16"})).native_bf16


@pytest.mark.parametrize("mode,dtype", [("int8", "float32"), ("int4", "float32"), ("int8", "bfloat16"),
                                        ("none", "bfloat16")])
def test_engine_generates_in_each_mode(tiny_qwen2_dir, mode, dtype):
    # qwen2: q/k/v biases on top of the quantized fused weight.
    with Engine(str(tiny_qwen2_dir), quantization=mode, dtype=dtype, max_total_tokens=512) as engine:
        info = engine.get_server_info()
        assert info["quantization"] == mode
        out = engine.generate(["Hello there", "A radix tree"], {"max_new_tokens": 6, "temperature": 0})
        assert all(len(r["output_ids"]) == 6 for r in out)
        engine.check_integrity()


def test_gguf_4bit_blocks_load_exactly_as_int4(tmp_path):
    from gguf import GGMLQuantizationType as Q

    from radixlm.runtime.model.gguf_loader import convert_gguf
    from radixlm.runtime.model.quant.gguf_source import read_int4_blocks
    from radixlm.testing import build_tiny_model
    from safetensors.numpy import load_file
    from tests.runtime.test_gguf_loader import _random_blocks, write_gguf

    src = build_tiny_model(tmp_path / "src", "llama", hidden_size=256, intermediate_size=256)
    q4k = _random_blocks(np.random.default_rng(0), 256, 144, [0, 2])  # real q4_K blocks: [256 out, 256 in]
    types = {"q_proj": Q.Q4_0, "k_proj": Q.Q4_1, "v_proj": Q.Q4_0, "o_proj": Q.Q8_0}
    path = write_gguf(src, tmp_path / "m.gguf", "llama", raw={"blk.0.ffn_up.weight": (q4k, Q.Q4_K)},
                      qtype=lambda name, w: next((t for k, t in types.items() if k in name), Q.Q4_0))
    hf = convert_gguf(path, tmp_path / "hf", progress=False)  # the fp32 dequantization by the gguf package
    dense = {k: torch.from_numpy(v) for k, v in load_file(str(hf / "model.safetensors")).items()}
    from transformers import AutoConfig

    blocks = read_int4_blocks(path, AutoConfig.from_pretrained(hf))
    assert "model.layers.0.self_attn.o_proj.weight" not in blocks  # q8_0: not 4-bit
    for name in ("model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight",
                 "model.layers.0.mlp.up_proj.weight", "model.layers.1.mlp.down_proj.weight"):
        w = dequantize(pack_int4(*blocks[name], torch.float32))
        torch.testing.assert_close(w, dense[name], rtol=1e-5, atol=1e-6)  # the same values (q/k unpermuted)


def test_int4_on_a_4bit_gguf_takes_the_blocks(tmp_path, caplog, monkeypatch):
    monkeypatch.setenv("RADIXLM_CACHE_DIR", str(tmp_path / "cache"))  # the GGUF's conversion goes there
    from gguf import GGMLQuantizationType as Q

    from radixlm.testing import build_tiny_model
    from tests.runtime.test_gguf_loader import write_gguf

    src = build_tiny_model(tmp_path / "src", "llama")
    path = write_gguf(src, tmp_path / "m.gguf", "llama", qtype=lambda name, w: Q.Q4_0)
    with caplog.at_level(logging.INFO, logger="radixlm.runtime.model.quant.setup"):
        with Engine(str(path), max_total_tokens=256, quantization="int4") as engine:
            assert engine.get_server_info()["quantization"] == "int4"
            out = engine.generate("Hello", {"max_new_tokens": 4, "temperature": 0})
            assert len(out["output_ids"]) == 4
            engine.check_integrity()
    assert "taken from the GGUF's 4-bit blocks" in caplog.text


_AVX2_CHECK = """
import json, sys, torch, torch.nn.functional as F
from radixlm.runtime.engine import Engine
from radixlm.runtime.model.quant.cpu_caps import cpu_caps
from radixlm.runtime.model.quant.kernels import dequantize, quant_linear, quantize_int4, quantize_int8
x, w = torch.randn(3, 128), torch.randn(64, 128) * 0.05
errs = {}
for name, q in (("int8", quantize_int8(w, torch.bfloat16)), ("int4", quantize_int4(w, torch.bfloat16))):
    ref = F.linear(x.to(torch.bfloat16).float(), dequantize(q))
    errs[name] = float(((quant_linear(x, q) - ref).abs() / (ref.abs() + 1e-2)).max())
with Engine(sys.argv[1], dtype="bfloat16", quantization="int8", max_total_tokens=256) as e:
    n = len(e.generate("Hello", {"max_new_tokens": 4, "temperature": 0})["output_ids"])
    e.check_integrity()
    info = e.get_server_info()
print(json.dumps({"capability": cpu_caps().capability, "native_bf16": cpu_caps().native_bf16, "errs": errs,
                  "dtype": info["dtype"], "quantization": info["quantization"], "tokens": n}))
"""


def test_avx2_path_forced_in_a_subprocess(tiny_llama_dir):
    """ATEN_CPU_CAPABILITY=avx2 makes torch dispatch to its AVX2 kernels, as on the AVX2-only CI machines:
    bf16 falls back to fp32 there and the quantized kernels still agree with their reference."""
    env = dict(os.environ, ATEN_CPU_CAPABILITY="avx2")
    proc = subprocess.run([sys.executable, "-c", _AVX2_CHECK, str(tiny_llama_dir)], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["capability"] == "AVX2" and not got["native_bf16"]
    assert got["dtype"] == "float32" and got["quantization"] == "int8" and got["tokens"] == 4
    assert all(err < 4 * BF16_EPS for err in got["errs"].values()), got["errs"]


def _random_llama(tie: bool):
    """A 30-layer Llama of width 32 (deep enough for int8 to keep 2 layers dense), random normal weights."""
    import transformers

    from radixlm.runtime.model.registry import build_model

    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=30,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                   tie_word_embeddings=tie)
    cfg.architectures = ["LlamaForCausalLM"]
    model = build_model(cfg, 64)
    for p in model.parameters():
        p.data.normal_()
    return model


def test_int8_keeps_the_first_layers_dense():
    from radixlm.runtime.model.quant.apply import dense_first_layers, quantize_model

    assert [dense_first_layers("int8", n) for n in (2, 14, 15, 30, 32)] == [0, 0, 1, 2, 2]
    assert dense_first_layers("int4", 30) == dense_first_layers("none", 30) == 0
    model = _random_llama(tie=False)  # LlamaConfig's default
    x = torch.randn(3, 32)
    want = [F.linear(x, layer.gate_up_weight) for layer in model.layers[:3]]
    quantize_model(model, "int8")
    for i, layer in enumerate(model.layers[:3]):
        dense = i < 2
        assert isinstance(layer.gate_up_weight, torch.nn.Parameter) == dense
        assert isinstance(layer.self_attn.qkv_weight, torch.nn.Parameter) == dense
        got = layer.linear(x, layer.gate_up_weight)
        if dense:
            assert torch.equal(got, want[i])  # untouched: the model dtype's own matmul
        else:
            torch.testing.assert_close(got, want[i], rtol=0.05, atol=0.25)  # int8 weights, bf16 activations


@pytest.mark.skipif(not packed_available(), reason="this torch has no oneDNN prepacked linear")
@pytest.mark.parametrize("tie", [True, False])
@pytest.mark.parametrize("layout", ["packed", "packed_blocks"])
def test_int8_on_the_packed_layout(tie, layout):
    """The packed layouts (oneDNN tensors, not Parameters) under int8: the first layers stay packed, the rest
    and the LM head are quantized from the packed values (an untied head keeps no dense copy)."""
    from radixlm.runtime.model.quant.apply import quantize_model, weight_bytes
    from radixlm.runtime.model.quant.kernels import Int8Weight

    model = _random_llama(tie)
    x = torch.randn(3, 32)
    want = [F.linear(x, layer.gate_up_weight) for layer in model.layers[:3]]
    head = (model.embed_tokens if tie else model.lm_head).data.clone()
    before = weight_bytes(model)
    apply_weight_layout(model, layout, 2)
    if layout == "packed":
        assert weight_bytes(model) == before + (head.nbytes if tie else 0)  # a tied head gets a packed copy
    quantize_model(model, "int8")
    for i, layer in enumerate(model.layers[:3]):
        w = layer.gate_up_weight
        assert getattr(w, "packed", w).is_mkldnn if i < 2 else isinstance(w, Int8Weight)
        x1 = x[:1]  # one row: packed_blocks' blocks view
        torch.testing.assert_close(layer.linear(x1, w), want[i][:1], rtol=0.05, atol=0.25)
        torch.testing.assert_close(layer.linear(x, w), want[i], rtol=0.05, atol=0.25)
    assert model.lm_head is None and isinstance(model.lm_head_matmul, Int8Weight)  # quantized from the packed
    for rows in (x, x[:1]):
        torch.testing.assert_close(model.linear(rows, model.lm_head_matmul), F.linear(rows, head), rtol=0.05,
                                   atol=0.25)


@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_lm_head_is_quantized_in_int8_only(tiny_llama_dir, mode):
    """int8 quantizes the LM head (the tied embedding: the largest matrix a decode step streams), int4
    keeps it dense (measured too sensitive); int8's head holds the fp32 head's values to about half a step."""
    from radixlm.runtime.model.quant.kernels import Int8Weight, dequantize

    with Engine(str(tiny_llama_dir), quantization="none", max_total_tokens=256) as eng:
        model = eng.runner.model
        dense = (model.embed_tokens if model.lm_head is None else model.lm_head).data.float().clone()
    with Engine(str(tiny_llama_dir), quantization=mode, max_total_tokens=256) as eng:
        model = eng.runner.model
        head = model.lm_head_matmul
        assert isinstance(head, Int8Weight) == (mode == "int8")
        if mode == "int8":
            # Half a quantization step, plus the scale's own bf16 rounding (2^-8 relative) times |q| <= 127.
            step = head.scales.float()[:, None]
            assert bool(((dequantize(head) - dense).abs() <= step * (0.5 + 127 / 256) + 1e-6).all())
            h = torch.randn(3, head.shape[1])
            torch.testing.assert_close(model.linear(h, head), F.linear(_bf16(h), dequantize(head)),
                                       rtol=0.02, atol=0.02)
        assert eng.generate("Hi", {"max_new_tokens": 4, "temperature": 0})["meta_info"]["completion_tokens"] == 4
