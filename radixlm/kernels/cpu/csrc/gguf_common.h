// What the GGUF block ops share (gguf_blocks.cpp: dequantization and the fp32-activation linear;
// gguf_q8.cpp: the int8-activation linear): ggml's type ids and block formats, 16-value vector helpers, and
// the checks and parts of a (possibly fused) block weight.
#pragma once
#include "common.h"

#include <ATen/Parallel.h>
#include <c10/util/Half.h>
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <optional>
#include <vector>

namespace rlm::gguf {

// ggml's type ids (ggml.h enum ggml_type).
enum QType : int64_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8,
  Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, BF16 = 30,
};

struct Format {
  int64_t block;  // values per block
  int64_t bytes;  // bytes per block
};

inline bool known(int64_t t) {
  switch (t) {
    case F32: case F16: case BF16: case Q4_0: case Q4_1: case Q5_0: case Q5_1: case Q8_0:
    case Q2_K: case Q3_K: case Q4_K: case Q5_K: case Q6_K:
      return true;
    default:
      return false;
  }
}

inline Format format(int64_t t) {
  switch (t) {
    case F32: return {32, 128};   // float formats are read 32 values at a time
    case F16: return {32, 64};
    case BF16: return {32, 64};
    case Q4_0: return {32, 18};
    case Q4_1: return {32, 20};
    case Q5_0: return {32, 22};
    case Q5_1: return {32, 24};
    case Q8_0: return {32, 34};
    case Q2_K: return {256, 84};
    case Q3_K: return {256, 110};
    case Q4_K: return {256, 144};
    case Q5_K: return {256, 176};
    default: return {256, 210};   // Q6_K
  }
}

inline float f16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return c10::detail::fp16_ieee_to_fp32_value(h);
}

inline float bf16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  uint32_t bits = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// ---- 16 values at a time (GCC vector types: one zmm on AVX-512, two ymm on AVX2) ----------------------

using f32x16 = float __attribute__((vector_size(64)));
using f32x4 = float __attribute__((vector_size(16)));
using i32x16 = int32_t __attribute__((vector_size(64)));
using u8x16 = uint8_t __attribute__((vector_size(16)));
using i8x16 = int8_t __attribute__((vector_size(16)));

// Widening loads through intrinsics: GCC's __builtin_convertvector from bytes is scalarized.
inline i32x16 load_u8(const uint8_t* p) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
#ifdef __AVX512F__
  return (i32x16)_mm512_cvtepu8_epi32(v);
#else
  const __m256i halves[2] = {_mm256_cvtepu8_epi32(v), _mm256_cvtepu8_epi32(_mm_srli_si128(v, 8))};
  i32x16 out;
  std::memcpy(&out, halves, sizeof out);
  return out;
#endif
}

inline i32x16 load_i8(const uint8_t* p) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
#ifdef __AVX512F__
  return (i32x16)_mm512_cvtepi8_epi32(v);
#else
  const __m256i halves[2] = {_mm256_cvtepi8_epi32(v), _mm256_cvtepi8_epi32(_mm_srli_si128(v, 8))};
  i32x16 out;
  std::memcpy(&out, halves, sizeof out);
  return out;
#endif
}

inline f32x16 to_f32(i32x16 v) { return __builtin_convertvector(v, f32x16); }

inline void store(float* y, f32x16 v) { std::memcpy(y, &v, sizeof v); }

inline f32x16 load_f32(const float* p) {
  f32x16 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

inline const i32x16 LANE = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};

inline f32x16 fma16(f32x16 a, f32x16 b, f32x16 c) {
#ifdef __AVX512F__
  return (f32x16)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c);
#else
  using f32x8 = float __attribute__((vector_size(32)));
  f32x8 a2[2], b2[2], c2[2];
  std::memcpy(a2, &a, sizeof a);
  std::memcpy(b2, &b, sizeof b);
  std::memcpy(c2, &c, sizeof c);
  for (int h = 0; h < 2; ++h) c2[h] = (f32x8)_mm256_fmadd_ps((__m256)a2[h], (__m256)b2[h], (__m256)c2[h]);
  std::memcpy(&c, c2, sizeof c);
  return c;
#endif
}

// The sum of a 16-lane vector in one fixed order: halves added lane by lane down to one.
inline float hsum(f32x16 s) {
  using f32x8 = float __attribute__((vector_size(32)));
  const f32x8 h8 = __builtin_shufflevector(s, s, 0, 1, 2, 3, 4, 5, 6, 7) +
                   __builtin_shufflevector(s, s, 8, 9, 10, 11, 12, 13, 14, 15);
  const f32x4 h4 = __builtin_shufflevector(h8, h8, 0, 1, 2, 3) + __builtin_shufflevector(h8, h8, 4, 5, 6, 7);
  return (h4[0] + h4[2]) + (h4[1] + h4[3]);
}

using RowFn = void (*)(const uint8_t*, int64_t, float*);

RowFn row_fn(int64_t t);  // gguf_blocks.cpp

inline void check_blocks(const at::Tensor& blocks, int64_t qtype, int64_t in, const char* name) {
  TORCH_CHECK(known(qtype), name, ": GGUF tensor type ", qtype, " has no kernel");
  const Format f = format(qtype);
  TORCH_CHECK(in % f.block == 0, name, ": ", in, " inputs is not a whole number of ", f.block, "-value blocks");
  TORCH_CHECK(blocks.device().is_cpu() && blocks.scalar_type() == at::kByte && blocks.dim() == 2 &&
                  blocks.size(1) == in / f.block * f.bytes && blocks.stride(1) == 1,
              name, ": blocks must be a uint8 [rows, ", in / f.block * f.bytes, "] CPU matrix with contiguous rows");
}

// One block matrix of a (possibly fused) linear weight, with where its outputs go.
struct Part {
  const uint8_t* data;
  int64_t row_stride, rows, first_out;
  RowFn fn;
  int64_t row_bytes;
  int64_t qtype;
};

// The parts of a (possibly fused) weight, checked against x [m, in] and the bias; returns the output count.
inline int64_t parts_of(const at::Tensor& x, at::TensorList blocks, at::IntArrayRef qtypes,
                 const std::optional<at::Tensor>& bias, const char* name, std::vector<Part>& parts) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kFloat && x.dim() == 2,
              name, ": x must be an fp32 [rows, in] CPU tensor");
  TORCH_CHECK(blocks.size() == qtypes.size() && !blocks.empty(), name, ": one qtype per block matrix");
  const int64_t in = x.size(1);
  int64_t n = 0;
  for (size_t p = 0; p < blocks.size(); ++p) {
    check_blocks(blocks[p], qtypes[p], in, name);
    parts.push_back({blocks[p].data_ptr<uint8_t>(), blocks[p].stride(0), blocks[p].size(0), n,
                     row_fn(qtypes[p]), in / format(qtypes[p]).block * format(qtypes[p]).bytes, qtypes[p]});
    n += blocks[p].size(0);
  }
  if (bias)
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->is_contiguous() && bias->numel() == n,
                name, ": bias must be fp32 [", n, "]");
  return n;
}

// Output rows per parallel task: at least ~64 KB of weights, below which a thread's wake-up costs more
// than the split saves.
inline int64_t grain_of(const std::vector<Part>& parts) {
  return std::max<int64_t>(1, 65536 / std::max<int64_t>(parts[0].row_bytes, 1));
}

}  // namespace rlm::gguf
