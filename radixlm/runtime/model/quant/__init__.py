"""Quantized (int8 / int4) and bf16 weights on the CPU: capability detection, kernels, model rewrite."""
