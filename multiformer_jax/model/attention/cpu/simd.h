// Sixteen-float vectors (GCC vector extensions: one AVX-512 register, two AVX2 ones) and the
// helpers the CPU attention kernels share: vector arithmetic, the head sizes they are
// instantiated for, and the OpenMP loop over (batch, head).

#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

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

// Calls f(std::integral_constant<int, D>{}) for dim = D, one of the kernels' head sizes;
// returns false (calling nothing) for any other dim.
template <typename F>
bool with_head_dim(int64_t dim, F&& f) {
  switch (dim) {
    case 32: f(std::integral_constant<int, 32>{}); return true;
    case 64: f(std::integral_constant<int, 64>{}); return true;
    case 128: f(std::integral_constant<int, 128>{}); return true;
    default: return false;
  }
}

inline bool supported_head_dim(int64_t dim) { return with_head_dim(dim, [](auto) {}); }

// task(b, h, scratch) for every (batch, head), one task each on an OpenMP team. Each thread's
// Scratch is kept between calls: no allocation or first touch per call.
template <typename Scratch, typename Task>
void for_each_head(int64_t batch, int64_t heads, Task task) {
  const int64_t tasks = batch * heads;
#pragma omp parallel
  {
    static thread_local Scratch scratch;
#pragma omp for schedule(dynamic)
    for (int64_t n = 0; n < tasks; ++n) task(n / heads, n % heads, scratch);
  }
}

inline float lane_max(vec x) { float m = x[0]; for (int l = 1; l < kLanes; ++l) m = std::max(m, x[l]); return m; }
inline float lane_sum(vec x) { float s = 0.0f; for (int l = 0; l < kLanes; ++l) s += x[l]; return s; }

}  // namespace multiformer
