// gguf_linear_q8(x, blocks[], qtypes[], bias): gguf_linear (gguf_blocks.cpp) with int8 activations.
//
// Each activation row is quantized once per call to int8 in blocks of 32 (dx = max|x| / 127, q = round(x / dx),
// as ggml's quantize_row_q8_0 but with an fp32 scale). A weight row is walked 64 values (a "chunk") at a
// time; each type unpacks a chunk to 64 unsigned bytes u and per-lane fp32 scales, a lane being 4
// consecutive values (what one dpbusd, or maddubs + madd, sums into one int32):
//     w = a * (u - zero) + m        (zero a power of two fixed per type, m the block's min where it has one)
// so a lane adds  (a * dx) * (sum u*q - zero * sum q)  +  m * (dx * sum q):  the sums of products exact in
// int32, the x-side sums precomputed per lane. Every row runs the same operations in the same order
// whatever M is, so a row's result has the same bits alone and in any batch, and the ISA builds compute
// identical int32 lanes and then identical fp32 operations.

#include "gguf_common.h"

namespace rlm::gguf {
namespace {

using u8x32 = uint8_t __attribute__((vector_size(32)));
using u8x64 = uint8_t __attribute__((vector_size(64)));

#ifdef __AVX512VNNI__
constexpr bool kVnni = true;
#else
constexpr bool kVnni = false;
#endif

inline u8x16 load_u8x16(const uint8_t* p) {
  u8x16 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

inline u8x32 load_u8x32(const uint8_t* p) {
  u8x32 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

inline u8x32 join(u8x16 lo, u8x16 hi) {
  return __builtin_shufflevector(lo, hi, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20,
                                 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31);
}
inline u8x64 join(u8x32 lo, u8x32 hi) {
  return __builtin_shufflevector(lo, hi, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20,
                                 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41,
                                 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62,
                                 63);
}

// Lanes 0-7 (the chunk's first 32 values) a, lanes 8-15 b. (Intrinsics: GCC's shuffles of a narrower
// vector into f32x16 go through the stack.)
inline f32x16 halves(float a, float b) {
#ifdef __AVX512F__
  return (f32x16)_mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(a), _mm512_set1_ps(b));
#else
  const __m256 h[2] = {_mm256_set1_ps(a), _mm256_set1_ps(b)};
  f32x16 v;
  std::memcpy(&v, h, sizeof v);
  return v;
#endif
}

// Lanes 4g .. 4g+3 p[g]: one scale per 16 values.
inline f32x16 quarters(const float* p) {
  const __m128 v = _mm_loadu_ps(p);
#ifdef __AVX512F__
  const __m512i idx = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
  return (f32x16)_mm512_permutexvar_ps(idx, _mm512_castps128_ps512(v));
#else
  const __m256 w = _mm256_castps128_ps256(v);
  const __m256 h[2] = {_mm256_permutevar8x32_ps(w, _mm256_set_epi32(1, 1, 1, 1, 0, 0, 0, 0)),
                       _mm256_permutevar8x32_ps(w, _mm256_set_epi32(3, 3, 3, 3, 2, 2, 2, 2))};
  f32x16 out;
  std::memcpy(&out, h, sizeof out);
  return out;
#endif
}

// ((v >> from) & mask) << to in every byte, as one 16-bit shift and one mask (x86 has no byte shifts; the
// mask drops what the wider shift carries across bytes).
inline u8x32 bits(u8x32 v, int from, uint8_t mask, int to) {
  using u16x16 = uint16_t __attribute__((vector_size(32)));
  u16x16 w = (u16x16)v;
  if (to > from) w <<= to - from;
  if (from > to) w >>= from - to;
  return (u8x32)w & uint8_t(mask << to);
}

// Two 32-value blocks' 16 packed bytes each (low nibbles values 0-15, high nibbles 16-31) -> 64 values.
inline u8x64 nibble_pair(const uint8_t* a, const uint8_t* b) {
  const u8x32 q = join(load_u8x16(a), load_u8x16(b));
  const u8x32 lo = bits(q, 0, 0xF, 0), hi = bits(q, 4, 0xF, 0);
  return __builtin_shufflevector(lo, hi, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 32, 33, 34, 35,
                                 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 16, 17, 18, 19, 20, 21, 22, 23,
                                 24, 25, 26, 27, 28, 29, 30, 31, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59,
                                 60, 61, 62, 63);
}


// 0x10 in byte j where bit j of `bits` is set: a Q5 block's fifth bits, in place.
inline u8x32 fifth_bits(uint32_t bits) {
#if defined(__AVX512BW__) && defined(__AVX512VL__)
  return (u8x32)_mm256_maskz_set1_epi8(bits, 0x10);
#else
  // ggml's bytes_from_bits_32: byte j gets byte j/8 of bits, all ones but bit j%8, then all ones iff set.
  const __m256i shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
  __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(int(bits)), shuf);
  bytes = _mm256_or_si256(bytes, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
  return (u8x32)_mm256_and_si256(_mm256_cmpeq_epi8(bytes, _mm256_set1_epi64x(-1)), _mm256_set1_epi8(0x10));
#endif
}

// The fifth bits of two Q5 blocks (qh words a, b), for their 64 values.
inline u8x64 fifth_bits(uint32_t a, uint32_t b) {
#ifdef __AVX512BW__
  return (u8x64)_mm512_maskz_set1_epi8(uint64_t(a) | uint64_t(b) << 32, 0x10);
#else
  return join(fifth_bits(a), fifth_bits(b));
#endif
}

// acc + the int32 lane sums of u[i] * x[i] over 4 consecutive values, u unsigned. Without VNNI, maddubs adds two
// products into int16, exact only while 2 * u * 128 <= 32767: every type keeps u <= 63 there (Q8_0 takes
// dot_s8 instead).
inline i32x16 dot_u8(i32x16 acc, u8x64 u, const int8_t* x) {
#ifdef __AVX512VNNI__
  return (i32x16)_mm512_dpbusd_epi32((__m512i)acc, (__m512i)u, _mm512_loadu_si512(x));
#else
  __m256i w[2];
  std::memcpy(w, &u, sizeof w);
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i out[2];
  for (int h = 0; h < 2; ++h) {
    const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + 32 * h));
    out[h] = _mm256_madd_epi16(_mm256_maddubs_epi16(w[h], xv), ones);
  }
  i32x16 r;
  std::memcpy(&r, out, sizeof r);
  return acc + r;
#endif
}

// The same lane sums for signed weights (Q8_0) without VNNI: |w| * (x with w's sign), ggml's
// mul_sum_i8_pairs; the int16 pair sums stay within 2 * 128 * 127.
inline i32x16 dot_s8(u8x64 s, const int8_t* x) {
  __m256i w[2];
  std::memcpy(w, &s, sizeof w);
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i out[2];
  for (int h = 0; h < 2; ++h) {
    const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + 32 * h));
    out[h] = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(w[h], w[h]), _mm256_sign_epi8(xv, w[h])), ones);
  }
  i32x16 r;
  std::memcpy(&r, out, sizeof r);
  return r;
}

// One activation row, quantized; arrays padded with zeros to a whole number of 64-value chunks.
// s the sum of a lane's 4 int8 values:
struct QRow {
  const int8_t* q;        // the int8 values
  const float* d;         // per lane: dx of the lane's block
  const float* ds;        // per lane: dx * s
  const int32_t* z[8];    // per lane: -(s << k), for the zero points 1 << k the weight types use (else null)
};

struct QBuffers {
  std::vector<int8_t> q;
  std::vector<float> d, ds;
  std::vector<int32_t> z[8];
};

// Rows of x [m, in] -> QRows over `padded` (a multiple of 64) values, with the z arrays of the zero-point
// shifts set in `shifts` (bit k: zero 1 << k).
std::vector<QRow> quantize_rows(const float* x, int64_t m, int64_t in, int64_t padded, unsigned shifts,
                                QBuffers& buf) {
  const int64_t lanes = padded / 4;
  buf.q.assign(m * padded, 0);
  buf.d.assign(m * lanes, 0.f);
  buf.ds.assign(m * lanes, 0.f);
  for (int k = 0; k < 8; ++k)
    if (shifts >> k & 1) buf.z[k].assign(m * lanes, 0);
  std::vector<QRow> rows;
  for (int64_t r = 0; r < m; ++r) {
    QRow row{buf.q.data() + r * padded, buf.d.data() + r * lanes, buf.ds.data() + r * lanes, {}};
    for (int k = 0; k < 8; ++k)
      if (shifts >> k & 1) row.z[k] = buf.z[k].data() + r * lanes;
    int8_t* q = buf.q.data() + r * padded;
    float* d = buf.d.data() + r * lanes;
    float* ds = buf.ds.data() + r * lanes;
    const float* xr = x + r * in;
    for (int64_t b = 0; b < in; b += 32) {
      float amax = 0.f;
      for (int l = 0; l < 32; ++l) amax = std::max(amax, std::fabs(xr[b + l]));
      const float dx = amax / 127.f, inv = amax > 0.f ? 127.f / amax : 0.f;
      for (int l = 0; l < 32; ++l) q[b + l] = int8_t(std::nearbyint(xr[b + l] * inv));
      for (int64_t lane = b / 4; lane < b / 4 + 8; ++lane) {
        const int32_t s = q[4 * lane] + q[4 * lane + 1] + q[4 * lane + 2] + q[4 * lane + 3];
        d[lane] = dx;
        ds[lane] = dx * float(s);
        for (int k = 0; k < 8; ++k)
          if (shifts >> k & 1) buf.z[k][r * lanes + lane] = -(s << k);
      }
    }
    rows.push_back(row);
  }
  return rows;
}

// The zero point's shift k (zero = 1 << k) type T's chunks use in this build; -1: none.
template <class T>
constexpr int zero_shift() {
  if constexpr (T::kSigned) return kVnni ? 7 : -1;  // with VNNI, Q8_0's int8 w as unsigned w + 128
  return T::kZeroShift;
}

// One chunk (64 values from value i) into R rows' accumulators. T says how u maps to w: kZeroShift
// (zero = 1 << kZeroShift; -1: none), kMin (m is used), kSigned (u holds int8 weights: Q8_0).
template <class T, int R>
inline void accumulate(u8x64 u, f32x16 a, f32x16 m, const QRow* x, int64_t i, f32x16* acc) {
  const int64_t lane = i / 4;
  constexpr int shift = zero_shift<T>();
  if constexpr (T::kSigned && kVnni) u ^= 0x80;
  for (int r = 0; r < R; ++r) {
    i32x16 dot;
    if constexpr (T::kSigned && !kVnni) {
      dot = dot_s8(u, x[r].q + i);
    } else {
      // The zero point's share, -zero * s, is where the integer sum starts.
      i32x16 start{};
      if constexpr (shift >= 0) std::memcpy(&start, x[r].z[shift] + lane, sizeof start);
      dot = dot_u8(start, u, x[r].q + i);
    }
    acc[r] = fma16(to_f32(dot), a * load_f32(x[r].d + lane), acc[r]);
    if constexpr (T::kMin) acc[r] = fma16(m, load_f32(x[r].ds + lane), acc[r]);
  }
}


// ---- the types, as chunks. 32-value blocks: pair(a, b) (two blocks' 64 u), scale(b) and min(b) -----------

struct Q4_0q {
  static constexpr int64_t kBlock = 32, kBytes = 18;
  static constexpr int kZeroShift = 3;
  static constexpr bool kMin = false, kSigned = false;
  static u8x64 pair(const uint8_t* a, const uint8_t* b) { return nibble_pair(a + 2, b + 2); }
  static float scale(const uint8_t* b) { return f16(b); }
  static float min(const uint8_t*) { return 0.f; }
};

struct Q4_1q {
  static constexpr int64_t kBlock = 32, kBytes = 20;
  static constexpr int kZeroShift = -1;
  static constexpr bool kMin = true, kSigned = false;
  static u8x64 pair(const uint8_t* a, const uint8_t* b) { return nibble_pair(a + 4, b + 4); }
  static float scale(const uint8_t* b) { return f16(b); }
  static float min(const uint8_t* b) { return f16(b + 2); }
};

inline uint32_t u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

struct Q5_0q {
  static constexpr int64_t kBlock = 32, kBytes = 22;
  static constexpr int kZeroShift = 4;
  static constexpr bool kMin = false, kSigned = false;
  static u8x64 pair(const uint8_t* a, const uint8_t* b) {
    return nibble_pair(a + 6, b + 6) | fifth_bits(u32(a + 2), u32(b + 2));
  }
  static float scale(const uint8_t* b) { return f16(b); }
  static float min(const uint8_t*) { return 0.f; }
};

struct Q5_1q {
  static constexpr int64_t kBlock = 32, kBytes = 24;
  static constexpr int kZeroShift = -1;
  static constexpr bool kMin = true, kSigned = false;
  static u8x64 pair(const uint8_t* a, const uint8_t* b) {
    return nibble_pair(a + 8, b + 8) | fifth_bits(u32(a + 4), u32(b + 4));
  }
  static float scale(const uint8_t* b) { return f16(b); }
  static float min(const uint8_t* b) { return f16(b + 2); }
};

struct Q8_0q {
  static constexpr int64_t kBlock = 32, kBytes = 34;
  static constexpr int kZeroShift = -1;
  static constexpr bool kMin = false, kSigned = true;
  static u8x64 pair(const uint8_t* a, const uint8_t* b) { return join(load_u8x32(a + 2), load_u8x32(b + 2)); }
  static float scale(const uint8_t* b) { return f16(b); }
  static float min(const uint8_t*) { return 0.f; }
};

// A whole block of zeros: the missing second half of a row's last chunk when it has an odd number of
// blocks (scale 0 and zero activations there, so it adds exact zeros).
alignas(64) const uint8_t kZeroBlock[64] = {};

template <class T, int R>
void chunks_32(const uint8_t* row, int64_t in, const QRow* x, f32x16* acc) {
  const int64_t nb = in / 32;
  for (int64_t b = 0; b < nb; b += 2) {
    const uint8_t* lo = row + b * T::kBytes;
    const uint8_t* hi = b + 1 < nb ? lo + T::kBytes : kZeroBlock;
    const u8x64 u = T::pair(lo, hi);
    const f32x16 m = T::kMin ? halves(T::min(lo), T::min(hi)) : f32x16{};
    accumulate<T, R>(u, halves(T::scale(lo), T::scale(hi)), m, x, 32 * b, acc);
  }
}

// ---- 256-value blocks: prepare(b) the block's float scales, then chunk(b, c) for its 4 chunks ---------------

struct Q4_Kq {
  static constexpr int64_t kBlock = 256, kBytes = 144;
  static constexpr int kZeroShift = -1;
  static constexpr bool kMin = true, kSigned = false;
  struct Scales { float a[8], m[8]; };
  // The 8 six-bit scales and mins unpacked together (ggml's utmp shuffle: bytes 0-7 scales, 8-15 mins),
  // then scaled 16 at a time.
  static Scales prepare(const uint8_t* b) {
    uint32_t t[4];
    std::memcpy(t, b + 4, 12);
    constexpr uint32_t k1 = 0x3f3f3f3f, k2 = 0x0f0f0f0f, k3 = 0x03030303;
    t[3] = ((t[2] >> 4) & k2) | (((t[1] >> 6) & k3) << 4);
    const uint32_t mins_lo = t[1] & k1;
    t[1] = (t[2] & k2) | (((t[0] >> 6) & k3) << 4);
    t[2] = mins_lo;
    t[0] &= k1;
    const f32x16 v = to_f32(load_u8(reinterpret_cast<const uint8_t*>(t))) * halves(f16(b), -f16(b + 2));
    Scales s;
    std::memcpy(&s, &v, sizeof s);
    return s;
  }
  // Chunk c: sub-blocks 2c (low nibbles) and 2c + 1 (high nibbles) of the same 32 bytes.
  static void chunk(const uint8_t* b, const Scales& s, int c, u8x64& u, f32x16& a, f32x16& m) {
    const u8x32 q = load_u8x32(b + 16 + 32 * c);
    u = join(bits(q, 0, 0xF, 0), bits(q, 4, 0xF, 0));
    a = halves(s.a[2 * c], s.a[2 * c + 1]);
    m = halves(s.m[2 * c], s.m[2 * c + 1]);
  }
};

struct Q5_Kq {
  static constexpr int64_t kBlock = 256, kBytes = 176;
  static constexpr int kZeroShift = -1;
  static constexpr bool kMin = true, kSigned = false;
  using Scales = Q4_Kq::Scales;
  static Scales prepare(const uint8_t* b) { return Q4_Kq::prepare(b); }
  // As Q4_K, the fifth bits of sub-block j in bit j of the 32 qh bytes.
  static void chunk(const uint8_t* b, const Scales& s, int c, u8x64& u, f32x16& a, f32x16& m) {
    const u8x32 q = load_u8x32(b + 48 + 32 * c), h = load_u8x32(b + 16);
    u = join(bits(q, 0, 0xF, 0) | bits(h, 2 * c, 1, 4), bits(q, 4, 0xF, 0) | bits(h, 2 * c + 1, 1, 4));
    a = halves(s.a[2 * c], s.a[2 * c + 1]);
    m = halves(s.m[2 * c], s.m[2 * c + 1]);
  }
};

struct Q6_Kq {
  static constexpr int64_t kBlock = 256, kBytes = 210;
  static constexpr int kZeroShift = 5;
  static constexpr bool kMin = false, kSigned = false;
  struct Scales { float a[16]; };
  static Scales prepare(const uint8_t* b) {
    Scales s;
    const float d = f16(b + 208);
    const f32x16 v = to_f32(load_i8(b + 192)) * d;
    std::memcpy(s.a, &v, sizeof v);
    return s;
  }
  // Chunk c: half c / 2 of the block (64 ql bytes, 32 qh bytes); c even takes the low nibbles and qh bits
  // 0-3, c odd the high nibbles and bits 4-7.
  static void chunk(const uint8_t* b, const Scales& s, int c, u8x64& u, f32x16& a, f32x16&) {
    const uint8_t* ql = b + 64 * (c / 2);
    const u8x32 lo = load_u8x32(ql), hi = load_u8x32(ql + 32), h = load_u8x32(b + 128 + 32 * (c / 2));
    const int shift = 4 * (c % 2);
    u = join(bits(lo, shift, 0xF, 0) | bits(h, shift, 3, 4), bits(hi, shift, 0xF, 0) | bits(h, shift + 2, 3, 4));
    a = quarters(s.a + 4 * c);
  }
};

template <class T, int R>
void chunks_256(const uint8_t* row, int64_t in, const QRow* x, f32x16* acc) {
  for (int64_t b = 0; b < in / 256; ++b) {
    const uint8_t* blk = row + b * T::kBytes;
    const typename T::Scales s = T::prepare(blk);
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) {
      u8x64 u;
      f32x16 a, m{};
      T::chunk(blk, s, c, u, a, m);
      accumulate<T, R>(u, a, m, x, 256 * b + 64 * c, acc);
    }
  }
}

// y[r] = (row . x[r]) for R activation rows.
template <class T, int R>
void dot_rows_q8(const uint8_t* row, int64_t in, const QRow* x, float* y) {
  f32x16 acc[R] = {};
  if constexpr (T::kBlock == 32)
    chunks_32<T, R>(row, in, x, acc);
  else
    chunks_256<T, R>(row, in, x, acc);
  for (int r = 0; r < R; ++r) y[r] = hsum(acc[r]);
}

// Activation rows taken per pass over a weight row: each weight chunk is unpacked once for all of them.
constexpr int kRowsPerPass = 4;

using DotRowsFn = void (*)(const uint8_t*, int64_t, const QRow*, float*);

template <class T>
DotRowsFn dot_rows_for(int r) {
  switch (r) {
    case 1: return dot_rows_q8<T, 1>;
    case 2: return dot_rows_q8<T, 2>;
    case 3: return dot_rows_q8<T, 3>;
    default: return dot_rows_q8<T, 4>;
  }
}

bool has_q8(int64_t t) {
  switch (t) {
    case Q4_0: case Q4_1: case Q5_0: case Q5_1: case Q8_0: case Q4_K: case Q5_K: case Q6_K:
      return true;
    default:
      return false;
  }
}

// The zero-point shift of a type with has_q8, as a bit for quantize_rows (0: none).
unsigned shift_bit(int64_t t) {
  constexpr auto bit = [](int k) { return k < 0 ? 0u : 1u << k; };
  switch (t) {
    case Q4_0: return bit(zero_shift<Q4_0q>());
    case Q5_0: return bit(zero_shift<Q5_0q>());
    case Q8_0: return bit(zero_shift<Q8_0q>());
    case Q6_K: return bit(zero_shift<Q6_Kq>());
    default: return 0;  // the types with a min
  }
}

// The kernel for `r` (1 .. kRowsPerPass) activation rows of a type with has_q8.
DotRowsFn q8_fn(int64_t t, int r) {
  switch (t) {
    case Q4_0: return dot_rows_for<Q4_0q>(r);
    case Q4_1: return dot_rows_for<Q4_1q>(r);
    case Q5_0: return dot_rows_for<Q5_0q>(r);
    case Q5_1: return dot_rows_for<Q5_1q>(r);
    case Q8_0: return dot_rows_for<Q8_0q>(r);
    case Q4_K: return dot_rows_for<Q4_Kq>(r);
    case Q5_K: return dot_rows_for<Q5_Kq>(r);
    default: return dot_rows_for<Q6_Kq>(r);
  }
}

}  // namespace
}  // namespace rlm::gguf

namespace rlm {

using namespace rlm::gguf;

at::Tensor gguf_linear_q8(const at::Tensor& x, at::TensorList blocks, at::IntArrayRef qtypes,
                          const std::optional<at::Tensor>& bias) {
  std::vector<Part> parts;
  const int64_t n = parts_of(x, blocks, qtypes, bias, "gguf_linear_q8", parts);
  unsigned shifts = 0;
  for (const Part& part : parts) {
    TORCH_CHECK(has_q8(part.qtype), "gguf_linear_q8: GGUF tensor type ", part.qtype,
                " has no int8-activation kernel (gguf_linear takes it)");
    shifts |= shift_bit(part.qtype);
  }
  const int64_t in = x.size(1), m = x.size(0), padded = (in + 63) / 64 * 64;
  auto xc = x.contiguous();
  QBuffers buf;
  const std::vector<QRow> xq = quantize_rows(xc.data_ptr<float>(), m, in, padded, shifts, buf);
  auto y = at::empty({m, n}, x.options());
  const float* bp = bias ? bias->data_ptr<float>() : nullptr;
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, n, grain_of(parts), [&](int64_t o0, int64_t o1) {
    size_t p = 0;
    float v[kRowsPerPass];
    for (int64_t o = o0; o < o1; ++o) {
      while (o >= parts[p].first_out + parts[p].rows) ++p;
      const Part& part = parts[p];
      const uint8_t* row = part.data + (o - part.first_out) * part.row_stride;
      for (int64_t r0 = 0; r0 < m; r0 += kRowsPerPass) {
        const int r = int(std::min<int64_t>(kRowsPerPass, m - r0));
        q8_fn(part.qtype, r)(row, in, xq.data() + r0, v);
        for (int i = 0; i < r; ++i) yp[(r0 + i) * n + o] = bp ? v[i] + bp[o] : v[i];
      }
    }
  });
  return y;
}

}  // namespace rlm

RADIXLM_OPS(m) {
  m.def("gguf_linear_q8(Tensor x, Tensor[] blocks, int[] qtypes, Tensor? bias) -> Tensor", rlm::gguf_linear_q8);
}
