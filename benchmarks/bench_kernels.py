"""Kernel check for a lent GPU: every radixlm kernel against its torch reference at realistic shapes, then
speed — decode attention's achieved bandwidth against a measured device-to-device copy — and a table last.

Runs as a standalone script (`python benchmarks/bench_kernels.py`, or scripts/gpu_check.sh) on a machine
that has only torch, triton and transformers. `--smoke` runs tiny shapes, on CPU under TRITON_INTERPRET=1
when there is no GPU, so the script itself can be checked anywhere.
"""

from __future__ import annotations

import argparse
import importlib
import math
import os
import sys
import time
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

REPO = Path(__file__).resolve().parents[1]


def _import_kernels() -> types.SimpleNamespace:
    """Import radixlm.kernels.* even where radixlm's own dependencies (msgspec, zmq, ...) are missing:
    the GPU machine has only torch/triton/transformers, and the kernels need nothing else."""
    sys.path.insert(0, str(REPO))
    try:
        import radixlm  # noqa: F401
    except ImportError:  # register the package without running its __init__ (the serving stack)
        pkg = types.ModuleType("radixlm")
        pkg.__path__ = [str(REPO / "radixlm")]
        sys.modules["radixlm"] = pkg
    names = ["decode_attention", "extend_attention", "grammar_mask", "rms_norm", "rotary", "silu_and_mul",
             "store_kv"]
    return types.SimpleNamespace(**{n: importlib.import_module(f"radixlm.kernels.{n}") for n in names})


@dataclass
class Row:
    name: str
    shape: str
    max_err: float = float("nan")
    tol: float = float("nan")
    time_us: float = float("nan")
    gbps: float = float("nan")
    tflops: float = float("nan")

    @property
    def ok(self) -> str:
        return "-" if math.isnan(self.max_err) else ("PASS" if self.max_err <= self.tol else "FAIL")


def bench_us(fn: Callable[[], object], device: torch.device) -> float:
    """Median time of fn in microseconds (CUDA events via triton's do_bench; a host clock on CPU)."""
    if device.type == "cuda":
        import triton.testing

        return 1e3 * triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
    fn()
    start = time.perf_counter()
    fn()
    return 1e6 * (time.perf_counter() - start)


def copy_bandwidth(device: torch.device, num_bytes: int) -> Row:
    src = torch.empty(num_bytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    row = Row("d2d copy (ceiling)", f"{num_bytes / 2**30:.2f} GiB")
    row.time_us = bench_us(lambda: dst.copy_(src), device)
    row.gbps = 2 * num_bytes / row.time_us / 1e3  # bytes read + bytes written
    return row


def err(got: torch.Tensor, want: torch.Tensor) -> float:
    """Largest absolute difference relative to the largest reference value (NaN counts as infinite)."""
    diff = (got.float() - want.float()).abs().nan_to_num(float("inf")).max().item()
    return diff / max(want.float().abs().max().item(), 1e-6)


def paged_kv(num_reqs: int, seq_lens: list[int], num_kv_heads: int, head_dim: int, dtype, device):
    """A KV pool filled with random K/V whose slots are shuffled, plus the req_to_token table."""
    total = sum(seq_lens)
    slots = torch.randperm(total, device=device) + 1  # slot 0: scratch, as in the scheduler
    k_buf = torch.randn(total + 1, num_kv_heads, head_dim, dtype=dtype, device=device)
    v_buf = torch.randn_like(k_buf)
    table = torch.zeros(num_reqs, max(seq_lens), dtype=torch.int32, device=device)
    used = 0
    for r, n in enumerate(seq_lens):
        table[r, :n] = slots[used:used + n].int()
        used += n
    return k_buf, v_buf, table


def check_pointwise(K, dev, dt, s) -> list[Row]:
    """RMSNorm, fused add RMSNorm, rotary, SiLU-and-mul, grammar mask, store KV."""
    rows, dn = [], str(dt).removeprefix("torch.")
    n, hidden, inter, vocab = 4096 // s, 4096 // s, 14336 // s, 128256 // s
    x, res = torch.randn(n, hidden, dtype=dt, device=dev), torch.randn(n, hidden, dtype=dt, device=dev)
    w = torch.randn(hidden, dtype=dt, device=dev)
    row = Row("rms_norm", f"[{n},{hidden}] {dn}")
    row.max_err, row.tol = err(K.rms_norm.rms_norm(x, w, 1e-6), K.rms_norm.rms_norm_reference(x, w, 1e-6)), 1e-2
    row.time_us = bench_us(lambda: K.rms_norm.rms_norm(x, w, 1e-6), dev)
    row.gbps = 2 * x.numel() * x.element_size() / row.time_us / 1e3
    rows.append(row)
    want_out, want_res = K.rms_norm.fused_add_rms_norm_reference(x, res, w, 1e-6)
    got_out, got_res = K.rms_norm.fused_add_rms_norm(x, res.clone(), w, 1e-6)
    rows.append(Row("fused_add_rms_norm", f"[{n},{hidden}] {dn}",
                    max(err(got_out, want_out), err(got_res, want_res)), 1e-2))
    q = torch.randn(n, 32, 128, dtype=dt, device=dev)
    k = torch.randn(n, 8, 128, dtype=dt, device=dev)
    cache = K.rotary.build_cos_sin_cache(K.rotary.compute_inv_freq(128, 500000.0), 8192).to(dev)
    pos = torch.randint(0, 8192, (n,), device=dev)
    want_q, want_k = K.rotary.rotary_reference(q, k, pos, cache)
    K.rotary.apply_rotary_(q, k, pos, cache)
    rows.append(Row("rotary", f"T={n} Hq=32 Hk=8 D=128 {dn}", max(err(q, want_q), err(k, want_k)), 1e-2))
    gate_up = torch.randn(n, 2 * inter, dtype=dt, device=dev)
    row = Row("silu_and_mul", f"[{n},{2 * inter}] {dn}", err(K.silu_and_mul.silu_and_mul(gate_up),
                                                            K.silu_and_mul.silu_and_mul_reference(gate_up)), 1e-2)
    row.time_us = bench_us(lambda: K.silu_and_mul.silu_and_mul(gate_up), dev)
    row.gbps = 1.5 * gate_up.numel() * gate_up.element_size() / row.time_us / 1e3
    rows.append(row)
    logits = torch.randn(64, vocab, device=dev)
    bitmask = torch.randint(-(2**31), 2**31, (64, (vocab + 31) // 32), device=dev, dtype=torch.int64).int()
    want = K.grammar_mask.apply_grammar_bitmask_reference(logits, bitmask)
    K.grammar_mask.apply_grammar_bitmask_(logits, bitmask)
    rows.append(Row("grammar_bitmask", f"[64,{vocab}] fp32", 0.0 if torch.equal(logits, want) else 1.0, 0.0))
    kv = torch.randn(n, 2, 8, 128, dtype=dt, device=dev)
    k_buf = torch.zeros(4 * n, 8, 128, dtype=dt, device=dev)
    v_buf, loc = torch.zeros_like(k_buf), torch.randperm(4 * n, device=dev)[:n]
    want_k, want_v = k_buf.clone(), v_buf.clone()
    K.store_kv.store_kv_reference(kv[:, 0], kv[:, 1], want_k, want_v, loc)
    K.store_kv.store_kv(kv[:, 0], kv[:, 1], k_buf, v_buf, loc)
    rows.append(Row("store_kv", f"T={n} Hk=8 D=128 {dn}", max(err(k_buf, want_k), err(v_buf, want_v)), 0.0))
    return rows


def check_extend(K, dev, dt, s, num_heads: int, num_kv_heads: int, head_dim: int) -> Row:
    prefix = [0, 512 // s, 1000 // s, 2000 // s]
    extend = [1024 // s, 512 // s, 256 // s, 48 // s or 1]
    seq = [p + e for p, e in zip(prefix, extend)]
    k_buf, v_buf, table = paged_kv(4, seq, num_kv_heads, head_dim, dt, dev)
    ext = torch.tensor(extend, device=dev)
    args = (table, torch.arange(4, device=dev), torch.tensor(seq, device=dev), torch.tensor(prefix, device=dev),
            torch.cumsum(ext, 0) - ext)
    q = torch.randn(sum(extend), num_heads, head_dim, dtype=dt, device=dev)
    out = torch.full_like(q, float("nan"))
    scale = head_dim ** -0.5
    row = Row(f"extend_attention Hq={num_heads} Hk={num_kv_heads} D={head_dim}", f"prefix={prefix} ext={extend}")
    K.extend_attention.extend_attention(q, k_buf, v_buf, out, *args, scale)
    row.max_err = err(out, K.extend_attention.extend_attention_reference(q, k_buf, v_buf, *args, scale))
    row.tol = 1e-2
    row.time_us = bench_us(lambda: K.extend_attention.extend_attention(q, k_buf, v_buf, out, *args, scale,
                                                                       max_extend_len=max(extend)), dev)
    # causal work only: QK^T and PV, 2 FLOPs per multiply-add each
    macs = sum(e * (p + (e + 1) / 2) for p, e in zip(prefix, extend)) * num_heads * head_dim
    row.tflops = 4 * macs / row.time_us / 1e6
    return row


def check_decode(K, dev, dt, batch: int, ctx: int, num_heads: int, num_kv_heads: int, head_dim: int,
                 num_sms: int, verify: bool, splits: int | None = None) -> Row:
    seq = [ctx] * batch
    k_buf, v_buf, table = paged_kv(batch, seq, num_kv_heads, head_dim, dt, dev)
    args = (table, torch.arange(batch, device=dev), torch.tensor(seq, device=dev))
    q = torch.randn(batch, num_heads, head_dim, dtype=dt, device=dev)
    out = torch.full_like(q, float("nan"))
    splits = splits or K.decode_attention.default_num_kv_splits(batch, num_kv_heads, num_sms)
    row = Row(f"decode_attention Hq={num_heads} Hk={num_kv_heads} D={head_dim}",
              f"B={batch} ctx={ctx} splits={splits}")
    K.decode_attention.decode_attention(q, k_buf, v_buf, out, *args, head_dim ** -0.5, num_kv_splits=splits)
    if verify:
        want = K.decode_attention.decode_attention_reference(q, k_buf, v_buf, *args, head_dim ** -0.5)
        row.max_err, row.tol = err(out, want), 1e-2
    row.time_us = bench_us(lambda: K.decode_attention.decode_attention(
        q, k_buf, v_buf, out, *args, head_dim ** -0.5, num_kv_splits=splits), dev)
    kv_bytes = 2 * batch * ctx * num_kv_heads * head_dim * k_buf.element_size()
    row.gbps = kv_bytes / row.time_us / 1e3
    del k_buf, v_buf
    return row


def print_table(rows: list[Row], copy_gbps: float) -> None:
    print(f"\n{'kernel':<44} {'shape':<44} {'rel_err':>9} {'tol':>6} {'ok':>4} {'time_us':>10} "
          f"{'GB/s':>8} {'%copy':>6} {'TFLOP/s':>8}")
    for r in rows:
        pct = r.gbps / copy_gbps * 100 if not math.isnan(r.gbps) else float("nan")
        print(f"{r.name:<44} {r.shape:<44} {r.max_err:>9.2e} {r.tol:>6.2g} {r.ok:>4} {r.time_us:>10.1f} "
              f"{r.gbps:>8.0f} {pct:>6.1f} {r.tflops:>8.1f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--smoke", action="store_true", help="tiny shapes (works on CPU via the interpreter)")
    opts = parser.parse_args()
    if not torch.cuda.is_available():
        assert opts.smoke, "no CUDA device: only --smoke runs here (under TRITON_INTERPRET=1)"
        os.environ["TRITON_INTERPRET"] = "1"
    K = _import_kernels()
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dt = torch.bfloat16 if dev.type == "cuda" else torch.float32
    s = 64 if opts.smoke else 1  # shape divisor
    torch.manual_seed(0)
    num_sms = torch.cuda.get_device_properties(dev).multi_processor_count if dev.type == "cuda" else 4
    print(f"device={torch.cuda.get_device_name(dev) if dev.type == 'cuda' else 'cpu (interpreter)'} "
          f"torch={torch.__version__} triton={importlib.import_module('triton').__version__}", flush=True)
    copy = copy_bandwidth(dev, (4 << 30) // (s * s))
    rows = check_pointwise(K, dev, dt, s)
    for heads in [(32, 8, 128), (9, 3, 64)]:  # Llama-3-8B-like and SmolLM2-135M
        rows.append(check_extend(K, dev, dt, s, *heads))
        print(f"done: {rows[-1].name} {rows[-1].shape}", flush=True)
    decode_shapes = [(1, 32768), (8, 16384), (64, 4096), (64, 32768)] if not opts.smoke else [(2, 64), (3, 40)]
    for batch, ctx in decode_shapes:
        rows.append(check_decode(K, dev, dt, batch, ctx, 32, 8, 128, num_sms, verify=batch * ctx <= 64 * 4096))
        print(f"done: {rows[-1].name} {rows[-1].shape}", flush=True)
    rows.append(check_decode(K, dev, dt, 64 // s or 2, 4096 // s, 9, 3, 64, num_sms, verify=True))
    for splits in (8, 16, 64) if not opts.smoke else ():  # tuning data: the default picks 32 here
        rows.append(check_decode(K, dev, dt, 1, 32768 // s, 32, 8, 128, num_sms, verify=False, splits=splits))
    rows.append(copy)
    print("\n(end-to-end decode tok/s against HF generate and graphs vs eager: benchmarks/bench_gpu_e2e.py)")
    print_table(rows, copy.gbps)
    return 0 if all(r.ok != "FAIL" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
