"""radixlm.kernels: Triton kernels for the GPU path, one file per kernel.

Each file holds the @triton.jit kernel body, a launcher that asserts shapes/dtypes/strides, and the
torch reference the tests compare against. Runs in the scheduler process (model runner and sampler).
Importing any of these modules needs neither triton nor a GPU (triton is imported guarded and kernels
are jitted at first launch); launching needs CUDA tensors, or TRITON_INTERPRET=1 for CPU tensors.

  store_kv.py          store new tokens' K/V into one layer of the paged KV pool
  extend_attention.py  prefill/extend attention over the pool (ragged batch, cached prefix, GQA)
  decode_attention.py  split-K flash-decoding over the pool, GQA-grouped, with a merge stage
  rms_norm.py          RMSNorm and fused residual-add + RMSNorm
  rotary.py            rotary embedding (HF rotate_half / neox layout) from a cos/sin cache
  silu_and_mul.py      SiLU(gate) * up for gated MLPs
  grammar_mask.py      apply a grammar token bitmask (int32 words) to logits
"""
