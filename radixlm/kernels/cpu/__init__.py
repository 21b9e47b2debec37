"""radixlm.kernels.cpu: C++ ops for the CPU path, compiled for the machine at first use (build.py).

Each op is a plain loop over contiguous fp32 (or int8) rows where torch would dispatch several small ops
per call; at one decode row the dispatch, not the arithmetic, is what torch's versions cost. Each has a
torch reference next to it in `reference.py`, and tests/kernels/test_cpu_ops.py / test_cpu_fused_ops.py /
test_cpu_gemv.py compare the native and the AVX2 builds with it. Callers get the ops from `load()` and keep
their torch code when it returns None (runtime/model/cpu_ops.py hands them to the model; quant/ and
weight_layout.py take the GEMVs).

  csrc/norm.cpp          rms_norm, and add_rms_norm (residual += x in place, then RMSNorm)
  csrc/attention.cpp     rope_store_kv (rotary of q and k from the fused qkv output, k and v stored into the
                         KV pool slots; returns q), paged_decode_attention (one query a row, K/V read through
                         req_to_token, no gather), paged_extend_attention (a few new tokens a row, causal, each
                         with a decode row's bits)
  csrc/activation.cpp    silu_mul (silu(gate) * up of the fused gate/up output)
  csrc/decode_layer.cpp  decode_layer (a one-token decode step of a Llama-family layer, the ops above and its
                         four matmuls chained in C++)
  csrc/decode_stack.cpp  DecodeStack (torch.classes.<namespace>): every layer's decode_layer and the final norm
                         of a one-token step in one call, the weights and K/V buffers held from load
  csrc/gemv.cpp          pack_rows (a weight into the tiled layout), int8_linear and f32_linear: few-row linear
                         layers on tiled int8 (per-channel scales) or fp32 weights, fp32 activations
  csrc/gguf_blocks.cpp   gguf_dequantize (a GGUF tensor's blocks -> fp32, bit for bit the gguf package's),
                         gguf_linear (few-row linear on the blocks, fp32 activations)
  csrc/gguf_q8.cpp       gguf_linear_q8 (gguf_linear with each activation row rounded to int8 blocks, integer
                         dot products as llama.cpp's); csrc/gguf_common.h: what they share. Their reference
                         is gguf.quants.dequantize and a float matmul (test_cpu_gguf_blocks.py)
  csrc/gguf_packed.cpp   gguf_pack (Q5_0 / Q8_0 / Q4_K / Q6_K blocks regrouped once into panels of 16 rows),
                         gguf_linear_packed (few-row linear on panels, int8 activations, 16 outputs per vector),
                         gguf_packed_dequantize (a panel's fp32 values, bit for bit gguf_dequantize's)
  csrc/ops.h             the ops one op file calls from another; csrc/fast_exp.h: a vectorisable expf
"""

from radixlm.kernels.cpu.build import load, namespace

__all__ = ["load", "namespace"]
