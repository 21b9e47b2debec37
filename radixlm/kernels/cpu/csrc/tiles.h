// The tiled fp32 / int8 GEMV's building blocks (gemv.cpp), shared with the ops that must reproduce its
// outputs bit for bit (argmax_head.cpp recomputes single logits exactly as f32_linear does): the ISA's
// vector type, the tiled weight layout's block shape and `tile`, one block's dot products.
#pragma once
#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace rlm::tiled {

struct bf16 {  // a bfloat16's bits (the upper half of an fp32): weights read at half of fp32's bytes
  uint16_t bits;
};

#if defined(__AVX512F__)
constexpr int W = 16;  // fp32 lanes per vector
constexpr int NR = 8;  // output rows per block (the tiled layout)
// Rows of x per tile. 4 x 8 accumulators + 4 x vectors + a weight vector overflow the 32 registers by a
// few spills, which still measured faster than two passes over half blocks (hot in L2, 1 thread: 3 / 4
// rows 2.4 / 3.4 vs 3.0 / 3.8 ms).
constexpr int NM = 4;
using vec = __m512;
inline vec vzero() { return _mm512_setzero_ps(); }
inline vec vload(const float* p) { return _mm512_loadu_ps(p); }
inline vec vload(const int8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}
inline vec vload(const bf16* p) {  // bf16 -> fp32 is exact: the bits shifted into the upper half
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
}
inline vec vfma(vec a, vec b, vec c) { return _mm512_fmadd_ps(a, b, c); }
inline float hsum(vec v) {
  __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
  __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  q = _mm_add_ps(q, _mm_movehl_ps(q, q));
  return _mm_cvtss_f32(_mm_add_ss(q, _mm_movehdup_ps(q)));
}
#elif defined(__AVX2__) && defined(__FMA__)
constexpr int W = 8;
constexpr int NR = 4;
constexpr int NM = 2;  // 16 registers: 2 * 4 accumulators + 2 x vectors + a weight vector
using vec = __m256;
inline vec vzero() { return _mm256_setzero_ps(); }
inline vec vload(const float* p) { return _mm256_loadu_ps(p); }
inline vec vload(const int8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}
inline vec vload(const bf16* p) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16));
}
inline vec vfma(vec a, vec b, vec c) { return _mm256_fmadd_ps(a, b, c); }
inline float hsum(vec v) {
  __m128 q = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  q = _mm_add_ps(q, _mm_movehl_ps(q, q));
  return _mm_cvtss_f32(_mm_add_ss(q, _mm_movehdup_ps(q)));
}
#else  // portable: 8 lanes in an array, which the compiler vectorizes where it can
constexpr int W = 8;
constexpr int NR = 4;
constexpr int NM = 2;
struct vec { float v[8]; };
inline vec vzero() { return vec{}; }
template <typename T>
inline vec vload(const T* p) { vec r; for (int j = 0; j < 8; ++j) r.v[j] = float(p[j]); return r; }
inline vec vload(const bf16* p) {
  vec r;
  for (int j = 0; j < 8; ++j) {
    uint32_t bits = uint32_t(p[j].bits) << 16;
    std::memcpy(&r.v[j], &bits, 4);
  }
  return r;
}
inline vec vfma(vec a, vec b, vec c) { for (int j = 0; j < 8; ++j) c.v[j] += a.v[j] * b.v[j]; return c; }
inline float hsum(vec v) {
  return ((v.v[0] + v.v[4]) + (v.v[2] + v.v[6])) + ((v.v[1] + v.v[5]) + (v.v[3] + v.v[7]));
}
#endif

// The tiled layout (`pack_rows`): blocks of NR output rows; in a block, for each W-wide slice of the
// inputs, the NR rows' W values one after another. A block is then one contiguous run read front to back
// (one prefetch stream: reading NR row-major rows side by side measured 1.4x slower, SmolLM2's int8
// matmuls at one row, 1 thread, Zen 5).
// Rows and inputs are zero-padded to multiples of NR and W. The layout depends on the build (W, NR), so
// each build packs its own.
inline int64_t padded(int64_t n, int64_t to) { return (n + to - 1) / to * to; }

// Bytes of weights requested ahead of the tile loop. The hardware prefetcher alone left the loop waiting
// on memory: SmolLM2's int8 matmuls, 1 thread, ms at 1 / 4 / 8 rows of x: 7.8 / 9.2 / 22.6 without,
// 4.7 / 8.0 / 14.1 with 4 KB ahead (8 and 16 KB: about the same). Past the end of the weights the hints
// read nothing (a prefetch never faults).
constexpr int AHEAD = 4096;
inline void prefetch(const char* p) {
#if defined(__SSE__)
  _mm_prefetch(p, _MM_HINT_T0);
#else
  __builtin_prefetch(p);
#endif
}

// out[m][r] = the dot products of NM_ rows of x (stride ldx, zero-padded to kp) with a block's NR rows.
template <typename T, int NM_>
void tile(const float* x, int64_t ldx, const T* w, int64_t kp, float out[NM][NR]) {
  vec acc[NM_][NR];
  for (int m = 0; m < NM_; ++m)
    for (int r = 0; r < NR; ++r) acc[m][r] = vzero();
  for (int64_t i = 0; i < kp; i += W, w += NR * W) {
    for (int l = 0; l < int(sizeof(T)) * NR * W; l += 64) prefetch(reinterpret_cast<const char*>(w) + AHEAD + l);
    vec xv[NM_];
    for (int m = 0; m < NM_; ++m) xv[m] = vload(x + m * ldx + i);
    for (int r = 0; r < NR; ++r) {
      vec wv = vload(w + r * W);
      for (int m = 0; m < NM_; ++m) acc[m][r] = vfma(xv[m], wv, acc[m][r]);
    }
  }
  for (int m = 0; m < NM_; ++m)
    for (int r = 0; r < NR; ++r) out[m][r] = hsum(acc[m][r]);
}

}  // namespace rlm::tiled
