// SiLU(gate) * up over the fused gate/up projection's output, in one pass (torch: silu, then an in-place
// mul, two kernels a layer over [T, I]).
#include "common.h"
#include "ops.h"
#include "fast_exp.h"

#include <ATen/Parallel.h>

namespace rlm {

// gate_up [T, 2I] (gate columns, then up) -> [T, I]. silu(g) = g / (1 + exp(-g)) as torch computes it,
// with fast_exp's ~1 ulp exp in place of Sleef's (so not bit-identical to torch; tested to tolerance).
at::Tensor silu_mul(const at::Tensor& gate_up) {
  TORCH_CHECK(gate_up.device().is_cpu() && gate_up.scalar_type() == at::kFloat && gate_up.is_contiguous() &&
                  gate_up.dim() == 2 && gate_up.size(1) % 2 == 0,
              "silu_mul: gate_up must be a contiguous fp32 CPU tensor [T, 2I]");
  const int64_t T = gate_up.size(0), n = gate_up.size(1) / 2;
  auto out = at::empty({T, n}, gate_up.options());
  const float* gp = gate_up.data_ptr<float>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, T, std::max<int64_t>(1, 16384 / std::max<int64_t>(n, 1)), [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const float *g = gp + t * 2 * n, *u = g + n;
      float* o = op + t * n;
      for (int64_t i = 0; i < n; ++i) o[i] = (g[i] / (1.0f + rlm::fast_exp(-g[i]))) * u[i];
    }
  });
  return out;
}

}  // namespace rlm

RADIXLM_OPS(m) { m.def("silu_mul(Tensor gate_up) -> Tensor", rlm::silu_mul); }
