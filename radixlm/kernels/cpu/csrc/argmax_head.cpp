// A greedy row's LM head at half the bytes, with f32_linear's exact argmax. A one-row decode step whose row
// takes the plain argmax of its raw logits (greedy, no penalties, grammar or logprobs) needs the largest
// logit, not all of them, and at one row the LM head is bound by reading its weights. So the head is read
// once as bf16 (a copy in the same tiled layout, half of fp32's bytes): every logit then lies within a
// proven bound of its screened value. Only the rows whose upper bound reaches the largest lower bound can
// be the argmax; their blocks are recomputed with gemv.cpp's own `tile` (the same summation order, so the
// same bits as f32_linear), and every other logit is returned as -inf. The first maximum of the result is
// the first maximum of f32_linear's full row.
//
// The bound. For row i: l_i f32_linear's logit, s_i the screen's (fp32 sums of bf16(w_i) * x), w_i the
// weight row, e_i = w_i - bf16(w_i), x the input row (K inputs, padded). In real arithmetic
//     |l_i - s_i| <= |e_i . x| + (rounding of both sums) <= ||e_i|| ||x|| + 2.01 gamma_K ||w_i|| ||x||,
// gamma_K = K u / (1 - K u), u = 2^-24, for any summation order. The per-row coefficient c_i (argmax_screen,
// rounded up) is ||e_i|| + max(2.01 gamma_K, 2^-12) ||w_i||, and B_i = c_i ||x|| (1 + 2^-10). The 2^-12
// floor keeps |s_i| <= ~2^12 B_i, so the fp32 rounding of s_i +- B_i, and of ||x||, stays far inside the
// 2^-10 margin. A row i with s_i + B_i < max_k (s_k - B_k) then has l_i < l_k: it is not the argmax and is
// not tied with it. A non-finite input, screen or bound falls back to f32_linear, as does a row whose
// candidate blocks exceed MAX_CANDIDATE_BLOCKS of all (no such row is known: recomputing them would read
// more than the screen saved).
#include "common.h"
#include "ops.h"
#include "tiles.h"

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>

#include <cmath>
#include <limits>
#include <tuple>
#include <vector>

namespace {

using namespace rlm::tiled;

constexpr int64_t MAX_CANDIDATE_BLOCKS_DIV = 16;  // fall back past blocks / 16 candidate blocks

// (bf16 copy of the tiled weight, per-row bound coefficient c_i) for argmax_linear.
std::tuple<at::Tensor, at::Tensor> argmax_screen(const at::Tensor& packed, int64_t n) {
  TORCH_CHECK(packed.dim() == 2 && packed.is_contiguous() && packed.scalar_type() == at::kFloat &&
                  packed.size(0) == padded(n, NR) / NR && packed.size(1) % (NR * W) == 0,
              "argmax_screen: the weight must come from this build's pack_rows (", n, " fp32 rows)");
  const int64_t kp = packed.size(1) / NR;
  auto screen = packed.to(at::kBFloat16);  // round to nearest even, as c10::BFloat16 below
  auto coef = at::empty({n}, packed.options());
  const double u = std::ldexp(1.0, -24), gamma = double(kp) * u / (1.0 - double(kp) * u);
  const double rel = std::max(2.01 * gamma, std::ldexp(1.0, -12));
  const float* w = packed.data_ptr<float>();
  float* c = coef.data_ptr<float>();
  for (int64_t o = 0; o < n; ++o) {
    const float* blk = w + (o / NR) * NR * kp;
    const int r = int(o % NR);
    double e2 = 0, w2 = 0;
    for (int64_t i = 0; i < kp; i += W)
      for (int j = 0; j < W; ++j) {
        const float v = blk[(i / W) * NR * W + r * W + j];
        const double e = double(v) - double(float(c10::BFloat16(v)));
        e2 += e * e;
        w2 += double(v) * double(v);
      }
    const double bound = std::sqrt(e2) + rel * std::sqrt(w2);
    float f = float(bound);
    if (double(f) < bound) f = std::nextafter(f, std::numeric_limits<float>::infinity());
    c[o] = f;
  }
  return {screen, coef};
}

}  // namespace

namespace rlm {

at::Tensor argmax_linear(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& screen,
                         const at::Tensor& coef, int64_t n) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kFloat && x.dim() == 2 && x.size(0) == 1,
              "argmax_linear: x must be one fp32 row [1, in]");
  const int64_t kp = packed.size(1) / NR, blocks = padded(n, NR) / NR;
  TORCH_CHECK(screen.scalar_type() == at::kBFloat16 && screen.sizes() == packed.sizes() && screen.is_contiguous() &&
                  coef.scalar_type() == at::kFloat && coef.numel() == n && coef.is_contiguous(),
              "argmax_linear: screen and coef must come from argmax_screen of this weight");
  TORCH_CHECK(padded(x.size(1), W) == kp, "argmax_linear: x has ", x.size(1), " inputs, the weight ", kp);
  auto xp = x.size(1) == kp ? x.contiguous() : at::constant_pad_nd(x, {0, kp - x.size(1)});
  const float* xv = xp.data_ptr<float>();
  double norm2 = 0;
  for (int64_t i = 0; i < kp; ++i) norm2 += double(xv[i]) * double(xv[i]);
  const float scale = float(std::sqrt(norm2) * (1.0 + std::ldexp(1.0, -10)));
  if (!std::isfinite(scale)) return f32_linear(x, packed, n, std::nullopt);

  // Per block: the largest lower and upper bound of its rows (NaN where a screened logit is not finite).
  std::vector<float> lo(blocks), hi(blocks);
  const auto* sw = reinterpret_cast<const bf16*>(screen.data_ptr<at::BFloat16>());
  const float* c = coef.data_ptr<float>();
  const int64_t grain = std::max<int64_t>(1, 65536 / (NR * kp * int64_t(sizeof(bf16))));
  at::parallel_for(0, blocks, grain, [&](int64_t b0, int64_t b1) {
    float out[NM][NR];
    for (int64_t b = b0; b < b1; ++b) {
      tile<bf16, 1>(xv, kp, sw + b * NR * kp, kp, out);
      const int64_t o = b * NR, nr = std::min<int64_t>(NR, n - o);
      float l = -std::numeric_limits<float>::infinity(), h = l;
      bool finite = true;
      for (int64_t r = 0; r < nr; ++r) {
        const float s = out[0][r], bound = c[o + r] * scale;
        finite = finite && std::isfinite(s) && std::isfinite(bound);
        l = std::max(l, s - bound);
        h = std::max(h, s + bound);
      }
      lo[b] = finite ? l : NAN;
      hi[b] = finite ? h : NAN;
    }
  });
  float best = -std::numeric_limits<float>::infinity();
  for (int64_t b = 0; b < blocks; ++b) {
    if (std::isnan(lo[b])) return f32_linear(x, packed, n, std::nullopt);
    best = std::max(best, lo[b]);
  }
  std::vector<int64_t> candidates;
  for (int64_t b = 0; b < blocks; ++b)
    if (hi[b] >= best) candidates.push_back(b);
  if (int64_t(candidates.size()) * MAX_CANDIDATE_BLOCKS_DIV > blocks) return f32_linear(x, packed, n, std::nullopt);

  auto y = at::full({1, n}, -std::numeric_limits<float>::infinity(), x.options());
  float* yv = y.data_ptr<float>();
  const float* w = packed.data_ptr<float>();
  float out[NM][NR];
  for (int64_t b : candidates) {  // f32_linear's own tile at one row: its exact logits
    tile<float, 1>(xv, kp, w + b * NR * kp, kp, out);
    const int64_t o = b * NR, nr = std::min<int64_t>(NR, n - o);
    for (int64_t r = 0; r < nr; ++r) yv[o + r] = out[0][r];
  }
  return y;
}

}  // namespace rlm

RADIXLM_OPS(m) {
  m.def("argmax_screen(Tensor packed, int out_features) -> (Tensor, Tensor)", argmax_screen);
  m.def("argmax_linear(Tensor x, Tensor packed, Tensor screen, Tensor coef, int out_features) -> Tensor",
        rlm::argmax_linear);
}
