// GGUF weights as the file stores them: rows of quantized blocks (llama.cpp's ggml formats), read in place.
//
//   gguf_dequantize(blocks, qtype, in)        fp32 [rows, in] of a [rows, row_bytes] uint8 block matrix
//                                             (the embedding lookup, and many-row steps' matmuls by tiles)
//   gguf_linear(x, blocks[], qtypes[], bias)  y = x @ W^T for fp32 x [M, in] and W the row concatenation of
//                                             the given block matrices (q/k/v or gate/up, each in its own
//                                             type), for the few rows of a decode step
//
// Each weight row is dequantized once into an fp32 buffer that stays in L1/L2, then multiplied with every
// row of x. The activations stay fp32 (no int8 rounding of x as in llama.cpp's dot products), so the result
// is the float matmul of the dequantized weight, which is what the tests compare against
// (gguf.quants.dequantize + a matmul). A dot product's summation order depends only on `in`: a row's
// result has the same bits alone and in any batch.
#include "gguf_common.h"

namespace rlm::gguf {

// ---- one block -> fp32 (ggml's dequantize_row_* for one block, the same float operations) ------------

void deq_f32(const uint8_t* b, float* y) { std::memcpy(y, b, 32 * sizeof(float)); }

void deq_f16(const uint8_t* b, float* y) {
  for (int h = 0; h < 32; h += 8)
    _mm256_storeu_ps(y + h, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 2 * h))));
}

void deq_bf16(const uint8_t* b, float* y) {
  for (int h = 0; h < 32; h += 8) {
    const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 2 * h)));
    _mm256_storeu_ps(y + h, _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16)));
  }
}

void deq_q4_0(const uint8_t* b, float* y) {
  const float d = f16(b);
  const i32x16 q = load_u8(b + 2);
  store(y, to_f32((q & 0x0F) - 8) * d);
  store(y + 16, to_f32((q >> 4) - 8) * d);
}

void deq_q4_1(const uint8_t* b, float* y) {
  const float d = f16(b), m = f16(b + 2);
  const i32x16 q = load_u8(b + 4);
  store(y, to_f32(q & 0x0F) * d + m);
  store(y + 16, to_f32(q >> 4) * d + m);
}

// The fifth bits of a Q5 block's 32 values (bit j of qh is value j's), for values `first` .. first + 15.
inline i32x16 high_bits(uint32_t qh, int first) {
  const i32x16 word = i32x16{} + int32_t(qh >> first);
  return ((word >> LANE) & 1) << 4;
}

void deq_q5_0(const uint8_t* b, float* y) {
  const float d = f16(b);
  uint32_t qh;
  std::memcpy(&qh, b + 2, 4);
  const i32x16 q = load_u8(b + 6);
  store(y, to_f32(((q & 0x0F) | high_bits(qh, 0)) - 16) * d);
  store(y + 16, to_f32(((q >> 4) | high_bits(qh, 16)) - 16) * d);
}

void deq_q5_1(const uint8_t* b, float* y) {
  const float d = f16(b), m = f16(b + 2);
  uint32_t qh;
  std::memcpy(&qh, b + 4, 4);
  const i32x16 q = load_u8(b + 8);
  store(y, to_f32((q & 0x0F) | high_bits(qh, 0)) * d + m);
  store(y + 16, to_f32((q >> 4) | high_bits(qh, 16)) * d + m);
}

void deq_q8_0(const uint8_t* b, float* y) {
  const float d = f16(b);
  store(y, to_f32(load_i8(b + 2)) * d);
  store(y + 16, to_f32(load_i8(b + 18)) * d);
}

void deq_q2_k(const uint8_t* b, float* y) {
  const uint8_t* scales = b;
  const uint8_t* q = b + 16;
  const float d = f16(b + 80), dmin = f16(b + 82);
  int is = 0;
  for (int n = 0; n < 256; n += 128, q += 32) {
    for (int shift = 0; shift < 8; shift += 2) {
      for (int half = 0; half < 2; ++half, ++is) {
        const float dl = d * float(scales[is] & 0x0F), ml = dmin * float(scales[is] >> 4);
        for (int l = 0; l < 16; ++l) *y++ = dl * float((q[l + 16 * half] >> shift) & 3) - ml;
      }
    }
  }
}

// Q3_K's sixteen 6-bit scales, unpacked from 12 bytes as ggml does.
void q3_k_scales(const uint8_t* packed, int8_t out[16]) {
  constexpr uint32_t kmask1 = 0x03030303, kmask2 = 0x0f0f0f0f;
  uint32_t aux[4];
  std::memcpy(aux, packed, 12);
  const uint32_t tmp = aux[2];
  aux[2] = ((aux[0] >> 4) & kmask2) | (((tmp >> 4) & kmask1) << 4);
  aux[3] = ((aux[1] >> 4) & kmask2) | (((tmp >> 6) & kmask1) << 4);
  aux[0] = (aux[0] & kmask2) | (((tmp >> 0) & kmask1) << 4);
  aux[1] = (aux[1] & kmask2) | (((tmp >> 2) & kmask1) << 4);
  std::memcpy(out, aux, 16);
}

void deq_q3_k(const uint8_t* b, float* y) {
  const uint8_t* hm = b;
  const uint8_t* q = b + 32;
  int8_t scales[16];
  q3_k_scales(b + 96, scales);
  const float d = f16(b + 108);
  int is = 0;
  uint8_t m = 1;
  for (int n = 0; n < 256; n += 128, q += 32) {
    for (int shift = 0; shift < 8; shift += 2, m <<= 1) {
      for (int half = 0; half < 2; ++half, ++is) {
        const float dl = d * float(scales[is] - 32);
        for (int l = 16 * half; l < 16 * half + 16; ++l)
          *y++ = dl * float(int((q[l] >> shift) & 3) - ((hm[l] & m) ? 0 : 4));
      }
    }
  }
}

// Q4_K / Q5_K: sub-block j's 6-bit scale and min (ggml's get_scale_min_k4).
inline void scale_min_k4(int j, const uint8_t* q, uint8_t& sc, uint8_t& mn) {
  if (j < 4) {
    sc = q[j] & 63;
    mn = q[j + 4] & 63;
  } else {
    sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    mn = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// Q4_K / Q5_K: the float scale and min of sub-block j (ggml: d * sc, dmin * m).
struct SubScale {
  float d, m;
};

inline SubScale sub_scale(int j, const uint8_t* block) {
  uint8_t sc, mn;
  scale_min_k4(j, block + 4, sc, mn);
  return {f16(block) * float(sc), f16(block + 2) * float(mn)};
}

void deq_q4_k(const uint8_t* b, float* y) {
  const uint8_t* q = b + 16;
  for (int j = 0; j < 8; j += 2, q += 32, y += 64) {
    const auto [d1, m1] = sub_scale(j, b);
    const auto [d2, m2] = sub_scale(j + 1, b);
    for (int l = 0; l < 32; l += 16) {
      const i32x16 v = load_u8(q + l);
      store(y + l, d1 * to_f32(v & 0xF) - m1);
      store(y + l + 32, d2 * to_f32(v >> 4) - m2);
    }
  }
}

void deq_q5_k(const uint8_t* b, float* y) {
  const uint8_t* qh = b + 16;
  const uint8_t* ql = b + 48;
  for (int j = 0, shift = 0; j < 8; j += 2, ql += 32, y += 64, shift += 2) {
    const auto [d1, m1] = sub_scale(j, b);
    const auto [d2, m2] = sub_scale(j + 1, b);
    for (int l = 0; l < 32; l += 16) {
      const i32x16 v = load_u8(ql + l), h = load_u8(qh + l);
      store(y + l, d1 * to_f32((v & 0xF) + ((h >> shift) & 1) * 16) - m1);
      store(y + l + 32, d2 * to_f32((v >> 4) + ((h >> (shift + 1)) & 1) * 16) - m2);
    }
  }
}

void deq_q6_k(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
  const float d = f16(b + 208);
  for (int n = 0; n < 256; n += 128, ql += 64, qh += 32, sc += 8, y += 128) {
    for (int l = 0, is = 0; l < 32; l += 16, ++is) {
      const i32x16 lo = load_u8(ql + l), hi = load_u8(ql + l + 32), h = load_u8(qh + l);
      store(y + l, (d * float(sc[is])) * to_f32(((lo & 0xF) | ((h & 3) << 4)) - 32));
      store(y + l + 32, (d * float(sc[is + 2])) * to_f32(((hi & 0xF) | (((h >> 2) & 3) << 4)) - 32));
      store(y + l + 64, (d * float(sc[is + 4])) * to_f32(((lo >> 4) | (((h >> 4) & 3) << 4)) - 32));
      store(y + l + 96, (d * float(sc[is + 6])) * to_f32(((hi >> 4) | (((h >> 6) & 3) << 4)) - 32));
    }
  }
}

using BlockFn = void (*)(const uint8_t*, float*);

// One weight row (`in` values) -> fp32. A template so each type's block function is inlined into the loop.
template <BlockFn Fn, int64_t Block, int64_t Bytes>
void dequantize_row(const uint8_t* row, int64_t in, float* y) {
  for (int64_t b = 0; b < in / Block; ++b) Fn(row + b * Bytes, y + b * Block);
}

RowFn row_fn(int64_t t) {
  switch (t) {
    case F32: return dequantize_row<deq_f32, 32, 128>;
    case F16: return dequantize_row<deq_f16, 32, 64>;
    case BF16: return dequantize_row<deq_bf16, 32, 64>;
    case Q4_0: return dequantize_row<deq_q4_0, 32, 18>;
    case Q4_1: return dequantize_row<deq_q4_1, 32, 20>;
    case Q5_0: return dequantize_row<deq_q5_0, 32, 22>;
    case Q5_1: return dequantize_row<deq_q5_1, 32, 24>;
    case Q8_0: return dequantize_row<deq_q8_0, 32, 34>;
    case Q2_K: return dequantize_row<deq_q2_k, 256, 84>;
    case Q3_K: return dequantize_row<deq_q3_k, 256, 110>;
    case Q4_K: return dequantize_row<deq_q4_k, 256, 144>;
    case Q5_K: return dequantize_row<deq_q5_k, 256, 176>;
    default: return dequantize_row<deq_q6_k, 256, 210>;
  }
}

// sum_i w[i] * x[i] over n (a multiple of 32) in four 16-lane accumulators: element i always adds into the
// same lane of the same accumulator and the lanes are summed in one fixed order, so the result depends
// only on n.
inline float dot(const float* __restrict w, const float* __restrict x, int64_t n) {
  f32x16 acc[4] = {};
  int64_t i = 0;
  for (; i + 64 <= n; i += 64)
    for (int a = 0; a < 4; ++a) acc[a] = fma16(load_f32(w + i + 16 * a), load_f32(x + i + 16 * a), acc[a]);
  for (int a = 0; i < n; i += 16, ++a) acc[a] = fma16(load_f32(w + i), load_f32(x + i), acc[a]);
  return hsum((acc[0] + acc[1]) + (acc[2] + acc[3]));
}

}  // namespace rlm::gguf

namespace rlm {

using namespace rlm::gguf;

at::Tensor gguf_dequantize(const at::Tensor& blocks, int64_t qtype, int64_t in) {
  check_blocks(blocks, qtype, in, "gguf_dequantize");
  const int64_t rows = blocks.size(0), stride = blocks.stride(0);
  const RowFn fn = row_fn(qtype);
  auto y = at::empty({rows, in}, blocks.options().dtype(at::kFloat));
  const uint8_t* src = blocks.data_ptr<uint8_t>();
  float* dst = y.data_ptr<float>();
  const int64_t grain = std::max<int64_t>(1, 16384 / in);
  at::parallel_for(0, rows, grain, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) fn(src + r * stride, in, dst + r * in);
  });
  return y;
}

at::Tensor gguf_linear(const at::Tensor& x, at::TensorList blocks, at::IntArrayRef qtypes,
                       const std::optional<at::Tensor>& bias) {
  std::vector<Part> parts;
  const int64_t n = parts_of(x, blocks, qtypes, bias, "gguf_linear", parts);
  const int64_t in = x.size(1), m = x.size(0);
  auto xc = x.contiguous();
  auto y = at::empty({m, n}, x.options());
  const float* xp = xc.data_ptr<float>();
  const float* bp = bias ? bias->data_ptr<float>() : nullptr;
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, n, grain_of(parts), [&](int64_t o0, int64_t o1) {
    std::vector<float> w(in);
    size_t p = 0;
    for (int64_t o = o0; o < o1; ++o) {
      while (o >= parts[p].first_out + parts[p].rows) ++p;
      const Part& part = parts[p];
      const uint8_t* row = part.data + (o - part.first_out) * part.row_stride;
      part.fn(row, in, w.data());
      for (int64_t r = 0; r < m; ++r) {
        const float v = dot(w.data(), xp + r * in, in);
        yp[r * n + o] = bp ? v + bp[o] : v;
      }
    }
  });
  return y;
}

}  // namespace rlm

RADIXLM_OPS(m) {
  m.def("gguf_dequantize(Tensor blocks, int qtype, int in_features) -> Tensor", rlm::gguf_dequantize);
  m.def("gguf_linear(Tensor x, Tensor[] blocks, int[] qtypes, Tensor? bias) -> Tensor", rlm::gguf_linear);
}
