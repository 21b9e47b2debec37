// exp(x) for fp32 written so that g++ vectorizes a loop of it (no libm call, no branch): glibc's expf is
// a scalar call, ~10x slower per element than this over an array. Cephes' expf: x = n*ln2 + r with
// |r| <= ln2/2, a degree-7 polynomial for exp(r), then 2^n built in the exponent bits; ~1 ulp on
// [-87, 88], the input clamped there (exp(-87) ~ 1.6e-38 stands in for smaller results).
#pragma once
#include <cstdint>
#include <cstring>

namespace rlm {

inline float fast_exp(float x) {
  x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
  // Round x*log2(e) to the nearest integer with the 1.5*2^23 trick (no rint call, so it vectorizes).
  const float magic = 12582912.0f;
  float n = (x * 1.44269504088896341f + magic) - magic;
  float r = (x - n * 0.693359375f) - n * -2.12194440e-4f;  // ln2 split in two: r exact to ~1 ulp
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = (p * (r * r) + r) + 1.0f;
  int32_t bits = (int32_t(n) + 127) << 23;  // n in [-126, 127]: a normal power of two
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

}  // namespace rlm
