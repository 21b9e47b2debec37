// The ops one op file calls from another (decode_layer.cpp chains them); each is defined, documented and
// registered in its own file.
#pragma once
#include <ATen/ATen.h>

namespace rlm {

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& w, double eps);                        // norm.cpp
at::Tensor add_rms_norm(const at::Tensor& x, at::Tensor& residual, const at::Tensor& w, double eps);  // norm.cpp
at::Tensor rope_store_kv(const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& ssin,
                         at::Tensor& k_buf, at::Tensor& v_buf, const at::Tensor& loc, int64_t hq,
                         int64_t hkv);  // attention.cpp
at::Tensor paged_decode_attention(const at::Tensor& q, const at::Tensor& k_buf, const at::Tensor& v_buf,
                                  const at::Tensor& req_to_token, const at::Tensor& req_rows,
                                  const at::Tensor& seq_lens, double scale);  // attention.cpp
at::Tensor silu_mul(const at::Tensor& gate_up);  // activation.cpp
at::Tensor int8_linear(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scales,
                       const std::optional<at::Tensor>& bias);  // gemv.cpp
at::Tensor f32_linear(const at::Tensor& x, const at::Tensor& packed, int64_t n,
                      const std::optional<at::Tensor>& bias);  // gemv.cpp

}  // namespace rlm
