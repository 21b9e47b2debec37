// One decoder layer of a one-token decode step (Llama-family, fp32), as one op: the chain llama.py's
// DecoderLayer runs (norm, qkv matmul, rotary + K/V store, paged attention, o matmul, add + norm, gate/up
// matmul, SiLU * up, down matmul) without returning to Python between the steps. At one token the
// matmuls stream the weights at memory speed; what is left is ~30 Python-level calls a layer, which
// this removes. The matmuls are the same ATen calls as weight_layout.py's (bmm over row blocks, or
// linear), so the results are the same as the Python path's.
#include "common.h"
#include "ops.h"

#include <ATen/core/dispatch/Dispatcher.h>

namespace {

// oneDNN's inner product on a weight reordered by mkldnn::_reorder_linear_weight (weight_layout.pack), the
// op packed_linear calls; looked up once through the dispatcher (torch registers it, ATen has no C++ call).
at::Tensor onednn_linear(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& bias) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("mkldnn::_linear_pointwise", "")
          .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const c10::optional<at::Tensor>&,
                            c10::string_view, c10::List<c10::optional<c10::Scalar>>, c10::optional<c10::string_view>)>();
  return op.call(x, w, bias, "none", c10::List<c10::optional<c10::Scalar>>(), c10::nullopt);
}

// x [M, in] @ W^T as weight_layout.py's and quant/'s linear functions multiply one row: with tiled > 0, W is
// gemv.cpp's tiled copy of tiled output rows (int8 with its scales, or fp32 without); otherwise W is
// [p, out/p, in] (as_blocks: one bmm, a block per thread), oneDNN-packed (pack), or [out, in] (any strides:
// at::linear). The blocks' result [p, out/p, M] is [M, out] as is when M == 1.
at::Tensor project(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& scales,
                   int64_t tiled, const c10::optional<at::Tensor>& bias) {
  if (tiled > 0) {
    const auto b = bias.has_value() && bias->defined() ? bias : c10::optional<at::Tensor>();
    return scales.has_value() && scales->defined() ? rlm::int8_linear(x, w, *scales, b)
                                                   : rlm::f32_linear(x, w, tiled, b);
  }
  if (w.is_mkldnn()) return onednn_linear(x, w, bias);
  if (w.dim() == 2) return at::linear(x, w, bias);
  const int64_t p = w.size(0), rows = w.size(1), k = w.size(2), m = x.size(0);
  auto y = at::bmm(w, x.t().expand({p, k, m}));
  y = m == 1 ? y.view({1, p * rows}) : y.permute({2, 0, 1}).reshape({m, p * rows}).contiguous();
  if (bias.has_value() && bias->defined()) y.add_(*bias);
  return y;
}

}  // namespace

namespace rlm {

// x [T, hidden]: this layer's input (for the first layer, the embedding: then residual is x itself and
// first is true); residual [T, hidden] is updated in place (residual + attention, then + nothing more:
// the MLP output is returned for the next layer to add, as DecoderLayer.forward does).
at::Tensor decode_layer(const at::Tensor& x, at::Tensor& residual, const at::Tensor& in_norm,
                        const at::Tensor& post_norm, double eps, const at::Tensor& qkv_w,
                        const c10::optional<at::Tensor>& qkv_b, const at::Tensor& o_w, const at::Tensor& gate_up_w,
                        const at::Tensor& down_w, const at::Tensor& cos, const at::Tensor& ssin, at::Tensor& k_buf,
                        at::Tensor& v_buf, const at::Tensor& loc, const at::Tensor& req_to_token,
                        const at::Tensor& req_rows, const at::Tensor& seq_lens, int64_t hq, int64_t hkv,
                        double scale, bool first, const c10::optional<at::Tensor>& qkv_s,
                        const c10::optional<at::Tensor>& o_s, const c10::optional<at::Tensor>& gate_up_s,
                        const c10::optional<at::Tensor>& down_s, at::IntArrayRef tiled) {
  TORCH_CHECK(tiled.size() == 4, "decode_layer: tiled holds the 4 weights' tiled output rows (0: not tiled)");
  const auto h = first ? rlm::rms_norm(residual, in_norm, eps) : rlm::add_rms_norm(x, residual, in_norm, eps);
  const auto q = rlm::rope_store_kv(project(h, qkv_w, qkv_s, tiled[0], qkv_b), cos, ssin, k_buf, v_buf, loc, hq, hkv);
  const auto o = rlm::paged_decode_attention(q, k_buf, v_buf, req_to_token, req_rows, seq_lens, scale);
  const auto a = project(o.view({o.size(0), -1}), o_w, o_s, tiled[1], c10::nullopt);
  const auto h2 = rlm::add_rms_norm(a, residual, post_norm, eps);
  const auto act = rlm::silu_mul(project(h2, gate_up_w, gate_up_s, tiled[2], c10::nullopt));
  return project(act, down_w, down_s, tiled[3], c10::nullopt);
}

}  // namespace rlm

RADIXLM_OPS(m) {
  m.def("decode_layer(Tensor x, Tensor(a!) residual, Tensor in_norm, Tensor post_norm, float eps, Tensor qkv_w, "
        "Tensor? qkv_b, Tensor o_w, Tensor gate_up_w, Tensor down_w, Tensor cos, Tensor signed_sin, "
        "Tensor(b!) k_buf, Tensor(c!) v_buf, Tensor loc, Tensor req_to_token, Tensor req_rows, Tensor seq_lens, "
        "int num_q_heads, int num_kv_heads, float scale, bool first, Tensor? qkv_s, Tensor? o_s, Tensor? gate_up_s, "
        "Tensor? down_s, int[] tiled) -> Tensor",
        rlm::decode_layer);
}
