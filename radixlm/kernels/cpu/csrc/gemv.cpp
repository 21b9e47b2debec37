// Few-row linear layers at memory bandwidth: y[m, o] = scale[o] * sum_i x[m, i] * w[o, i] (+ bias[o]) for
// fp32 activations x [M, in] and a row-major weight w [out, in] in int8 (per-output-channel scales) or fp32.
// At a few rows a decode step's matmuls are bound by reading the weights; torch's int8 kernel casts the
// activations to bf16 and its fp32 GEMMs are tuned for many rows, so neither streams at the machine's
// rate. Here int8 weights are widened to fp32 in registers (no activation rounding at all), a block of
// NR output rows is read once and multiplied with every row of x (NM at a time) while it sits in L1.
//
// Every output is one dot product whose summation order depends only on `in` and the ISA build (vector
// lanes, then a fixed lane reduction): never on M, on the row's place in the batch, or on the thread
// split. So a row's result has the same bits alone and in any batch (batch invariance).
#include "common.h"
#include "ops.h"

#include <ATen/Parallel.h>

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <optional>
#include <utility>

namespace {

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
int64_t padded(int64_t n, int64_t to) { return (n + to - 1) / to * to; }

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

template <typename T>
using TileFn = void (*)(const float*, int64_t, const T*, int64_t, float[NM][NR]);

template <typename T, int... Ms>
constexpr std::array<TileFn<T>, NM> tiles(std::integer_sequence<int, Ms...>) {  // [nm - 1]
  return {&tile<T, Ms + 1>...};
}

template <typename T>
void gemv(const float* x, int64_t rows, int64_t kp, const T* w, int64_t n, const float* scale, const float* bias,
          float* y) {
  static constexpr auto table = tiles<T>(std::make_integer_sequence<int, NM>{});
  const int64_t blocks = (n + NR - 1) / NR;
  // At least ~64 KB of weights per thread: below that a wake-up costs more than the split saves.
  const int64_t grain = std::max<int64_t>(1, 65536 / (NR * kp * int64_t(sizeof(T))));
  at::parallel_for(0, blocks, grain, [&](int64_t b0, int64_t b1) {
    float out[NM][NR];
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t o = b * NR, nr = std::min<int64_t>(NR, n - o);
      for (int64_t m0 = 0; m0 < rows; m0 += NM) {
        const int64_t nm = std::min<int64_t>(NM, rows - m0);
        table[nm - 1](x + m0 * kp, kp, w + o * kp, kp, out);
        for (int64_t m = 0; m < nm; ++m) {
          float* yr = y + (m0 + m) * n + o;
          for (int64_t r = 0; r < nr; ++r) {
            float v = scale ? out[m][r] * scale[o + r] : out[m][r];
            yr[r] = bias ? v + bias[o + r] : v;
          }
        }
      }
    }
  });
}

at::Tensor pack_rows(const at::Tensor& w) {
  TORCH_CHECK(w.dim() == 2 && (w.scalar_type() == at::kChar || w.scalar_type() == at::kFloat),
              "pack_rows: weight must be an int8 or fp32 [out, in] matrix");
  const int64_t n = w.size(0), k = w.size(1), np = padded(n, NR), kp = padded(k, W);
  auto src = at::constant_pad_nd(w.contiguous(), {0, kp - k, 0, np - n});  // zero rows and inputs
  // [np / NR, NR, kp / W, W] -> [np / NR, kp / W, NR, W]
  return src.view({np / NR, NR, kp / W, W}).permute({0, 2, 1, 3}).contiguous().view({np / NR, kp * NR});
}

// x [rows, in] -> a contiguous fp32 [rows, kp] (zero-padded when in is not a multiple of W).
at::Tensor padded_x(const at::Tensor& x, int64_t kp, const char* name) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kFloat && x.dim() == 2,
              name, ": x must be an fp32 [rows, in] CPU tensor");
  TORCH_CHECK(padded(x.size(1), W) == kp, name, ": x has ", x.size(1), " inputs, the packed weight ", kp);
  return x.size(1) == kp ? x.contiguous() : at::constant_pad_nd(x, {0, kp - x.size(1)});
}

void check_packed(const at::Tensor& w, at::ScalarType dtype, int64_t n, const std::optional<at::Tensor>& bias,
                  const char* name) {
  TORCH_CHECK(w.dim() == 2 && w.is_contiguous() && w.scalar_type() == dtype && w.size(0) == padded(n, NR) / NR &&
                  w.size(1) % (NR * W) == 0,
              name, ": the weight must come from this build's pack_rows (", n, " rows)");
  if (bias)
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->is_contiguous() && bias->numel() == n,
                name, ": bias must be fp32 [", n, "]");
}

}  // namespace

namespace rlm {

at::Tensor int8_linear(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scales,
                       const std::optional<at::Tensor>& bias) {
  const int64_t n = scales.numel(), kp = packed.size(1) / NR;
  TORCH_CHECK(scales.scalar_type() == at::kFloat && scales.is_contiguous(), "int8_linear: scales must be fp32");
  check_packed(packed, at::kChar, n, bias, "int8_linear");
  auto xp = padded_x(x, kp, "int8_linear");
  auto y = at::empty({x.size(0), n}, x.options());
  gemv<int8_t>(xp.data_ptr<float>(), x.size(0), kp, packed.data_ptr<int8_t>(), n, scales.data_ptr<float>(),
               bias ? bias->data_ptr<float>() : nullptr, y.data_ptr<float>());
  return y;
}

at::Tensor f32_linear(const at::Tensor& x, const at::Tensor& packed, int64_t n, const std::optional<at::Tensor>& bias) {
  const int64_t kp = packed.size(1) / NR;
  check_packed(packed, at::kFloat, n, bias, "f32_linear");
  auto xp = padded_x(x, kp, "f32_linear");
  auto y = at::empty({x.size(0), n}, x.options());
  gemv<float>(xp.data_ptr<float>(), x.size(0), kp, packed.data_ptr<float>(), n, nullptr,
              bias ? bias->data_ptr<float>() : nullptr, y.data_ptr<float>());
  return y;
}

}  // namespace rlm

RADIXLM_OPS(m) {
  m.def("pack_rows(Tensor weight) -> Tensor", pack_rows);
  m.def("int8_linear(Tensor x, Tensor packed, Tensor scales, Tensor? bias) -> Tensor", rlm::int8_linear);
  m.def("f32_linear(Tensor x, Tensor packed, int out_features, Tensor? bias) -> Tensor", rlm::f32_linear);
}
