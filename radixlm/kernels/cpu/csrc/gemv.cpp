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
#include "tiles.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <optional>
#include <utility>

namespace {

using namespace rlm::tiled;

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

// Rows of x one tile multiplies (NM): up to this many, each block of weights is read once and used by all
// of them in one call of `tile`, so a step of that many rows costs about a one-row step's memory traffic.
int64_t tile_rows() { return NM; }

}  // namespace rlm

RADIXLM_OPS(m) {
  m.def("pack_rows(Tensor weight) -> Tensor", pack_rows);
  m.def("int8_linear(Tensor x, Tensor packed, Tensor scales, Tensor? bias) -> Tensor", rlm::int8_linear);
  m.def("f32_linear(Tensor x, Tensor packed, int out_features, Tensor? bias) -> Tensor", rlm::f32_linear);
  m.def("tile_rows() -> int", rlm::tile_rows);
}
