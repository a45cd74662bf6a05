// Sixteen-float vectors (GCC vector extensions: one AVX-512 register, two AVX2 ones) and the
// helpers the CPU attention kernels share.

#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace multiformer {

typedef float vec __attribute__((vector_size(64)));
typedef int32_t ivec __attribute__((vector_size(64)));
typedef uint32_t uvec __attribute__((vector_size(64)));
constexpr int kLanes = 16;

inline vec load(const float* p) { vec v; std::memcpy(&v, p, sizeof(v)); return v; }
inline void store(float* p, vec v) { std::memcpy(p, &v, sizeof(v)); }
inline vec splat(float x) { return vec{} + x; }

// exp(x) for x <= 0 to float precision: 2^k e^r, |r| <= ln2 / 2, e^r by its Taylor series to
// r^6 (relative error ~1e-7); 0 below -87 (e^-87 is at the bottom of float's normal range).
inline vec exp_nonpositive(vec x) {
  const ivec under = x < -87.0f;
  x = under ? splat(-87.0f) : x;
  const vec k = __builtin_convertvector(__builtin_convertvector(x * 1.44269504f - 0.5f, ivec), vec);
  const vec r = (x - k * 0.693145752f) - k * 1.42860677e-6f;
  vec p = splat(1.0f / 720);
  p = p * r + 1.0f / 120; p = p * r + 1.0f / 24; p = p * r + 1.0f / 6;
  p = p * r + 0.5f; p = p * r + 1.0f; p = p * r + 1.0f;
  const ivec exponent = (__builtin_convertvector(k, ivec) + 127) << 23;
  vec scale;
  std::memcpy(&scale, &exponent, sizeof(scale));
  return under ? vec{} : p * scale;
}

inline float lane_max(vec x) { float m = x[0]; for (int l = 1; l < kLanes; ++l) m = std::max(m, x[l]); return m; }
inline float lane_sum(vec x) { float s = 0.0f; for (int l = 0; l < kLanes; ++l) s += x[l]; return s; }

}  // namespace multiformer
