"""Speculative decoding (docs/engine.md, "Speculative decoding"): proposers (n-gram lookup, a draft model),
exact verification (greedy match / rejection sampling) and the per-request adaptive controller."""
