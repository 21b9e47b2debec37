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
at::Tensor decode_layer(const at::Tensor& x, at::Tensor& residual, const at::Tensor& in_norm,
                        const at::Tensor& post_norm, double eps, const at::Tensor& qkv_w,
                        const c10::optional<at::Tensor>& qkv_b, const at::Tensor& o_w, const at::Tensor& gate_up_w,
                        const at::Tensor& down_w, const at::Tensor& cos, const at::Tensor& ssin, at::Tensor& k_buf,
                        at::Tensor& v_buf, const at::Tensor& loc, const at::Tensor& req_to_token,
                        const at::Tensor& req_rows, const at::Tensor& seq_lens, int64_t hq, int64_t hkv,
                        double scale, bool first, const c10::optional<at::Tensor>& qkv_s,
                        const c10::optional<at::Tensor>& o_s, const c10::optional<at::Tensor>& gate_up_s,
                        const c10::optional<at::Tensor>& down_s, at::IntArrayRef tiled);  // decode_layer.cpp

}  // namespace rlm
