// RMSNorm and fused residual-add + RMSNorm over fp32 rows (the decoder's 2 norms a layer).
// torch's rms_norm is ~7 ATen ops a call on the CPU (pow, mean, add, rsqrt, two muls, a copy); at one
// decode row each costs more to dispatch than to compute, so one loop replaces them.
#include "common.h"
#include "ops.h"

#include <ATen/Parallel.h>

#include <cmath>

namespace {

// Each row is reduced alone, always in the same order, so a row's result does not depend on how many
// rows share the call (batch invariance). Squares are summed in double in 8 independent lanes (fast,
// and at least as accurate as torch's fp32 cascade); scaling then follows torch's order: (x * r) * w.
void norm_row(const float* x, const float* w, float* out, int64_t n, float eps) {
  double lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) lane[j] += double(x[i + j]) * double(x[i + j]);
  for (; i < n; ++i) lane[0] += double(x[i]) * double(x[i]);
  double ss = ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
  float r = 1.0f / std::sqrt(float(ss / double(n)) + eps);
  for (i = 0; i < n; ++i) out[i] = (x[i] * r) * w[i];
}

void check_rows(const at::Tensor& x, const at::Tensor& w, const char* name) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kFloat && x.is_contiguous(),
              name, ": x must be a contiguous fp32 CPU tensor");
  TORCH_CHECK(x.dim() >= 1 && w.dim() == 1 && w.size(0) == x.size(-1) && w.is_contiguous() &&
                  w.scalar_type() == at::kFloat,
              name, ": weight must be fp32 [", x.size(-1), "]");
}

int64_t grain(int64_t n) { return std::max<int64_t>(1, 32768 / std::max<int64_t>(n, 1)); }

}  // namespace

namespace rlm {

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& w, double eps) {
  check_rows(x, w, "rms_norm");
  auto out = at::empty_like(x);
  const int64_t n = x.size(-1), rows = x.numel() / std::max<int64_t>(n, 1);
  const float *xp = x.data_ptr<float>(), *wp = w.data_ptr<float>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, rows, grain(n), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) norm_row(xp + r * n, wp, op + r * n, n, float(eps));
  });
  return out;
}

// residual += x (in place, fp32 adds as torch's residual + x), then returns rms_norm(residual).
at::Tensor add_rms_norm(const at::Tensor& x, at::Tensor& residual, const at::Tensor& w, double eps) {
  check_rows(x, w, "add_rms_norm");
  check_rows(residual, w, "add_rms_norm");
  TORCH_CHECK(x.sizes() == residual.sizes(), "add_rms_norm: x and residual differ in shape");
  auto out = at::empty_like(x);
  const int64_t n = x.size(-1), rows = x.numel() / std::max<int64_t>(n, 1);
  const float *xp = x.data_ptr<float>(), *wp = w.data_ptr<float>();
  float *rp = residual.data_ptr<float>(), *op = out.data_ptr<float>();
  at::parallel_for(0, rows, grain(n), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      float* row = rp + r * n;
      for (int64_t i = 0; i < n; ++i) row[i] += xp[r * n + i];
      norm_row(row, wp, op + r * n, n, float(eps));
    }
  });
  return out;
}

}  // namespace rlm

RADIXLM_OPS(m) {
  m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor", rlm::rms_norm);
  m.def("add_rms_norm(Tensor x, Tensor(a!) residual, Tensor weight, float eps) -> Tensor", rlm::add_rms_norm);
}
