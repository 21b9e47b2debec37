"""Compile every kernel for sm_90 (H100/H200) with exactly the arguments its launcher passes on a GPU.

No GPU is needed: Triton lowers to a Hopper cubin with its bundled ptxas. This catches what the CPU
interpreter cannot: GPU-only typing rules, tl.dot shape limits, shared-memory overflow at the block
sizes the launchers pick for real hardware. Launchers run on tiny CPU tensors with launching replaced
by recording, and with `interpreting()` forced False so they choose their GPU configuration.
The compile runs in a fresh interpreter (this file as a script): Triton cannot compile for a GPU in a
process that imported it with TRITON_INTERPRET=1, as the rest of this folder does.
"""

from __future__ import annotations

import os
import subprocess
import sys
from contextlib import contextmanager
from typing import Iterator

import pytest
import torch

_TYPES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16", torch.int32: "i32",
          torch.int64: "i64"}


@contextmanager
def recorded_launches() -> Iterator[list]:
    """Launchers record (kernel body, args, kwargs) instead of launching, configured as on a GPU."""
    from radixlm.kernels import (_triton, decode_attention, extend_attention, grammar_mask, rms_norm, rotary,
                                 silu_and_mul, store_kv)

    modules = [_triton, decode_attention, extend_attention, grammar_mask, rms_norm, rotary, silu_and_mul, store_kv]
    calls: list = []
    saved = [(m, n, getattr(m, n)) for m in modules for n in ("interpreting", "check_device") if hasattr(m, n)]
    saved_getitem = _triton.LazyKernel.__getitem__
    for module, name, _ in saved:
        setattr(module, name, (lambda: False) if name == "interpreting" else (lambda *tensors: None))
    _triton.LazyKernel.__getitem__ = lambda self, grid: lambda *a, **kw: calls.append((self._fn, a, kw))
    try:
        yield calls
    finally:
        _triton.LazyKernel.__getitem__ = saved_getitem
        for module, name, value in saved:
            setattr(module, name, value)


def compile_sm90(fn, args: tuple, kwargs: dict):
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, compile
    from triton.runtime.jit import JITFunction

    jit = JITFunction(fn)
    options = {k: kwargs.pop(k) for k in ("num_warps", "num_stages") if k in kwargs}
    signature, constexprs, attrs = {}, {}, {}
    values = list(args) + [kwargs[n] for n in jit.arg_names[len(args):]]
    for i, (name, value) in enumerate(zip(jit.arg_names, values)):
        if name in kwargs:
            signature[name], constexprs[name] = "constexpr", value
        elif isinstance(value, torch.Tensor):
            signature[name] = "*" + _TYPES[value.dtype]
            attrs[(i,)] = [["tt.divisibility", 16]]  # as Triton's JIT specialises 16-byte aligned pointers
        elif isinstance(value, float):
            signature[name] = "fp32"
        else:
            signature[name] = "i32" if abs(int(value)) < 2**31 else "i64"
            if int(value) % 16 == 0:  # ... and integers divisible by 16 (strides): enables vector loads
                attrs[(i,)] = [["tt.divisibility", 16]]
    kernel = compile(ASTSource(fn=jit, signature=signature, constexprs=constexprs, attrs=attrs),
                     target=GPUTarget("cuda", 90, 32), options=options)
    assert "cubin" in kernel.asm, fn.__name__
    return kernel


def launch_pointwise() -> None:
    from radixlm.kernels import grammar_mask, rms_norm, rotary, silu_and_mul, store_kv

    bf = torch.bfloat16
    x = torch.randn(4, 4096, dtype=bf)
    rms_norm.rms_norm(x, torch.ones(4096, dtype=bf), 1e-6)
    rms_norm.fused_add_rms_norm(x, x.clone(), torch.ones(4096, dtype=bf), 1e-6)
    cache = rotary.build_cos_sin_cache(rotary.compute_inv_freq(128, 1e4), 16)
    rotary.apply_rotary_(torch.randn(2, 32, 128, dtype=bf), torch.randn(2, 8, 128, dtype=bf),
                         torch.tensor([0, 5]), cache)
    silu_and_mul.silu_and_mul(torch.randn(2, 2 * 14336, dtype=bf))
    grammar_mask.apply_grammar_bitmask_(torch.randn(2, 128256), torch.zeros(2, 4008, dtype=torch.int32))
    kv = torch.randn(3, 8, 128, dtype=bf)
    store_kv.store_kv(kv, kv, torch.empty(10, 8, 128, dtype=bf), torch.empty(10, 8, 128, dtype=bf),
                      torch.tensor([1, 4, 7]))


def launch_attention(dtype: torch.dtype, num_heads: int, num_kv_heads: int, head_dim: int) -> None:
    from radixlm.kernels import decode_attention, extend_attention

    pool = torch.zeros(16, num_kv_heads, head_dim, dtype=dtype)
    table = torch.arange(16, dtype=torch.int64).view(2, 8)
    rows, seq_lens = torch.tensor([0, 1]), torch.tensor([5, 8])
    q = torch.randn(2, num_heads, head_dim, dtype=dtype)
    decode_attention.decode_attention(q, pool, pool, torch.empty_like(q), table, rows, seq_lens, 0.1,
                                      num_kv_splits=4)
    extend_attention.extend_attention(q, pool, pool, torch.empty_like(q), table, rows, seq_lens,
                                      seq_lens - 1, torch.tensor([0, 1]), 0.1)


def main() -> None:
    with recorded_launches() as calls:
        launch_pointwise()
        # Llama-3-8B, SmolLM2, and SmolLM2 in fp32 (its own extend tiles: extend_attention._default_blocks)
        for config in [(torch.bfloat16, 32, 8, 128), (torch.bfloat16, 9, 3, 64), (torch.float32, 9, 3, 64)]:
            launch_attention(*config)
    assert len(calls) == 16, len(calls)
    for fn, args, kwargs in calls:
        compile_sm90(fn, args, dict(kwargs))
    print(f"compiled {len(calls)} kernel launches for sm_90")


def test_every_kernel_compiles_for_sm90():
    pytest.importorskip("triton")
    pytest.importorskip("triton.backends.compiler")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"  # triton 3.9 warns when unset; 1 is its current default
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = repo + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, os.path.abspath(__file__)], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert "compiled" in proc.stdout


if __name__ == "__main__":
    main()
