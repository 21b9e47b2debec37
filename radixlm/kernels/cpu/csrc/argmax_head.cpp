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
#include <cstring>
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

// y[o] for the outputs o of the given blocks: f32_linear's own tile at one row (its exact logits).
void exact_blocks(const float* x, int64_t kp, const float* w, int64_t n, const std::vector<int64_t>& blocks,
                  float* y) {
  float out[NM][NR];
  for (int64_t b : blocks) {
    tile<float, 1>(x, kp, w + b * NR * kp, kp, out);
    const int64_t o = b * NR, nr = std::min<int64_t>(NR, n - o);
    for (int64_t r = 0; r < nr; ++r) y[o + r] = out[0][r];
  }
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
  exact_blocks(xv, kp, w, n, candidates, yv);
  return y;
}

}  // namespace rlm

// Many greedy rows (a batch's decode rows, a verify row's positions): there the head is bound by its
// arithmetic, not by reading it, so the screen is a bf16 x bf16 matmul (oneDNN's, at about twice fp32's
// rate where the CPU multiplies bf16 natively), given here as `screened` [M, n] bf16: t_i, bf16(W) bf16(x)^T
// summed in fp32 and rounded to bf16. Per row of x the bound adds what rounding x and the output cost:
// with d = x - bf16(x) and s'_i the fp32 sum t_i was rounded from,
//     |l_i - t_i| <= ||e_i|| ||x|| + ||bf16(w_i)|| ||d|| + 2.01 gamma_K ||w_i|| ||x|| (1 + 2^-8)^2 + |s'_i - t_i|,
// ||bf16(w_i)|| <= ||w_i|| (1 + 2^-8) and |s'_i - t_i| <= 2^-8 |t_i|. One bound serves the whole row,
//     B = (max_i c_i ||x|| + max_i wnorm_i ||d|| (1 + 2^-7) + 2^-7 max_i |t_i|) (1 + 2^-10) + 2^-100
// (wnorm_i = ||w_i|| rounded up; c_i's 2^-12 floor covers both gamma terms; d counts a denormal bf16(x_k)
// as zero, as vdpbf16ps and AMX read it; 2^-100 covers flushed denormal sums): the largest lower bound is
// at least max t - B, so a logit with t_i < max t - 2B is below the argmax, and the candidates are the
// blocks holding a t_i >= max t - 2.01 B (found in one pass over the row's bf16 bits). They are recomputed
// with f32_linear's tile, as argmax_linear does: a row's result is the same bits whatever else is in the
// batch, and the same as the one-row head's.
namespace {

// bf16 bits -> a key whose signed 16-bit order is the values' order (negatives' magnitude bits flipped).
inline int16_t order_key(uint16_t b) { return int16_t(b ^ (uint16_t(int16_t(b) >> 15) & 0x7FFF)); }
inline uint16_t key_bits(int16_t k) { return uint16_t(k) ^ (uint16_t(k >> 15) & 0x7FFF); }  // the inverse
inline float bf16_float(uint16_t b) {
  const uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// The bf16 bits of v rounded toward -inf (a threshold that keeps every value >= v).
inline uint16_t bf16_floor_bits(float v) {
  uint32_t u;
  std::memcpy(&u, &v, 4);
  uint16_t hi = uint16_t(u >> 16);
  if ((u & 0xFFFF) && (u >> 31)) ++hi;  // negative: truncating rounds toward zero, i.e. up
  return hi == 0 ? uint16_t(0x8000) : hi;  // +0 -> -0, whose key is below +0's: a -0 logit is >= +0 too
}

struct RowScan {
  int16_t top;   // the largest value's key
  uint16_t mag;  // the largest magnitude's bits
  bool finite;
};

RowScan scan_row(const uint16_t* s, int64_t n) {
  int16_t top = std::numeric_limits<int16_t>::min();
  uint16_t mag = 0;
  bool finite = true;
  int64_t i = 0;
#if defined(__AVX512BW__)
  const __m512i expo = _mm512_set1_epi16(0x7F80), low = _mm512_set1_epi16(0x7FFF);
  __m512i vtop = _mm512_set1_epi16(top), vmag = _mm512_setzero_si512();
  __mmask32 bad = 0;
  for (; i + 32 <= n; i += 32) {
    const __m512i v = _mm512_loadu_si512(s + i);
    bad |= _mm512_cmpeq_epi16_mask(_mm512_and_si512(v, expo), expo);
    vtop = _mm512_max_epi16(vtop, _mm512_xor_si512(v, _mm512_and_si512(_mm512_srai_epi16(v, 15), low)));
    vmag = _mm512_max_epu16(vmag, _mm512_and_si512(v, low));
  }
  alignas(64) int16_t tops[32];
  alignas(64) uint16_t mags[32];
  _mm512_store_si512(tops, vtop);
  _mm512_store_si512(mags, vmag);
  for (int j = 0; j < 32; ++j) {
    top = std::max(top, tops[j]);
    mag = std::max(mag, mags[j]);
  }
  finite = bad == 0;
#endif
  for (; i < n; ++i) {
    finite = finite && (s[i] & 0x7F80) != 0x7F80;
    top = std::max(top, order_key(s[i]));
    mag = std::max(mag, uint16_t(s[i] & 0x7FFF));
  }
  return {top, mag, finite};
}

// The blocks (of NR outputs) holding a value whose key is >= thr, ascending.
void candidate_blocks(const uint16_t* s, int64_t n, int16_t thr, std::vector<int64_t>& out) {
  out.clear();
  auto add = [&](int64_t o) {
    const int64_t b = o / NR;
    if (out.empty() || out.back() != b) out.push_back(b);
  };
  int64_t i = 0;
#if defined(__AVX512BW__)
  const __m512i low = _mm512_set1_epi16(0x7FFF), vthr = _mm512_set1_epi16(thr);
  for (; i + 32 <= n; i += 32) {
    const __m512i v = _mm512_loadu_si512(s + i);
    const __m512i key = _mm512_xor_si512(v, _mm512_and_si512(_mm512_srai_epi16(v, 15), low));
    for (uint32_t hit = _mm512_cmpge_epi16_mask(key, vthr); hit; hit &= hit - 1) add(i + __builtin_ctz(hit));
  }
#endif
  for (; i < n; ++i)
    if (order_key(s[i]) >= thr) add(i);
}

}  // namespace

namespace rlm {

at::Tensor argmax_rows(const at::Tensor& x, const at::Tensor& screened, const at::Tensor& packed,
                       const at::Tensor& coef, const at::Tensor& wnorm, int64_t n) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kFloat && x.dim() == 2,
              "argmax_rows: x must be fp32 [rows, in]");
  const int64_t rows = x.size(0), kp = packed.size(1) / NR, blocks = padded(n, NR) / NR;
  TORCH_CHECK(packed.dim() == 2 && packed.is_contiguous() && packed.scalar_type() == at::kFloat &&
                  packed.size(0) == blocks && packed.size(1) % (NR * W) == 0,
              "argmax_rows: the weight must come from this build's pack_rows (", n, " fp32 rows)");
  TORCH_CHECK(coef.scalar_type() == at::kFloat && coef.numel() == n && coef.is_contiguous() &&
                  wnorm.scalar_type() == at::kFloat && wnorm.numel() == n && wnorm.is_contiguous(),
              "argmax_rows: coef must come from argmax_screen of this weight and wnorm be fp32 [", n, "]");
  TORCH_CHECK(screened.dim() == 2 && screened.size(0) == rows && screened.size(1) == n &&
                  screened.scalar_type() == at::kBFloat16,
              "argmax_rows: screened must be bf16 [", rows, ", ", n, "]");
  TORCH_CHECK(padded(x.size(1), W) == kp, "argmax_rows: x has ", x.size(1), " inputs, the weight ", kp);
  auto xp = x.size(1) == kp ? x.contiguous() : at::constant_pad_nd(x, {0, kp - x.size(1)});
  auto sc = screened.contiguous();
  const auto* sb = reinterpret_cast<const uint16_t*>(sc.data_ptr<at::BFloat16>());
  const float *xv = xp.data_ptr<float>(), *w = packed.data_ptr<float>();
  const float cmax = coef.max().item<float>(), wmax = wnorm.max().item<float>();
  auto y = at::empty({rows, n}, x.options());
  float* yv = y.data_ptr<float>();
  const float small = std::ldexp(1.0f, -100), out_rel = std::ldexp(1.0f, -7), margin = 1.0f + std::ldexp(1.0f, -10);
  at::parallel_for(0, rows, 1, [&](int64_t m0, int64_t m1) {
    std::vector<int64_t> candidates;
    for (int64_t m = m0; m < m1; ++m) {
      const float* xr = xv + m * kp;
      const uint16_t* s = sb + m * n;
      float* yr = yv + m * n;
      double norm2 = 0, d2 = 0;
      for (int64_t i = 0; i < kp; ++i) {
        const float r = float(c10::BFloat16(xr[i]));  // bf16(x) as the screen's matmul read it
        const double v = xr[i], d = v - (std::fabs(r) < std::numeric_limits<float>::min() ? 0.0 : double(r));
        norm2 += v * v;
        d2 += d * d;
      }
      const float xn = float(std::sqrt(norm2) * (1.0 + std::ldexp(1.0, -10)));
      const float dn = float(std::sqrt(d2) * (1.0 + std::ldexp(1.0, -7)));
      const RowScan scan = scan_row(s, n);
      const float bound = (cmax * xn + wmax * dn + out_rel * bf16_float(scan.mag)) * margin + small;
      const float thr = bf16_float(key_bits(scan.top)) - 2.01f * bound;
      const bool ok = scan.finite && std::isfinite(bound) && std::isfinite(thr);
      if (ok) candidate_blocks(s, n, order_key(bf16_floor_bits(thr)), candidates);
      if (!ok || int64_t(candidates.size()) * MAX_CANDIDATE_BLOCKS_DIV > blocks) {
        candidates.resize(blocks);  // the full row (f32_linear's bits, block by block)
        for (int64_t b = 0; b < blocks; ++b) candidates[b] = b;
      }
      std::fill_n(yr, n, -std::numeric_limits<float>::infinity());
      exact_blocks(xr, kp, w, n, candidates, yr);
    }
  });
  return y;
}

}  // namespace rlm

RADIXLM_OPS(m) {
  m.def("argmax_screen(Tensor packed, int out_features) -> (Tensor, Tensor)", argmax_screen);
  m.def("argmax_linear(Tensor x, Tensor packed, Tensor screen, Tensor coef, int out_features) -> Tensor",
        rlm::argmax_linear);
  m.def("argmax_rows(Tensor x, Tensor screened, Tensor packed, Tensor coef, Tensor wnorm, int out_features) -> Tensor",
        rlm::argmax_rows);
}
