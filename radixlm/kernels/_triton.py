"""Guarded Triton import and lazily jitted kernels, shared by every file in radixlm.kernels.

Runs in whichever process launches a kernel: the scheduler process (model runner), tests and benchmarks.
Importing this module never fails and never queries a device: without Triton, `tl` is None and
launching a kernel raises, while every torch reference stays usable.
"""

from __future__ import annotations

import os
from typing import Any, Callable

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs: the torch references still work
    triton = None  # type: ignore[assignment]
    tl = None  # type: ignore[assignment]

HAS_TRITON: bool = triton is not None


class LazyKernel:
    """A kernel body that is handed to `triton.jit` at its first launch, not at import.

    Why: `triton.jit` reads TRITON_INTERPRET when it decorates. Decorating at import time would freeze
    the interpreter-or-GPU choice before a test's conftest (or a CPU process) had a chance to set it.
    Kernel files use `from __future__ import annotations`, so `tl.constexpr` annotations are strings
    that Triton normalises, and the module imports even when `tl` is None.
    """

    def __init__(self, fn: Callable[..., None]) -> None:
        self._fn = fn
        self._jitted: Any = None

    def __getitem__(self, grid: tuple[int, ...]) -> Callable[..., Any]:
        if self._jitted is None:
            if triton is None:
                raise RuntimeError("radixlm.kernels needs triton; install it or use the torch reference")
            self._jitted = triton.jit(self._fn)
        return self._jitted[grid]


def next_pow2(n: int) -> int:
    """Smallest power of two >= n (Triton block shapes must be powers of two)."""
    return 1 << max(0, int(n) - 1).bit_length()


def interpreting() -> bool:
    """True when kernels run in Triton's CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def check_device(*tensors: torch.Tensor) -> None:
    """All tensors on one device, and that device is CUDA unless the interpreter runs the kernel."""
    device = tensors[0].device
    assert all(t.device == device for t in tensors), "kernel inputs are on different devices"
    assert device.type == "cuda" or interpreting(), (
        f"Triton kernels need CUDA tensors (got {device}); set TRITON_INTERPRET=1 to run them on CPU"
    )


def dot_dtype(dtype: torch.dtype) -> Any:
    """The Triton dtype that attention kernels feed to tl.dot for inputs of `dtype`.

    Natively the input dtype itself (tensor cores). Under the interpreter bf16 is widened to fp32,
    because Triton's interpreter multiplies bf16 operands as their raw uint16 bit patterns.
    """
    if dtype == torch.bfloat16 and interpreting():
        return tl.float32
    return {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}[dtype]


def dot_precision(dtype: torch.dtype) -> str:
    """fp32 inputs get exact ("ieee") dots so they match the fp32 references; 16-bit inputs use tensor cores."""
    return "ieee" if dtype == torch.float32 else "tf32"
