// Shared by every op file: the library macro (the namespace comes from the build: radixlm_<isa>).
#pragma once
#include <ATen/ATen.h>
#include <torch/library.h>

// One indirection so RADIXLM_NS expands before TORCH_LIBRARY_FRAGMENT pastes it into its names.
#define RLM_FRAGMENT(ns, m) TORCH_LIBRARY_FRAGMENT(ns, m)
#define RADIXLM_OPS(m) RLM_FRAGMENT(RADIXLM_NS, m)
