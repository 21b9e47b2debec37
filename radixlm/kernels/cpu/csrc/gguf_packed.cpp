// GGUF weights repacked once at load into panels of 16 rows, for few-row steps (decode) at any batch size.
//
//   gguf_pack(blocks, qtype)                        uint8 [panels, panel_bytes]: a [rows, row_bytes] block
//                                                   matrix of Q5_0, Q8_0, Q4_K or Q6_K, 16 rows a panel
//   gguf_packed_dequantize(packed, qtype, in, rows) fp32 [rows, in], bit for bit gguf_dequantize's
//   gguf_linear_packed(x, packed[], qtypes[], rows[], bias)
//                                                   y = x @ W^T for fp32 x [M, in], W the row concatenation
//                                                   of the packed parts; x rounded to int8 per 32 values
//
// Why a panel: the row-major blocks put one output's 4-value partial sums in the 16 lanes of a vector, so
// every 64 values of every activation row cost a float conversion, a scale product and an FMA, and a
// horizontal sum at the end. In a panel, lane j of a vector holds 4 consecutive values of weight row j:
// one dpbusd of a panel vector with 4 activation bytes broadcast adds 4 products to each of 16 outputs, an
// int32 sum covers a whole 32-value block (one scale), and the float work is one conversion and one FMA
// per 32 values x 16 outputs. Each panel vector is unpacked once per pass and used by every activation row
// of the pass (kRowTile: 16 with AVX-512, so a 16-row decode step unpacks each weight once), and the panel is
// as large as the file's blocks (the same bits, regrouped). A thread reads its panels as one stream, asking
// for the lines PF_AHEAD bytes ahead (a single row is bound by memory).
//
// A panel's 32-value block (16 rows): low 4 bits of each value in 4 x 64 bytes (byte 4j + t of part c: value
// 4c + t of row j in the low nibble, value 16 + 4c + t in the high one), then the fifth (and sixth) bits as
// 64-bit masks, one per 4-value group g (bit 4j + t: value 4g + t of row j). Q8_0 keeps its int8 values in
// the same 4-value groups. Scales stay as the file has them (fp16 d; Q4_K / Q6_K: the sub-block scales as
// bytes), converted to fp32 per panel as the dequantizer does, so the products are ggml's.
//
// Every output is  sum over blocks b of  fp32(int32 dot of block b) * (a * dx_b)  (+ min * dx_b * sum q_b),
// accumulated block by block in one order whatever M is and in every ISA build (the int32 sums are exact with
// VNNI or maddubs): a row's result has the same bits alone and in any batch, in the native and AVX2 builds.
#include "gguf_common.h"

namespace rlm::gguf {
namespace {

using u8x64 = uint8_t __attribute__((vector_size(64)));

constexpr int kPanel = 16;   // weight rows per panel (one output per fp32 lane)
// Activation rows per pass over a panel: as many accumulators as the registers hold (32 zmm with AVX-512).
#ifdef __AVX512F__
constexpr int kRowTile = 16;
#else
constexpr int kRowTile = 8;
#endif

// ---- bytes per panel block, per type ----------------------------------------------------------------------

// Q5_0: [d: 16 fp16][low nibbles: 256][fifth bits: 8 x u64]               per 32 values
// Q8_0: [d: 16 fp16][int8 values: 512]                                      per 32 values
// Q4_K: [d, dmin: 16 fp16 each][scales: 8 x 16 u8][mins: 8 x 16 u8][8 x 256 nibbles]   per 256 values
// Q6_K: [d: 16 fp16][scales: 16 x 16 i8][8 x 256 nibbles][8 x 128: bits 4-5, 2 bits per value]
struct Layout {
  int64_t values, bytes;
};

inline bool packable(int64_t t) { return t == Q5_0 || t == Q8_0 || t == Q4_K || t == Q6_K; }

inline Layout layout(int64_t t) {
  switch (t) {
    case Q5_0: return {32, 32 + 256 + 64};
    case Q8_0: return {32, 32 + 512};
    case Q4_K: return {256, 64 + 256 + 8 * 256};
    default: return {256, 32 + 256 + 8 * 256 + 8 * 128};  // Q6_K
  }
}

inline int64_t panel_bytes(int64_t t, int64_t in) { return in / layout(t).values * layout(t).bytes; }

// ---- vector helpers -----------------------------------------------------------------------------------------

inline u8x64 load64(const uint8_t* p) {
  u8x64 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

inline uint64_t u64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

// 16 fp16 -> fp32.
inline f32x16 load_f16x16(const uint8_t* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
#ifdef __AVX512F__
  return (f32x16)_mm512_cvtph_ps(h);
#else
  const __m256 f[2] = {_mm256_cvtph_ps(_mm256_castsi256_si128(h)), _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1))};
  f32x16 v;
  std::memcpy(&v, f, sizeof v);
  return v;
#endif
}

// `bit` in byte i where bit i of mask is set.
inline u8x64 mask_bytes(uint64_t mask, uint8_t bit) {
#ifdef __AVX512BW__
  return (u8x64)_mm512_maskz_set1_epi8(mask, char(bit));
#else
  // ggml's bytes_from_bits_32 for each half: byte j gets byte j/8 of the word, then all ones iff bit j%8 set.
  const __m256i shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
  __m256i out[2];
  for (int h = 0; h < 2; ++h) {
    __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(int(uint32_t(mask >> (32 * h)))), shuf);
    bytes = _mm256_or_si256(bytes, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
    out[h] = _mm256_and_si256(_mm256_cmpeq_epi8(bytes, _mm256_set1_epi64x(-1)), _mm256_set1_epi8(char(bit)));
  }
  u8x64 v;
  std::memcpy(&v, out, sizeof v);
  return v;
#endif
}

// A block's 256 nibble bytes -> the 8 groups' unsigned values (low 4 bits).
inline void nibbles(const uint8_t* p, u8x64* u) {
  using u16x32 = uint16_t __attribute__((vector_size(64)));
  for (int c = 0; c < 4; ++c) {
    const u8x64 v = load64(p + 64 * c);
    u[c] = v & uint8_t(0x0F);
    u[c + 4] = (u8x64)((u16x32)v >> 4) & uint8_t(0x0F);
  }
}

// Q6_K's high 2 bits of a block's 8 groups from 2 x 64 bytes (bits 2k, 2k + 1 of byte i of part h: group
// 4h + k's byte i), into bits 4-5 of u. 16-bit shifts: the mask drops what crosses a byte.
inline void high_pairs(const uint8_t* p, u8x64* u) {
  using u16x32 = uint16_t __attribute__((vector_size(64)));
  for (int h = 0; h < 2; ++h) {
    const u16x32 v = (u16x32)load64(p + 64 * h);
    u[4 * h] |= (u8x64)(v << 4) & uint8_t(0x30);
    u[4 * h + 1] |= (u8x64)(v << 2) & uint8_t(0x30);
    u[4 * h + 2] |= (u8x64)v & uint8_t(0x30);
    u[4 * h + 3] |= (u8x64)(v >> 2) & uint8_t(0x30);
  }
}

constexpr int64_t PF_AHEAD = 2048;
// Ask for the lines PF_AHEAD bytes past [p, p + n): a panel is read as one stream, the next panel after it.
inline void prefetch(const uint8_t* p, int64_t n) {
  for (int64_t o = 0; o < n; o += 64) _mm_prefetch(reinterpret_cast<const char*>(p + PF_AHEAD + o), _MM_HINT_T0);
}

inline int32_t x4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// s + (per lane) the 4 products of lane's unsigned bytes u with the 4 activation bytes x (broadcast). Without
// VNNI, maddubs adds two products into int16: exact while 2 * u * 128 <= 32767 (u <= 63 here).
inline i32x16 dot4(i32x16 s, u8x64 u, int32_t x) {
#ifdef __AVX512VNNI__
  return (i32x16)_mm512_dpbusd_epi32((__m512i)s, (__m512i)u, _mm512_set1_epi32(x));
#else
  __m256i w[2];
  std::memcpy(w, &u, sizeof w);
  const __m256i xv = _mm256_set1_epi32(x), ones = _mm256_set1_epi16(1);
  __m256i out[2];
  for (int h = 0; h < 2; ++h) out[h] = _mm256_madd_epi16(_mm256_maddubs_epi16(w[h], xv), ones);
  i32x16 r;
  std::memcpy(&r, out, sizeof r);
  return s + r;
#endif
}

// The same for signed weights w (Q8_0). VNNI: (w + 128) . x, the 128 . x share subtracted where s starts.
// Otherwise ggml's |w| . (x with w's sign): int16 pair sums within 2 * 128 * 127.
inline i32x16 dot4_s8(i32x16 s, u8x64 w, int32_t x) {
#ifdef __AVX512VNNI__
  return (i32x16)_mm512_dpbusd_epi32((__m512i)s, (__m512i)(w ^ uint8_t(0x80)), _mm512_set1_epi32(x));
#else
  __m256i wv[2];
  std::memcpy(wv, &w, sizeof wv);
  const __m256i xv = _mm256_set1_epi32(x), ones = _mm256_set1_epi16(1);
  __m256i out[2];
  for (int h = 0; h < 2; ++h)
    out[h] = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(wv[h], wv[h]), _mm256_sign_epi8(xv, wv[h])),
                               ones);
  i32x16 r;
  std::memcpy(&r, out, sizeof r);
  return s + r;
#endif
}

#ifdef __AVX512VNNI__
constexpr bool kVnni = true;
#else
constexpr bool kVnni = false;
#endif

// ---- activations: each row rounded to int8 per 32 values (dx = max|x| / 127) ------------------------------------

struct XQ {
  const int8_t* q;       // [M, in]
  const float* dx;       // [M, nb]: each 32-value block's scale
  const float* ds;       // [M, nb]: dx * (sum of the block's q)
  const int32_t* z16;    // [M, nb]: -16 * sum q (Q5_0's zero point)
  const int32_t* z128;   // [M, nb]: -128 * sum q (Q8_0 as unsigned, VNNI)
  const int32_t* z32h;   // [M, 2 nb]: -32 * (sum of each 16 values' q) (Q6_K)
  int64_t in, nb;
};

struct XBuffers {
  std::vector<int8_t> q;
  std::vector<float> dx, ds;
  std::vector<int32_t> z16, z128, z32h;
};

XQ quantize(const float* x, int64_t m, int64_t in, XBuffers& b) {
  const int64_t nb = in / 32;
  b.q.resize(m * in);
  b.dx.resize(m * nb);
  b.ds.resize(m * nb);
  b.z16.resize(m * nb);
  b.z128.resize(m * nb);
  b.z32h.resize(2 * m * nb);
  for (int64_t i = 0; i < m * nb; ++i) {
    const float* xb = x + 32 * i;
    int8_t* q = b.q.data() + 32 * i;
    float amax = 0.f;
    for (int l = 0; l < 32; ++l) amax = std::max(amax, std::fabs(xb[l]));
    const float dx = amax / 127.f, inv = amax > 0.f ? 127.f / amax : 0.f;
    int32_t half[2] = {0, 0};
    for (int l = 0; l < 32; ++l) {
      q[l] = int8_t(std::nearbyint(xb[l] * inv));
      half[l / 16] += q[l];
    }
    const int32_t s = half[0] + half[1];
    b.dx[i] = dx;
    b.ds[i] = dx * float(s);
    b.z16[i] = -16 * s;
    b.z128[i] = -128 * s;
    b.z32h[2 * i] = -32 * half[0];
    b.z32h[2 * i + 1] = -32 * half[1];
  }
  return {b.q.data(), b.dx.data(), b.ds.data(), b.z16.data(), b.z128.data(), b.z32h.data(), in, nb};
}

// ---- one panel against R activation rows (from row r0): acc[r] += the panel's 16 outputs ----------------------

template <int R>
void panel_q5_0(const uint8_t* p, const XQ& x, int64_t r0, f32x16* acc) {
  for (int64_t b = 0; b < x.nb; ++b, p += layout(Q5_0).bytes) {
    prefetch(p, layout(Q5_0).bytes);
    const f32x16 a = load_f16x16(p);
    u8x64 u[8];
    nibbles(p + 32, u);
    for (int g = 0; g < 8; ++g) u[g] |= mask_bytes(u64(p + 288 + 8 * g), 0x10);
    for (int r = 0; r < R; ++r) {
      const int64_t row = (r0 + r) * x.nb + b;
      const int8_t* q = x.q + 32 * row;
      i32x16 s = i32x16{} + x.z16[row];
      for (int g = 0; g < 8; ++g) s = dot4(s, u[g], x4(q + 4 * g));
      acc[r] = fma16(to_f32(s), a * x.dx[row], acc[r]);
    }
  }
}

template <int R>
void panel_q8_0(const uint8_t* p, const XQ& x, int64_t r0, f32x16* acc) {
  for (int64_t b = 0; b < x.nb; ++b, p += layout(Q8_0).bytes) {
    prefetch(p, layout(Q8_0).bytes);
    const f32x16 a = load_f16x16(p);
    u8x64 w[8];
    for (int g = 0; g < 8; ++g) w[g] = load64(p + 32 + 64 * g);
    for (int r = 0; r < R; ++r) {
      const int64_t row = (r0 + r) * x.nb + b;
      const int8_t* q = x.q + 32 * row;
      i32x16 s = i32x16{} + (kVnni ? x.z128[row] : 0);
      for (int g = 0; g < 8; ++g) s = dot4_s8(s, w[g], x4(q + 4 * g));
      acc[r] = fma16(to_f32(s), a * x.dx[row], acc[r]);
    }
  }
}

template <int R>
void panel_q4_k(const uint8_t* p, const XQ& x, int64_t r0, f32x16* acc) {
  for (int64_t sb = 0; sb < x.nb / 8; ++sb, p += layout(Q4_K).bytes) {
    const f32x16 d = load_f16x16(p), dmin = load_f16x16(p + 32);
    for (int j = 0; j < 8; ++j) {
      prefetch(p + layout(Q4_K).bytes / 8 * j, layout(Q4_K).bytes / 8);
      const f32x16 a = d * to_f32(load_u8(p + 64 + 16 * j));
      const f32x16 neg_min = -(dmin * to_f32(load_u8(p + 192 + 16 * j)));
      u8x64 u[8];
      nibbles(p + 320 + 256 * j, u);
      for (int r = 0; r < R; ++r) {
        const int64_t row = (r0 + r) * x.nb + 8 * sb + j;
        const int8_t* q = x.q + 32 * row;
        i32x16 s{};
        for (int g = 0; g < 8; ++g) s = dot4(s, u[g], x4(q + 4 * g));
        acc[r] = fma16(to_f32(s), a * x.dx[row], acc[r]);
        acc[r] = fma16(neg_min, f32x16{} + x.ds[row], acc[r]);
      }
    }
  }
}

template <int R>
void panel_q6_k(const uint8_t* p, const XQ& x, int64_t r0, f32x16* acc) {
  for (int64_t sb = 0; sb < x.nb / 8; ++sb, p += layout(Q6_K).bytes) {
    const f32x16 d = load_f16x16(p);
    for (int j = 0; j < 8; ++j) {
      prefetch(p + layout(Q6_K).bytes / 8 * j, layout(Q6_K).bytes / 8);
      const f32x16 a0 = d * to_f32(load_i8(p + 32 + 32 * j)), a1 = d * to_f32(load_i8(p + 48 + 32 * j));
      u8x64 u[8];
      nibbles(p + 288 + 256 * j, u);
      high_pairs(p + 288 + 2048 + 128 * j, u);
      for (int r = 0; r < R; ++r) {
        const int64_t row = (r0 + r) * x.nb + 8 * sb + j;
        const int8_t* q = x.q + 32 * row;
        i32x16 s0 = i32x16{} + x.z32h[2 * row], s1 = i32x16{} + x.z32h[2 * row + 1];
        for (int g = 0; g < 4; ++g) s0 = dot4(s0, u[g], x4(q + 4 * g));
        for (int g = 4; g < 8; ++g) s1 = dot4(s1, u[g], x4(q + 4 * g));
        const float dx = x.dx[row];
        acc[r] = fma16(to_f32(s0), a0 * dx, acc[r]);
        acc[r] = fma16(to_f32(s1), a1 * dx, acc[r]);
      }
    }
  }
}

template <int R>
void panel_rows(int64_t t, const uint8_t* p, const XQ& x, int64_t r0, f32x16* acc) {
  switch (t) {
    case Q5_0: return panel_q5_0<R>(p, x, r0, acc);
    case Q8_0: return panel_q8_0<R>(p, x, r0, acc);
    case Q4_K: return panel_q4_k<R>(p, x, r0, acc);
    default: return panel_q6_k<R>(p, x, r0, acc);
  }
}

using PanelFn = void (*)(int64_t, const uint8_t*, const XQ&, int64_t, f32x16*);

PanelFn panel_fn(int r) {
  static constexpr PanelFn fns[16] = {panel_rows<1>, panel_rows<2>, panel_rows<3>, panel_rows<4>,
                                      panel_rows<5>, panel_rows<6>, panel_rows<7>, panel_rows<8>,
                                      panel_rows<9>, panel_rows<10>, panel_rows<11>, panel_rows<12>,
                                      panel_rows<13>, panel_rows<14>, panel_rows<15>, panel_rows<16>};
  static_assert(kRowTile <= 16);
  return fns[r - 1];
}

// ---- packing: a row's values as unsigned integers (Q8_0: int8) and its scales, then regrouped ------------------

// The values of `in` of one row of type t, as ggml's dequantizer reads them (Q5_0: 0..31, Q4_K: 0..15,
// Q6_K: 0..63, Q8_0: the int8 bits).
void row_values(int64_t t, const uint8_t* row, int64_t in, uint8_t* v) {
  const Format f = format(t);
  for (int64_t b = 0; b < in / f.block; ++b) {
    const uint8_t* blk = row + b * f.bytes;
    uint8_t* out = v + b * f.block;
    if (t == Q5_0) {
      uint32_t qh;
      std::memcpy(&qh, blk + 2, 4);
      for (int i = 0; i < 16; ++i) {
        out[i] = (blk[6 + i] & 0xF) | ((qh >> i) & 1) << 4;
        out[i + 16] = (blk[6 + i] >> 4) | ((qh >> (i + 16)) & 1) << 4;
      }
    } else if (t == Q8_0) {
      std::memcpy(out, blk + 2, 32);
    } else if (t == Q4_K) {
      for (int c = 0; c < 4; ++c)
        for (int l = 0; l < 32; ++l) {
          out[64 * c + l] = blk[16 + 32 * c + l] & 0xF;
          out[64 * c + 32 + l] = blk[16 + 32 * c + l] >> 4;
        }
    } else {  // Q6_K
      for (int h = 0; h < 2; ++h) {
        const uint8_t* ql = blk + 64 * h;
        const uint8_t* qh = blk + 128 + 32 * h;
        for (int l = 0; l < 32; ++l) {
          out[128 * h + l] = (ql[l] & 0xF) | (qh[l] & 3) << 4;
          out[128 * h + l + 32] = (ql[l + 32] & 0xF) | ((qh[l] >> 2) & 3) << 4;
          out[128 * h + l + 64] = (ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4;
          out[128 * h + l + 96] = (ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4;
        }
      }
    }
  }
}

// Q4_K's 6-bit scale and min of sub-block j (ggml's get_scale_min_k4).
inline void scale_min_k4(int j, const uint8_t* s, uint8_t& sc, uint8_t& m) {
  if (j < 4) {
    sc = s[j] & 63;
    m = s[j + 4] & 63;
  } else {
    sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
    m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// A 32-value block of 16 rows (v[j]: row j's values from this block on) as its 8 group vectors: byte 4j + t
// of group g is value 4g + t of row j, the order the kernels' vectors hold them.
struct Groups {
  u8x64 g[8];
  explicit Groups(const uint8_t* const* v) {
    for (int k = 0; k < 8; ++k)
      for (int j = 0; j < kPanel; ++j) std::memcpy(reinterpret_cast<uint8_t*>(&g[k]) + 4 * j, v[j] + 4 * k, 4);
  }
};

inline uint8_t* put(uint8_t* out, const u8x64& v) {
  std::memcpy(out, &v, sizeof v);
  return out + sizeof v;
}

// The low 4 bits: part c holds group c in its low nibbles, group c + 4 in its high ones.
uint8_t* put_nibbles(const Groups& x, uint8_t* out) {
  for (int c = 0; c < 4; ++c) out = put(out, (x.g[c] & uint8_t(0x0F)) | (x.g[c + 4] << 4));
  return out;
}

// Bit `bit` of the values as 8 masks, one per group (bit i: byte i of the group).
uint8_t* put_bits(const Groups& x, uint8_t* out, int bit) {
  for (int k = 0; k < 8; ++k) {
    const u8x64 b = (x.g[k] >> bit) & uint8_t(1);
    uint64_t mask = 0;
    for (int i = 0; i < 64; ++i) mask |= uint64_t(b[i]) << i;
    std::memcpy(out, &mask, 8);
    out += 8;
  }
  return out;
}

// Bits 4-5 of the values as high_pairs reads them: part h, bits 2k .. 2k + 1 from group 4h + k.
uint8_t* put_pairs(const Groups& x, uint8_t* out) {
  for (int h = 0; h < 2; ++h) {
    u8x64 v{};
    for (int k = 0; k < 4; ++k) v |= ((x.g[4 * h + k] >> 4) & uint8_t(3)) << (2 * k);
    out = put(out, v);
  }
  return out;
}

// One panel: rows (up to 16; missing rows are zeros: scale 0, values 0) of the block matrix.
void pack_panel(int64_t t, const uint8_t* const* rows, int n, int64_t in, uint8_t* out) {
  static const uint8_t zeros[256] = {};  // a missing row's block: scales 0
  std::vector<uint8_t> vals(kPanel * in, 0);
  const Format f = format(t);
  for (int j = 0; j < n; ++j) row_values(t, rows[j], in, vals.data() + j * in);
  auto blk = [&](int j, int64_t b) { return j < n ? rows[j] + b * f.bytes : zeros; };
  auto put_f16 = [&](int64_t b, int off) {
    for (int j = 0; j < kPanel; ++j) std::memcpy(out + 2 * j, blk(j, b) + off, 2);
    out += 32;
  };
  const uint8_t* v[kPanel];
  for (int64_t b = 0; b < in / f.block; ++b) {
    if (t == Q5_0 || t == Q8_0) {
      put_f16(b, 0);
      for (int j = 0; j < kPanel; ++j) v[j] = vals.data() + j * in + 32 * b;
      const Groups x(v);
      if (t == Q8_0) {
        for (int g = 0; g < 8; ++g) out = put(out, x.g[g]);
      } else {
        out = put_nibbles(x, out);
        out = put_bits(x, out, 4);
      }
    } else if (t == Q4_K) {
      put_f16(b, 0);
      put_f16(b, 2);
      for (int s = 0; s < 8; ++s)
        for (int j = 0; j < kPanel; ++j) scale_min_k4(s, blk(j, b) + 4, out[16 * s + j], out[128 + 16 * s + j]);
      out += 256;
      for (int s = 0; s < 8; ++s) {
        for (int j = 0; j < kPanel; ++j) v[j] = vals.data() + j * in + 256 * b + 32 * s;
        out = put_nibbles(Groups(v), out);
      }
    } else {  // Q6_K
      put_f16(b, 208);
      for (int s = 0; s < 16; ++s)
        for (int j = 0; j < kPanel; ++j) out[16 * s + j] = blk(j, b)[192 + s];
      out += 256;
      for (int s = 0; s < 8; ++s) {
        for (int j = 0; j < kPanel; ++j) v[j] = vals.data() + j * in + 256 * b + 32 * s;
        out = put_nibbles(Groups(v), out);
      }
      for (int s = 0; s < 8; ++s) {
        for (int j = 0; j < kPanel; ++j) v[j] = vals.data() + j * in + 256 * b + 32 * s;
        out = put_pairs(Groups(v), out);
      }
    }
  }
}

// ---- dequantization of a panel (the many-row steps' tiles): ggml's float operations --------------------------

void dequantize_panel(int64_t t, const uint8_t* p, int64_t in, int n, float* y) {
  u8x64 u[8];
  const Layout l = layout(t);
  auto scatter = [&](int64_t first, auto value) {  // value(g, j, tt) -> y[j, first + 4g + tt]
    for (int j = 0; j < n; ++j)
      for (int g = 0; g < 8; ++g)
        for (int tt = 0; tt < 4; ++tt) y[j * in + first + 4 * g + tt] = value(g, j, tt);
  };
  for (int64_t b = 0; b < in / l.values; ++b, p += l.bytes) {
    if (t == Q5_0 || t == Q8_0) {
      float d[kPanel];
      const f32x16 dv = load_f16x16(p);
      std::memcpy(d, &dv, sizeof d);
      if (t == Q8_0) {
        scatter(32 * b, [&](int g, int j, int tt) { return float(int8_t(p[32 + 64 * g + 4 * j + tt])) * d[j]; });
      } else {
        nibbles(p + 32, u);
        for (int g = 0; g < 8; ++g) u[g] |= mask_bytes(u64(p + 288 + 8 * g), 0x10);
        scatter(32 * b, [&](int g, int j, int tt) { return float(int(u[g][4 * j + tt]) - 16) * d[j]; });
      }
    } else if (t == Q4_K) {
      for (int s = 0; s < 8; ++s) {
        nibbles(p + 320 + 256 * s, u);
        scatter(256 * b + 32 * s, [&](int g, int j, int tt) {
          const float d = f16(p + 2 * j) * float(p[64 + 16 * s + j]);
          const float m = f16(p + 32 + 2 * j) * float(p[192 + 16 * s + j]);
          return d * float(u[g][4 * j + tt]) - m;
        });
      }
    } else {  // Q6_K
      for (int s = 0; s < 8; ++s) {
        nibbles(p + 288 + 256 * s, u);
        high_pairs(p + 288 + 2048 + 128 * s, u);
        scatter(256 * b + 32 * s, [&](int g, int j, int tt) {
          const float d = f16(p + 2 * j) * float(int8_t(p[32 + 16 * (2 * s + g / 4) + j]));
          return d * float(int(u[g][4 * j + tt]) - 32);
        });
      }
    }
  }
}

void check_packed(const at::Tensor& packed, int64_t t, int64_t in, int64_t rows, const char* name) {
  TORCH_CHECK(packable(t), name, ": GGUF tensor type ", t, " has no packed kernel");
  TORCH_CHECK(in % layout(t).values == 0, name, ": ", in, " inputs is not a whole number of ", layout(t).values,
              "-value blocks");
  TORCH_CHECK(packed.device().is_cpu() && packed.scalar_type() == at::kByte && packed.dim() == 2 &&
                  packed.is_contiguous() && packed.size(0) == (rows + kPanel - 1) / kPanel &&
                  packed.size(1) == panel_bytes(t, in),
              name, ": packed must be a contiguous uint8 [", (rows + kPanel - 1) / kPanel, ", ", panel_bytes(t, in),
              "] CPU matrix (gguf_pack's)");
}

}  // namespace
}  // namespace rlm::gguf

namespace rlm {

using namespace rlm::gguf;

at::Tensor gguf_pack(const at::Tensor& blocks, int64_t qtype) {
  TORCH_CHECK(packable(qtype), "gguf_pack: GGUF tensor type ", qtype, " has no packed kernel");
  const int64_t in = blocks.size(1) / format(qtype).bytes * format(qtype).block;
  check_blocks(blocks, qtype, in, "gguf_pack");
  const int64_t rows = blocks.size(0), panels = (rows + kPanel - 1) / kPanel;
  auto out = at::empty({panels, panel_bytes(qtype, in)}, blocks.options());
  const uint8_t* src = blocks.data_ptr<uint8_t>();
  uint8_t* dst = out.data_ptr<uint8_t>();
  at::parallel_for(0, panels, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      const uint8_t* rows_of[kPanel];
      const int n = int(std::min<int64_t>(kPanel, rows - kPanel * p));
      for (int j = 0; j < n; ++j) rows_of[j] = src + (kPanel * p + j) * blocks.stride(0);
      pack_panel(qtype, rows_of, n, in, dst + p * out.size(1));
    }
  });
  return out;
}

at::Tensor gguf_packed_dequantize(const at::Tensor& packed, int64_t qtype, int64_t in, int64_t rows) {
  check_packed(packed, qtype, in, rows, "gguf_packed_dequantize");
  auto y = at::empty({rows, in}, at::kFloat);
  const uint8_t* src = packed.data_ptr<uint8_t>();
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, packed.size(0), 1, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p)
      dequantize_panel(qtype, src + p * packed.size(1), in, int(std::min<int64_t>(kPanel, rows - kPanel * p)),
                       yp + kPanel * p * in);
  });
  return y;
}

at::Tensor gguf_linear_packed(const at::Tensor& x, at::TensorList packed, at::IntArrayRef qtypes,
                              at::IntArrayRef rows, const std::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kFloat && x.dim() == 2,
              "gguf_linear_packed: x must be an fp32 [rows, in] CPU tensor");
  TORCH_CHECK(!packed.empty() && packed.size() == qtypes.size() && packed.size() == rows.size(),
              "gguf_linear_packed: one qtype and row count per packed matrix");
  const int64_t in = x.size(1), m = x.size(0);
  struct PackedPart { const uint8_t* data; int64_t qtype, rows, first_out, first_panel, panel_bytes; };
  std::vector<PackedPart> parts;
  int64_t n = 0, panels = 0;
  for (size_t i = 0; i < packed.size(); ++i) {
    check_packed(packed[i], qtypes[i], in, rows[i], "gguf_linear_packed");
    parts.push_back({packed[i].data_ptr<uint8_t>(), qtypes[i], rows[i], n, panels, packed[i].size(1)});
    n += rows[i];
    panels += packed[i].size(0);
  }
  if (bias)
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->is_contiguous() && bias->numel() == n,
                "gguf_linear_packed: bias must be fp32 [", n, "]");
  auto xc = x.contiguous();
  XBuffers buf;
  const XQ xq = quantize(xc.data_ptr<float>(), m, in, buf);
  auto y = at::empty({m, n}, x.options());
  const float* bp = bias ? bias->data_ptr<float>() : nullptr;
  float* yp = y.data_ptr<float>();
  // Tasks of at least ~64 KB of weights: below that a thread's wake-up costs more than the split saves.
  const int64_t grain = std::max<int64_t>(1, 65536 / parts[0].panel_bytes);
  at::parallel_for(0, panels, grain, [&](int64_t p0, int64_t p1) {
    size_t i = 0;
    for (int64_t p = p0; p < p1; ++p) {
      while (p >= parts[i].first_panel + (parts[i].rows + kPanel - 1) / kPanel) ++i;
      const PackedPart& part = parts[i];
      const int64_t local = p - part.first_panel, col = part.first_out + kPanel * local;
      const int lanes = int(std::min<int64_t>(kPanel, part.rows - kPanel * local));
      const uint8_t* panel = part.data + local * part.panel_bytes;
      for (int64_t r0 = 0; r0 < m; r0 += kRowTile) {
        const int r = int(std::min<int64_t>(kRowTile, m - r0));
        f32x16 acc[kRowTile] = {};
        panel_fn(r)(part.qtype, panel, xq, r0, acc);
        for (int k = 0; k < r; ++k) {
          alignas(64) float v[kPanel];
          std::memcpy(v, &acc[k], sizeof v);
          float* out = yp + (r0 + k) * n + col;
          for (int j = 0; j < lanes; ++j) out[j] = bp ? v[j] + bp[col + j] : v[j];
        }
      }
    }
  });
  return y;
}

}  // namespace rlm

RADIXLM_OPS(m) {
  m.def("gguf_pack(Tensor blocks, int qtype) -> Tensor", rlm::gguf_pack);
  m.def("gguf_packed_dequantize(Tensor packed, int qtype, int in_features, int rows) -> Tensor",
        rlm::gguf_packed_dequantize);
  m.def("gguf_linear_packed(Tensor x, Tensor[] packed, int[] qtypes, int[] rows, Tensor? bias) -> Tensor",
        rlm::gguf_linear_packed);
}
