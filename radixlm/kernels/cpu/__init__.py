"""radixlm.kernels.cpu: C++ ops for the CPU path, compiled for the machine at first use (build.py).

Each op is a plain loop over contiguous fp32 (or int8) rows where torch would dispatch several small ops
per call; at one decode row the dispatch, not the arithmetic, is what torch's versions cost. Each has a
torch reference next to it in `reference.py`, and tests/kernels/test_cpu_ops.py (gemv.cpp:
tests/kernels/test_cpu_gemv.py) compares the native and the AVX2 builds with it. Callers get the ops from
`load()` and keep their torch code when it returns None.

  csrc/norm.cpp   rms_norm, and add_rms_norm (residual += x in place, then RMSNorm)
  csrc/gemv.cpp   pack_rows (a weight into the tiled layout), int8_linear and f32_linear: few-row linear
                  layers on tiled int8 (per-channel scales) or fp32 weights, fp32 activations
"""

from radixlm.kernels.cpu.build import load, namespace

__all__ = ["load", "namespace"]
