// Decode-step attention on the paged KV pool (fp32): rotary + K/V store from the fused qkv output, and
// attention that reads each row's K/V through its req_to_token slots. In torch the same step is ~10
// small ops a layer (rotary, two index_put stores, a gather of every cached K and V unless the slots are
// one run, SDPA); at one decode row their dispatch and the gather copy cost more than the arithmetic.
#include "common.h"
#include "ops.h"
#include "fast_exp.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

namespace {

void check_f32(const at::Tensor& t, const char* op, const char* name) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == at::kFloat && t.is_contiguous(), op, ": ", name,
              " must be a contiguous fp32 CPU tensor");
}

void check_i64(const at::Tensor& t, const char* op, const char* name) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == at::kLong && t.is_contiguous() && t.dim() == 1, op,
              ": ", name, " must be a contiguous 1-D int64 CPU tensor");
}

// HF rotate_half rotary of one head, with torch's exact fp32 arithmetic (layers/rotary.py's
// apply_rotary_one): out = x * cos + roll(x, D/2) * signed_sin, each product rounded, then the sum
// (the build's -ffp-contract=off keeps the compiler from fusing them into an FMA).
inline void rotate(const float* x, const float* cos, const float* ssin, float* out, int64_t d) {
  const int64_t h = d / 2;
  for (int64_t i = 0; i < h; ++i) out[i] = x[i] * cos[i] + x[i + h] * ssin[i];
  for (int64_t i = h; i < d; ++i) out[i] = x[i] * cos[i] + x[i - h] * ssin[i];
}

}  // namespace

namespace rlm {

// qkv [T, >= (Hq + 2 Hkv) D] (q heads, k heads, v heads side by side, as the fused projection writes
// them); cos / signed_sin [T, (1,) D] from RotaryEmbedding.lookup. Rotates q and k, writes k and v into
// the pool buffers [S, Hkv, D] at slots loc [T], returns the rotated q [T, Hq, D].
at::Tensor rope_store_kv(const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& ssin,
                         at::Tensor& k_buf, at::Tensor& v_buf, const at::Tensor& loc, int64_t hq, int64_t hkv) {
  const char* op = "rope_store_kv";
  for (const at::Tensor* t : std::initializer_list<const at::Tensor*>{&qkv, &cos, &ssin, &k_buf, &v_buf}) check_f32(*t, op, "every float input");
  check_i64(loc, op, "loc");
  const int64_t T = qkv.size(0), d = cos.size(-1);
  TORCH_CHECK(qkv.dim() == 2 && qkv.size(1) >= (hq + 2 * hkv) * d && d % 2 == 0, op, ": qkv must be [T, >= (",
              hq, " + 2 * ", hkv, ") * ", d, "]");
  TORCH_CHECK(cos.numel() == T * d && ssin.numel() == T * d && loc.size(0) == T, op,
              ": cos, signed_sin and loc need one row per token");
  TORCH_CHECK(k_buf.dim() == 3 && k_buf.size(1) == hkv && k_buf.size(2) == d && v_buf.sizes() == k_buf.sizes(),
              op, ": pool buffers must be [S, ", hkv, ", ", d, "]");
  auto q = at::empty({T, hq, d}, qkv.options());
  const int64_t width = qkv.size(1), slots = k_buf.size(0), kv = hkv * d;
  const float *xp = qkv.data_ptr<float>(), *cp = cos.data_ptr<float>(), *sp = ssin.data_ptr<float>();
  const int64_t* lp = loc.data_ptr<int64_t>();
  float *qp = q.data_ptr<float>(), *kp = k_buf.data_ptr<float>(), *vp = v_buf.data_ptr<float>();
  for (int64_t t = 0; t < T; ++t)
    TORCH_CHECK(lp[t] >= 0 && lp[t] < slots, op, ": slot ", lp[t], " is outside the pool");
  at::parallel_for(0, T, 16, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const float *x = xp + t * width, *c = cp + t * d, *s = sp + t * d;
      for (int64_t h = 0; h < hq; ++h) rotate(x + h * d, c, s, qp + (t * hq + h) * d, d);
      float* k = kp + lp[t] * kv;
      for (int64_t h = 0; h < hkv; ++h) rotate(x + (hq + h) * d, c, s, k + h * d, d);
      std::copy(x + (hq + hkv) * d, x + (hq + 2 * hkv) * d, vp + lp[t] * kv);
    }
  });
  return q;
}

}  // namespace rlm

namespace {

// Dot product in 16 independent lanes (vectorizes without reassociation flags), lanes summed pairwise.
inline float dot(const float* a, const float* b, int64_t n) {
  float lane[16] = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int j = 0; j < 16; ++j) lane[j] += a[i + j] * b[i + j];
  for (; i < n; ++i) lane[i % 16] += a[i] * b[i];
  for (int w = 8; w >= 1; w /= 2)
    for (int j = 0; j < w; ++j) lane[j] += lane[j + w];
  return lane[0];
}

// The G query heads that share one KV head, of one row, over the row's L cached tokens: scores, softmax
// (max-subtracted, fp32), weighted sum of V; each K and V row is read once for all G heads. Two passes
// over a scores buffer [G, L] rather than an online softmax: the scores fit in L1/L2, and the exps run as
// one vectorized loop. A (row, head)'s arithmetic is the same whatever else is in the batch (batch
// invariance). q and out: the G heads' [G, D], contiguous.
void attend_group(const float* q, const float* k_base, const float* v_base, const int64_t* slots, int64_t L,
                  int64_t stride, int64_t d, int64_t G, float scale, float* scores, float* out) {
  for (int64_t j = 0; j < L; ++j) {
    const float* k = k_base + slots[j] * stride;
    for (int64_t g = 0; g < G; ++g) scores[g * L + j] = dot(q + g * d, k, d) * scale;
  }
  for (int64_t g = 0; g < G; ++g) {
    float* s = scores + g * L;
    float m = s[0];
    for (int64_t j = 1; j < L; ++j) m = std::max(m, s[j]);
    for (int64_t j = 0; j < L; ++j) s[j] = rlm::fast_exp(s[j] - m);
  }
  std::fill(out, out + G * d, 0.0f);
  for (int64_t j = 0; j < L; ++j) {
    const float* v = v_base + slots[j] * stride;
    for (int64_t g = 0; g < G; ++g) {
      const float p = scores[g * L + j];
      float* o = out + g * d;
      for (int64_t i = 0; i < d; ++i) o[i] += p * v[i];
    }
  }
  for (int64_t g = 0; g < G; ++g) {
    const float* s = scores + g * L;
    float sum = 0.0f;
    for (int64_t j = 0; j < L; ++j) sum += s[j];
    const float inv = 1.0f / sum;
    for (int64_t i = 0; i < d; ++i) out[g * d + i] *= inv;
  }
}

#ifdef __AVX512F__
constexpr int W = 16;
#else
constexpr int W = 8;
#endif
typedef float vec __attribute__((vector_size(4 * W)));
typedef float v4 __attribute__((vector_size(16)));

inline vec loadv(const float* p) {
  vec r;
  std::memcpy(&r, p, sizeof r);
  return r;
}

inline float hsum(vec v) {
#ifdef __AVX512F__
  typedef float v8 __attribute__((vector_size(32)));
  v8 a = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) + __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
#else
  vec a = v;
#endif
  v4 b = __builtin_shufflevector(a, a, 0, 1, 2, 3) + __builtin_shufflevector(a, a, 4, 5, 6, 7);
  return (b[0] + b[2]) + (b[1] + b[3]);
}

// hsum of four vectors at once, [hsum(a0), hsum(a1), hsum(a2), hsum(a3)] with hsum's own order of adds
// (halves, then quarters, then (b0 + b2) + (b1 + b3)), so a score's bits do not depend on its place in a
// block of four: the shuffles of one reduction serve four keys.
inline v4 hsum4(vec a0, vec a1, vec a2, vec a3) {
  typedef float v8 __attribute__((vector_size(32)));
#ifdef __AVX512F__
  auto half = [](vec v) -> v8 {
    return __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) + __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
  };
  const v8 b0 = half(a0), b1 = half(a1), b2 = half(a2), b3 = half(a3);
#else
  const v8 b0 = a0, b1 = a1, b2 = a2, b3 = a3;
#endif
  // [a0's four quarter sums, a1's], [a2's, a3's]
  const v8 c01 = __builtin_shufflevector(b0, b1, 0, 1, 2, 3, 8, 9, 10, 11) + __builtin_shufflevector(b0, b1, 4, 5, 6, 7, 12, 13, 14, 15);
  const v8 c23 = __builtin_shufflevector(b2, b3, 0, 1, 2, 3, 8, 9, 10, 11) + __builtin_shufflevector(b2, b3, 4, 5, 6, 7, 12, 13, 14, 15);
  // [q0 + q2, q1 + q3] of a0, a2, a1, a3
  const v8 d = __builtin_shufflevector(c01, c23, 0, 1, 8, 9, 4, 5, 12, 13) + __builtin_shufflevector(c01, c23, 2, 3, 10, 11, 6, 7, 14, 15);
  return __builtin_shufflevector(d, d, 0, 4, 2, 6) + __builtin_shufflevector(d, d, 1, 5, 3, 7);
}

constexpr int64_t kMaxGroup = 8;

// The max of s[0..n) in W lanes (max is exact in any order: the same value as a sequential loop, which
// the compiler cannot vectorize without reassociation flags and which ran at one compare's latency a
// score, ~20% of the kernel).
inline float row_max(const float* s, int64_t n) {
  float m = s[0];
  int64_t j = 0;
  if (n >= W) {
    vec mv = loadv(s);
    for (j = W; j + W <= n; j += W) {
      const vec x = loadv(s + j);
      mv = x > mv ? x : mv;
    }
    for (int i = 0; i < W; ++i) m = std::max(m, mv[i]);
  }
  for (; j < n; ++j) m = std::max(m, s[j]);
  return m;
}

// The sum of s[0..n) in W lanes, the lanes then halved (hsum) and the tail added last: a fixed order for
// every row, as the dot products'; a sequential sum ran at one add's latency a score.
inline float lane_sum(const float* s, int64_t n) {
  vec acc{};
  int64_t j = 0;
  for (; j + W <= n; j += W) acc += loadv(s + j);
  float sum = hsum(acc);
  for (; j < n; ++j) sum += s[j];
  return sum;
}

// Software prefetch of the K or V rows of n slots (their slots are anywhere in the pool: the hardware
// prefetchers do not follow them).
inline void prefetch_rows(const float* base, const int64_t* slots, int64_t stride, int64_t d, int n = 4) {
  for (int t = 0; t < n; ++t)
    for (int64_t i = 0; i < d; i += 16) __builtin_prefetch(base + slots[t] * stride + i);
}

// attend_group for a head size of W * C and at most kMaxGroup queries that share one KV head, written
// with GCC vector types of the build's width W (16 floats with AVX-512, 8 with AVX2: wider generic vectors
// are split badly on AVX2), so that q, each K/V row and the output accumulators stay in registers (the
// generic loops above keep them in memory: ~3x slower). Same two passes; the dot products are summed in
// W lanes, then halved (a fixed order for every row, not the generic loops' order). Query i attends to
// the first lens[i] slots, lens ascending: a decode row's G heads all see the row (one length); an extend
// row's new tokens each see the tokens up to their own (paged_extend_attention: several tokens' heads in
// one call, so each K and V row is read once for all of them). A query's arithmetic depends only on its
// own length (hsum4's score bits are hsum's, its softmax runs over its own scores, V is summed over its
// own keys in order), so a token of an extend row gets the bits it gets as a decode row.
template <int C>
void attend_vec(const float* const* qs, float* const* outs, const int64_t* lens, int64_t NQ,
                const float* k_base, const float* v_base, const int64_t* slots, int64_t stride, float scale,
                float* scores) {
  constexpr int64_t d = W * C;
  const int64_t L = lens[NQ - 1], L0 = lens[0];
  vec qv[kMaxGroup][C], acc[kMaxGroup][C];
  for (int64_t g = 0; g < NQ; ++g)
    for (int c = 0; c < C; ++c) qv[g][c] = loadv(qs[g] + W * c);
  int64_t j = 0;
  for (; j + 4 <= L; j += 4) {
    const float* k[4];
    for (int t = 0; t < 4; ++t) k[t] = k_base + slots[j + t] * stride;
    if (j + 12 <= L) prefetch_rows(k_base, slots + j + 8, stride, d);
    for (int64_t g = 0; g < NQ; ++g) {
      if (j >= lens[g]) continue;
      vec a[4];
      for (int t = 0; t < 4; ++t) {
        a[t] = qv[g][0] * loadv(k[t]);
        for (int c = 1; c < C; ++c) a[t] += qv[g][c] * loadv(k[t] + W * c);
      }
      const v4 s4 = hsum4(a[0], a[1], a[2], a[3]) * scale;
      std::memcpy(scores + g * L + j, &s4, sizeof s4);
    }
  }
  for (; j < L; ++j) {
    const float* k = k_base + slots[j] * stride;
    for (int64_t g = 0; g < NQ; ++g) {
      if (j >= lens[g]) continue;
      vec a = qv[g][0] * loadv(k);
      for (int c = 1; c < C; ++c) a += qv[g][c] * loadv(k + W * c);
      scores[g * L + j] = hsum(a) * scale;
    }
  }
  float sums[kMaxGroup];
  for (int64_t g = 0; g < NQ; ++g) {
    float* sg = scores + g * L;
    const int64_t n = lens[g];
    const float m = row_max(sg, n);
    for (int64_t i = 0; i < n; ++i) sg[i] = rlm::fast_exp(sg[i] - m);
    sums[g] = lane_sum(sg, n);
    for (int c = 0; c < C; ++c) acc[g][c] = vec{};
  }
  for (j = 0; j < L0; ++j) {  // keys every query sees
    const float* v = v_base + slots[j] * stride;
    if (j + 8 < L) prefetch_rows(v_base, slots + j + 8, stride, d, 1);
    vec vv[C];
    for (int c = 0; c < C; ++c) vv[c] = loadv(v + W * c);
    for (int64_t g = 0; g < NQ; ++g) {
      const float p = scores[g * L + j];
      for (int c = 0; c < C; ++c) acc[g][c] += p * vv[c];
    }
  }
  for (; j < L; ++j) {  // the row's new keys: each query sees those before it
    const float* v = v_base + slots[j] * stride;
    vec vv[C];
    for (int c = 0; c < C; ++c) vv[c] = loadv(v + W * c);
    for (int64_t g = 0; g < NQ; ++g) {
      if (j >= lens[g]) continue;
      const float p = scores[g * L + j];
      for (int c = 0; c < C; ++c) acc[g][c] += p * vv[c];
    }
  }
  for (int64_t g = 0; g < NQ; ++g) {
    const float inv = 1.0f / sums[g];
    for (int c = 0; c < C; ++c) {
      const vec o = acc[g][c] * inv;
      std::memcpy(outs[g] + W * c, &o, sizeof o);
    }
  }
}

// Whether attend_vec serves this head size and group (else the generic loops).
inline bool vec_fits(int64_t d, int64_t G) { return G <= kMaxGroup && (d == 64 || d == 128); }

// attend_vec for a head size vec_fits accepts.
void attend_queries(const float* const* qs, float* const* outs, const int64_t* lens, int64_t NQ, int64_t d,
                    const float* k_base, const float* v_base, const int64_t* slots, int64_t stride, float scale,
                    float* scores) {
  if (d == 64) return attend_vec<64 / W>(qs, outs, lens, NQ, k_base, v_base, slots, stride, scale, scores);
  attend_vec<128 / W>(qs, outs, lens, NQ, k_base, v_base, slots, stride, scale, scores);
}

// One decode row's G heads of one KV head: the fast path where it applies, else the generic loops.
void attend(const float* q, const float* k_base, const float* v_base, const int64_t* slots, int64_t L,
            int64_t stride, int64_t d, int64_t G, float scale, float* scores, float* out) {
  if (!vec_fits(d, G)) return attend_group(q, k_base, v_base, slots, L, stride, d, G, scale, scores, out);
  const float* qs[kMaxGroup];
  float* outs[kMaxGroup];
  int64_t lens[kMaxGroup];
  for (int64_t g = 0; g < G; ++g) qs[g] = q + g * d, outs[g] = out + g * d, lens[g] = L;
  attend_queries(qs, outs, lens, G, d, k_base, v_base, slots, stride, scale, scores);
}

// The checks both attention ops make: fp32 q [T, Hq, D] and pool buffers [S, Hkv, D] that agree, Hq a
// multiple of Hkv, an int64 req_to_token with contiguous rows, int64 req_rows.
void check_attention(const char* op, const at::Tensor& q, const at::Tensor& k_buf, const at::Tensor& v_buf,
                     const at::Tensor& req_to_token, const at::Tensor& req_rows) {
  for (const at::Tensor* t : std::initializer_list<const at::Tensor*>{&q, &k_buf, &v_buf}) check_f32(*t, op, "q and the pool buffers");
  check_i64(req_rows, op, "req_rows");
  TORCH_CHECK(req_to_token.scalar_type() == at::kLong && req_to_token.dim() == 2 && req_to_token.stride(1) == 1,
              op, ": req_to_token must be int64 [R, C] with contiguous rows");
  TORCH_CHECK(q.dim() == 3 && k_buf.dim() == 3 && k_buf.size(2) == q.size(2) && v_buf.sizes() == k_buf.sizes(),
              op, ": q [T, Hq, D] and pool buffers [S, Hkv, D] disagree");
  TORCH_CHECK(q.size(1) % k_buf.size(1) == 0, op, ": ", q.size(1), " query heads are not a multiple of ",
              k_buf.size(1), " KV heads");
}

// Queries a pass of attend_vec takes (whole tokens of G heads): its q and accumulators stay in
// registers up to about this many.
constexpr int64_t kTokenQueries = 6;

}  // namespace

namespace rlm {

// q [b, Hq, D]: one query per row (decode); row r attends to slots req_to_token[req_rows[r], :seq_lens[r]]
// of the pool buffers [S, Hkv, D] (GQA: query head h reads KV head h / (Hq / Hkv)). -> [b, Hq, D].
at::Tensor paged_decode_attention(const at::Tensor& q, const at::Tensor& k_buf, const at::Tensor& v_buf,
                                  const at::Tensor& req_to_token, const at::Tensor& req_rows,
                                  const at::Tensor& seq_lens, double scale) {
  const char* op = "paged_decode_attention";
  check_attention(op, q, k_buf, v_buf, req_to_token, req_rows);
  check_i64(seq_lens, op, "seq_lens");
  const int64_t b = q.size(0), hq = q.size(1), d = q.size(2), hkv = k_buf.size(1);
  TORCH_CHECK(req_rows.size(0) == b && seq_lens.size(0) == b, op, ": req_rows and seq_lens need b entries");
  const int64_t *rp = req_rows.data_ptr<int64_t>(), *lp = seq_lens.data_ptr<int64_t>();
  const int64_t* table = req_to_token.data_ptr<int64_t>();
  const int64_t rstride = req_to_token.stride(0), slots_n = k_buf.size(0);
  int64_t max_len = 1;
  for (int64_t r = 0; r < b; ++r) {
    TORCH_CHECK(rp[r] >= 0 && rp[r] < req_to_token.size(0) && lp[r] >= 1 && lp[r] <= req_to_token.size(1),
                op, ": row ", r, " has a bad request index or length");
    const int64_t* s = table + rp[r] * rstride;
    for (int64_t j = 0; j < lp[r]; ++j)
      TORCH_CHECK(s[j] >= 0 && s[j] < slots_n, op, ": slot ", s[j], " is outside the pool");
    max_len = std::max(max_len, lp[r]);
  }
  auto out = at::empty_like(q);
  const float *qp = q.data_ptr<float>(), *kp = k_buf.data_ptr<float>(), *vp = v_buf.data_ptr<float>();
  float* op_ = out.data_ptr<float>();
  const int64_t group = hq / hkv, stride = hkv * d;
  // One task per (row, KV head): its G query heads share every K/V row read. Tasks are spread over the
  // threads only when each has enough work to pay for waking them (~64K multiply-adds; a short decode
  // row measured no faster on 2 threads than on 1).
  const int64_t grain = std::max<int64_t>(1, 65536 / std::max<int64_t>(1, group * max_len * d));
  at::parallel_for(0, b * hkv, grain, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(group * max_len);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t r = task / hkv, kvh = task % hkv;
      attend(qp + task * group * d, kp + kvh * d, vp + kvh * d, table + rp[r] * rstride, lp[r], stride, d,
                   group, float(scale), scores.data(), op_ + task * group * d);
    }
  });
  return out;
}

// q [T, Hq, D]: the new tokens of R extend rows, row r's extend_lens[r] tokens after the previous rows';
// token t of row r attends to slots req_to_token[req_rows[r], :prefix_lens[r] + t + 1] (its K/V and those
// before it already stored): each token as a decode row of paged_decode_attention, with the same bits,
// each row's K/V read once for several of its tokens (kTokenQueries). -> [T, Hq, D].
at::Tensor paged_extend_attention(const at::Tensor& q, const at::Tensor& k_buf, const at::Tensor& v_buf,
                                  const at::Tensor& req_to_token, const at::Tensor& req_rows,
                                  const at::Tensor& prefix_lens, const at::Tensor& extend_lens, double scale) {
  const char* op = "paged_extend_attention";
  check_attention(op, q, k_buf, v_buf, req_to_token, req_rows);
  check_i64(prefix_lens, op, "prefix_lens");
  check_i64(extend_lens, op, "extend_lens");
  const int64_t R = req_rows.size(0), hq = q.size(1), d = q.size(2), hkv = k_buf.size(1);
  TORCH_CHECK(prefix_lens.size(0) == R && extend_lens.size(0) == R, op, ": prefix_lens and extend_lens need one entry a row");
  const int64_t *rp = req_rows.data_ptr<int64_t>(), *pp = prefix_lens.data_ptr<int64_t>(), *ep = extend_lens.data_ptr<int64_t>();
  const int64_t* table = req_to_token.data_ptr<int64_t>();
  const int64_t rstride = req_to_token.stride(0), slots_n = k_buf.size(0);
  std::vector<int64_t> start(R + 1, 0);
  int64_t max_len = 1, max_new = 1;
  for (int64_t r = 0; r < R; ++r) {
    const int64_t len = pp[r] + ep[r];
    TORCH_CHECK(rp[r] >= 0 && rp[r] < req_to_token.size(0) && pp[r] >= 0 && ep[r] >= 1 && len <= req_to_token.size(1),
                op, ": row ", r, " has a bad request index or length");
    const int64_t* s = table + rp[r] * rstride;
    for (int64_t j = 0; j < len; ++j)
      TORCH_CHECK(s[j] >= 0 && s[j] < slots_n, op, ": slot ", s[j], " is outside the pool");
    start[r + 1] = start[r] + ep[r];
    max_len = std::max(max_len, len);
    max_new = std::max(max_new, ep[r]);
  }
  TORCH_CHECK(start[R] == q.size(0), op, ": q has ", q.size(0), " tokens, the rows ", start[R]);
  auto out = at::empty_like(q);
  const float *qp = q.data_ptr<float>(), *kp = k_buf.data_ptr<float>(), *vp = v_buf.data_ptr<float>();
  float* op_ = out.data_ptr<float>();
  const int64_t group = hq / hkv, stride = hkv * d;
  const bool fast = vec_fits(d, group);
  const int64_t per_pass = fast ? std::max<int64_t>(1, kTokenQueries / group) : 1;  // tokens a pass
  const int64_t grain = std::max<int64_t>(1, 65536 / std::max<int64_t>(1, group * max_new * max_len * d));
  // One task per (row, KV head), as paged_decode_attention's (row, KV head) of each token.
  at::parallel_for(0, R * hkv, grain, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(std::max(group, per_pass * group) * max_len);
    const float* qs[kMaxGroup];
    float* outs[kMaxGroup];
    int64_t lens[kMaxGroup];
    for (int64_t task = begin; task < end; ++task) {
      const int64_t r = task / hkv, kvh = task % hkv;
      const int64_t* slots = table + rp[r] * rstride;
      for (int64_t t0 = 0; t0 < ep[r]; t0 += per_pass) {
        const int64_t nt = std::min(per_pass, ep[r] - t0);
        if (!fast) {
          const int64_t base = ((start[r] + t0) * hq + kvh * group) * d;
          attend(qp + base, kp + kvh * d, vp + kvh * d, slots, pp[r] + t0 + 1, stride, d, group, float(scale),
                 scores.data(), op_ + base);
          continue;
        }
        int64_t nq = 0;
        for (int64_t t = t0; t < t0 + nt; ++t)
          for (int64_t g = 0; g < group; ++g, ++nq) {
            const int64_t base = ((start[r] + t) * hq + kvh * group + g) * d;
            qs[nq] = qp + base;
            outs[nq] = op_ + base;
            lens[nq] = pp[r] + t + 1;
          }
        attend_queries(qs, outs, lens, nq, d, kp + kvh * d, vp + kvh * d, slots, stride, float(scale), scores.data());
      }
    }
  });
  return out;
}

}  // namespace rlm

RADIXLM_OPS(m) {
  m.def("rope_store_kv(Tensor qkv, Tensor cos, Tensor signed_sin, Tensor(a!) k_buf, Tensor(b!) v_buf, "
        "Tensor loc, int num_q_heads, int num_kv_heads) -> Tensor",
        rlm::rope_store_kv);
  m.def("paged_decode_attention(Tensor q, Tensor k_buf, Tensor v_buf, Tensor req_to_token, Tensor req_rows, "
        "Tensor seq_lens, float scale) -> Tensor",
        rlm::paged_decode_attention);
  m.def("paged_extend_attention(Tensor q, Tensor k_buf, Tensor v_buf, Tensor req_to_token, Tensor req_rows, "
        "Tensor prefix_lens, Tensor extend_lens, float scale) -> Tensor",
        rlm::paged_extend_attention);
}
