// Every decoder layer of a one-token decode step, then the final add + RMSNorm, in one call. decode_layer
// removed the Python between a layer's ops; what was left at one row is the Python between the layers (the
// module calls, the argument lists built and parsed per layer), about a millisecond a token for 30
// layers. DecodeStack holds each layer's weights and K/V buffers once (from cpu_ops.py, after the KV pool
// exists), so a step passes only what changes per step. The chain and its ops are decode_layer's: the
// results are the same bits as calling it layer by layer.
#include "common.h"
#include "ops.h"

#include <torch/custom_class.h>

#include <vector>

namespace {

struct Layer {
  at::Tensor in_norm, post_norm, qkv_w, o_w, gate_up_w, down_w, k_buf, v_buf;
  c10::optional<at::Tensor> qkv_b, qkv_s, o_s, gate_up_s, down_s;
  std::vector<int64_t> tiled;
};

struct DecodeStack : torch::CustomClassHolder {
  DecodeStack(double eps, int64_t hq, int64_t hkv, at::Tensor final_norm)
      : eps(eps), hq(hq), hkv(hkv), final_norm(std::move(final_norm)) {}

  // Layers are added in order; the arguments are decode_layer's per-layer ones.
  void add_layer(at::Tensor in_norm, at::Tensor post_norm, at::Tensor qkv_w, c10::optional<at::Tensor> qkv_b,
                 at::Tensor o_w, at::Tensor gate_up_w, at::Tensor down_w, at::Tensor k_buf, at::Tensor v_buf,
                 c10::optional<at::Tensor> qkv_s, c10::optional<at::Tensor> o_s,
                 c10::optional<at::Tensor> gate_up_s, c10::optional<at::Tensor> down_s, std::vector<int64_t> tiled) {
    TORCH_CHECK(tiled.size() == 4, "DecodeStack.add_layer: tiled holds the 4 weights' tiled output rows");
    layers.push_back(Layer{in_norm, post_norm, qkv_w, o_w, gate_up_w, down_w, k_buf, v_buf, qkv_b, qkv_s, o_s,
                           gate_up_s, down_s, std::move(tiled)});
  }

  // x [1, hidden]: the embedding of the step's token (updated in place: it is the first layer's residual).
  // Returns the final norm's output [1, hidden], what the LM head multiplies.
  at::Tensor forward(at::Tensor x, at::Tensor cos, at::Tensor ssin, at::Tensor loc, at::Tensor req_to_token,
                     at::Tensor req_rows, at::Tensor seq_lens, double scale) {
    TORCH_CHECK(!layers.empty(), "DecodeStack.forward: no layers added");
    TORCH_CHECK(x.dim() == 2 && x.size(0) == 1, "DecodeStack.forward: one token, x [1, hidden]");
    at::Tensor residual = x, out = x;
    for (size_t i = 0; i < layers.size(); ++i) {
      Layer& l = layers[i];
      out = rlm::decode_layer(out, residual, l.in_norm, l.post_norm, eps, l.qkv_w, l.qkv_b, l.o_w, l.gate_up_w,
                              l.down_w, cos, ssin, l.k_buf, l.v_buf, loc, req_to_token, req_rows, seq_lens, hq,
                              hkv, scale, i == 0, l.qkv_s, l.o_s, l.gate_up_s, l.down_s, l.tiled);
    }
    return rlm::add_rms_norm(out, residual, final_norm, eps);
  }

  int64_t num_layers() const { return static_cast<int64_t>(layers.size()); }

  double eps;
  int64_t hq, hkv;
  at::Tensor final_norm;
  std::vector<Layer> layers;
};

}  // namespace

RADIXLM_OPS(m) {
  m.class_<DecodeStack>("DecodeStack")
      .def(torch::init<double, int64_t, int64_t, at::Tensor>())
      .def("add_layer", &DecodeStack::add_layer)
      .def("forward", &DecodeStack::forward)
      .def("num_layers", &DecodeStack::num_layers);
}
