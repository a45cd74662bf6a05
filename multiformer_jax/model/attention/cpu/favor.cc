// Performer FAVOR+ attention (kernel.py's favor_attention) on the CPU, forward and backward, as
// XLA FFI handlers (multiformer_jax/model/attention/kernel_cpu.py builds and calls them).
//
// With x' = d^-1/4 x, u = x' P^T (P: [m, d] random features), h = |x'|^2 / 2 and
// E = exp(u - h - c), the features are phi = E + eps; c is the row's maximum of u for queries
// and the maximum over the utterance's valid keys and all features for keys. Then
//   KV1 = phi_k^T [v, 1] = E_k^T [v, 1] + eps * sum over valid keys of [v, 1]     [m, d + 1]
//   O1  = phi_q KV1     = E_q KV1 + eps * sum over features of KV1                 [t, d + 1]
//   out = O1[:, :d] / O1[:, d], or 0 where no key is valid (O1 = 0 there: divided by 1).
// Padded keys have E = 0 and no eps. Feature counts that are no multiple of 16 come with zero
// rows of padding in P (attribute `features`: the real count); padded features have E = 0 and
// no eps, so they change nothing. The query stabiliser's derivative is taken at the first
// argmax (kernel.py's query_stabiliser); the key stabiliser is a constant (stop_gradient).
//
// Each (batch, head) is one task on an OpenMP team. Positions are taken in tiles of kRows: a
// tile's exponentials, maxima and row sums are done between its products while it is in
// cache, where XLA:CPU makes a pass over a [time, m] array for each. The forward writes E_q
// and E_k where the caller gives it room (the residuals the backward reads, as XLA's autodiff
// of favor_attention keeps them); an inference call gives none, and they stay in per-thread
// scratch. Long sums (over an utterance's positions, over the features) are formed in blocks
// whose sums are then added, which keeps the float32 rounding near XLA's.

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "simd.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

using namespace multiformer;

constexpr int kRows = 64;     // positions per tile
constexpr int kBlock = 4;     // rows of a register block
constexpr int kChunk = 4;     // vectors of a register block's columns
constexpr int kSumBlock = 32; // features summed apart before joining a product's total

struct Geometry {
  int64_t batch, time, heads, dim;
  int64_t features;   // columns of the feature arrays: the projection's rows, a multiple of kLanes
  int64_t used;       // of which the real features: the rest are zero rows, padding
  int64_t row(int64_t b, int64_t t, int64_t h) const { return ((b * time + t) * heads + h) * dim; }
  int64_t task(int64_t b, int64_t h) const { return b * heads + h; }
  int64_t stride() const { return heads * dim; }     // between positions of one head
};

// y[r][:m] = sum_j x[r][j] w[j][:m] for r < rows; x rows `ldx` apart, y rows `ldy` apart.
// J: the inner size (head_dim); w: [J, m], m a multiple of kLanes.
template <int J>
void rows_times(const float* x, int64_t ldx, int rows, const float* w, int64_t m, float* y,
                int64_t ldy) {
  static const float zeros[J] = {};
  for (int r0 = 0; r0 < rows; r0 += kBlock) {
    const float* xr[kBlock];
    for (int i = 0; i < kBlock; ++i) xr[i] = r0 + i < rows ? x + (r0 + i) * ldx : zeros;
    for (int64_t c0 = 0; c0 < m; c0 += kChunk * kLanes) {
      const int width = static_cast<int>(std::min<int64_t>(kChunk, (m - c0) / kLanes));
      vec acc[kBlock][kChunk] = {};
      for (int j = 0; j < J; ++j) {
        const float* wj = w + j * m + c0;
        vec wv[kChunk];
        for (int c = 0; c < kChunk; ++c) wv[c] = c < width ? load(wj + c * kLanes) : vec{};
        for (int i = 0; i < kBlock; ++i) {
          const vec xs = splat(xr[i][j]);
          for (int c = 0; c < kChunk; ++c) acc[i][c] += xs * wv[c];
        }
      }
      for (int i = 0; i < kBlock && r0 + i < rows; ++i)
        for (int c = 0; c < width; ++c) store(y + (r0 + i) * ldy + c0 + c * kLanes, acc[i][c]);
    }
  }
}

// u[r][used:m] = -inf for r < rows: padded features take no part in a maximum, and their
// exponentials are 0.
void hide_padding(float* u, int rows, int64_t used, int64_t m) {
  for (int r = 0; r < rows; ++r)
    std::fill(u + r * m + used, u + (r + 1) * m, -std::numeric_limits<float>::infinity());
}

// y[r][:D] = sum_f e[r][f] w[f][:D] for r < rows; e: [rows, m] (rows m apart), w: [m, D].
// Summed in blocks of kSumBlock features, each block's sum then added to y.
template <int D>
void features_times(const float* e, int rows, const float* w, int64_t m, float* y,
                    int64_t ldy) {
  constexpr int kVectors = D / kLanes;
  for (int r0 = 0; r0 < rows; r0 += kBlock) {
    const int height = std::min(kBlock, rows - r0);
    for (int c0 = 0; c0 < kVectors; c0 += kChunk) {
      const int width = std::min(kChunk, kVectors - c0);
      for (int64_t f0 = 0; f0 < m; f0 += kSumBlock) {
        vec acc[kBlock][kChunk] = {};
        for (int64_t f = f0; f < std::min(m, f0 + kSumBlock); ++f) {
          const float* wf = w + f * D + c0 * kLanes;
          vec wv[kChunk];
          for (int c = 0; c < kChunk; ++c) wv[c] = c < width ? load(wf + c * kLanes) : vec{};
          for (int i = 0; i < kBlock; ++i) {
            const vec es = splat(i < height ? e[(r0 + i) * m + f] : 0.0f);
            for (int c = 0; c < kChunk; ++c) acc[i][c] += es * wv[c];
          }
        }
        for (int i = 0; i < height; ++i)
          for (int c = 0; c < width; ++c) {
            float* out = y + (r0 + i) * ldy + (c0 + c) * kLanes;
            store(out, f0 == 0 ? acc[i][c] : load(out) + acc[i][c]);
          }
      }
    }
  }
}

// acc[f][:D] += sum_r e[r][f] x[r][:D] for r < rows; e: [rows, m], x rows `ldx` apart.
// The rows' sum is formed apart, then added to acc (a tile's sum at a time).
template <int D>
void accumulate_outer(const float* e, int rows, const float* x, int64_t ldx, int64_t m,
                      float* acc) {
  constexpr int kVectors = D / kLanes;
  for (int64_t f0 = 0; f0 < m; f0 += kBlock) {
    for (int c0 = 0; c0 < kVectors; c0 += kChunk) {
      const int width = std::min(kChunk, kVectors - c0);
      vec sum[kBlock][kChunk] = {};
      for (int r = 0; r < rows; ++r) {
        const float* xr = x + r * ldx + c0 * kLanes;
        vec xv[kChunk];
        for (int c = 0; c < kChunk; ++c) xv[c] = c < width ? load(xr + c * kLanes) : vec{};
        for (int i = 0; i < kBlock; ++i) {
          const vec es = splat(e[r * m + f0 + i]);
          for (int c = 0; c < kChunk; ++c) sum[i][c] += es * xv[c];
        }
      }
      for (int i = 0; i < kBlock; ++i)
        for (int c = 0; c < width; ++c) {
          float* out = acc + (f0 + i) * D + (c0 + c) * kLanes;
          store(out, load(out) + sum[i][c]);
        }
    }
  }
}

// out[:n] += sum_r rows[r][:n] (rows `ld` apart), n a multiple of kLanes; summed in blocks
// of kLanes rows, each block's sum then added to the total.
void add_rows(const float* rows, int count, int64_t ld, int64_t n, float* out) {
  for (int64_t c = 0; c < n; c += kLanes) {
    vec total{};
    for (int r0 = 0; r0 < count; r0 += kLanes) {
      vec s{};
      for (int r = r0; r < std::min(count, r0 + kLanes); ++r) s += load(rows + r * ld + c);
      total += s;
    }
    store(out + c, load(out + c) + total);
  }
}

// sum of x[:n], n a multiple of kLanes: sixteen partial sums.
float sum_blocked(const float* x, int64_t n) {
  vec s{};
  for (int64_t c = 0; c < n; c += kLanes) s += load(x + c);
  return lane_sum(s);
}

float dot(const float* a, const float* b, int64_t n) {
  vec s{};
  for (int64_t c = 0; c < n; c += kLanes) s += load(a + c) * load(b + c);
  return lane_sum(s);
}

float half_square(const float* x, int64_t n, float scale) { return 0.5f * scale * dot(x, x, n); }

// [rows, cols] -> [cols, rows].
void transpose(const float* x, int64_t rows, int64_t cols, float* out) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) out[c * rows + r] = x[r * cols + c];
}

// [m, d]: the random features scaled by d^-1/4, so that x' P^T = x W^T on the unscaled x.
std::vector<float> scaled_projection(const float* projection, int64_t m, int64_t d) {
  std::vector<float> w(m * d);
  const float scale = std::pow(static_cast<float>(d), -0.25f);
  for (int64_t i = 0; i < m * d; ++i) w[i] = projection[i] * scale;
  return w;
}

// d^-1/2: h = |x'|^2 / 2 = kNormScale<D> |x|^2 / 2 on the unscaled x.
template <int D>
const float kNormScale = 1.0f / std::sqrt(static_cast<float>(D));

// One (batch, head)'s part of the forward's results that the backward reads; F and I are
// const-qualified for the backward.
template <typename F, typename I>
struct Saved {
  F* den;      // [time]: the normaliser O1[:, d]
  I* argmax;   // [time]: each query's first maximal feature
  F* e_q;      // [time, m]: E_q (null in an inference call)
  F* e_k;      // [time, m]: E_k (null in an inference call)
  F* kv;       // [m, d]: KV1[:, :d]
  F* ksum;     // [m]: KV1[:, d]
};

template <typename F, typename I>
Saved<F, I> saved_of(const Geometry& g, int64_t b, int64_t h, F* den, I* argmax, F* e_q, F* e_k,
                     F* kv, F* ksum) {
  const int64_t n = g.task(b, h), t = g.time, m = g.features;
  return {den + n * t, argmax + n * t, e_q ? e_q + n * t * m : nullptr,
          e_k ? e_k + n * t * m : nullptr, kv + n * m * g.dim, ksum + n * m};
}

struct Scratch {
  std::vector<float> a, b, c, d, e;
};

// One (batch, head): out, den, argmax and the features E_q, E_k, KV, ksum of it.
template <int D>
void forward_task(const float* q, const float* k, const float* v, const bool* mask,
                  const float* weights_by_dim, const Geometry& g, int64_t b, int64_t h,
                  float eps, float* out, Saved<float, int32_t> saved, Scratch& s) {
  auto [den, argmax, e_q, e_k, kv, ksum] = saved;
  const int64_t m = g.features, time = g.time, ld = g.stride();
  s.a.resize(time);
  s.b.resize(kRows * D);
  float* half_sq = s.a.data();
  float* tile_out = s.b.data();
  // Without a backward to feed (e_q, e_k null), the features live in scratch.
  if (!e_k) { s.c.resize(time * m); e_k = s.c.data(); }
  const bool keep_queries = e_q != nullptr;
  if (!keep_queries) { s.d.resize(kRows * m); e_q = s.d.data(); }
  // Keys: u into e_k, the stabiliser over the valid keys, then E and KV1 tile by tile.
  float peak = -std::numeric_limits<float>::infinity();
  for (int64_t t0 = 0; t0 < time; t0 += kRows) {
    const int rows = static_cast<int>(std::min<int64_t>(kRows, time - t0));
    rows_times<D>(k + g.row(b, t0, h), ld, rows, weights_by_dim, m, e_k + t0 * m, m);
    hide_padding(e_k + t0 * m, rows, g.used, m);
    for (int r = 0; r < rows; ++r) {
      const int64_t t = t0 + r;
      half_sq[t] = half_square(k + g.row(b, t, h), D, kNormScale<D>);
      if (!mask[t]) continue;
      vec top = splat(peak);
      for (int64_t f = 0; f < m; f += kLanes) {
        const vec u = load(e_k + t * m + f);
        top = u > top ? u : top;
      }
      peak = lane_max(top);
    }
  }
  const float c = std::isfinite(peak) ? peak : 0.0f;
  std::fill(kv, kv + m * D, 0.0f);
  std::fill(ksum, ksum + m, 0.0f);
  float valid_sum[D + kLanes] = {};     // sum over valid keys of [v, 1]; [D] counts them
  for (int64_t t0 = 0; t0 < time; t0 += kRows) {
    const int rows = static_cast<int>(std::min<int64_t>(kRows, time - t0));
    float tile_sum[D + 1] = {};
    for (int r = 0; r < rows; ++r) {
      const int64_t t = t0 + r;
      float* e = e_k + t * m;
      if (!mask[t]) { std::fill(e, e + m, 0.0f); continue; }
      const vec norm = splat(half_sq[t]), stabiliser = splat(c);
      for (int64_t f = 0; f < m; f += kLanes)
        store(e + f, exp_nonpositive((load(e + f) - norm) - stabiliser));
      const float* vt = v + g.row(b, t, h);
      for (int j = 0; j < D; ++j) tile_sum[j] += vt[j];
      tile_sum[D] += 1.0f;
    }
    for (int j = 0; j <= D; ++j) valid_sum[j] += tile_sum[j];
    accumulate_outer<D>(e_k + t0 * m, rows, v + g.row(b, t0, h), ld, m, kv);
    add_rows(e_k + t0 * m, rows, m, m, ksum);
  }
  for (int64_t f = 0; f < g.used; ++f) {
    for (int j = 0; j < D; ++j) kv[f * D + j] += eps * valid_sum[j];
    ksum[f] += eps * valid_sum[D];
  }
  // sum over features of KV1, for the queries' eps share.
  float kv_total[D + kLanes] = {};
  add_rows(kv, static_cast<int>(m), D, D, kv_total);
  kv_total[D] = sum_blocked(ksum, m);
  // Queries: u into e_q, each row's stabiliser and first argmax, E, then O1 = E KV1 + eps ...
  for (int64_t t0 = 0; t0 < time; t0 += kRows) {
    const int rows = static_cast<int>(std::min<int64_t>(kRows, time - t0));
    float* e_tile = keep_queries ? e_q + t0 * m : e_q;
    rows_times<D>(q + g.row(b, t0, h), ld, rows, weights_by_dim, m, e_tile, m);
    hide_padding(e_tile, rows, g.used, m);
    for (int r = 0; r < rows; ++r) {
      const int64_t t = t0 + r;
      float* e = e_tile + r * m;
      vec top = load(e);
      for (int64_t f = kLanes; f < m; f += kLanes) { const vec u = load(e + f); top = u > top ? u : top; }
      const float row_max = lane_max(top);
      int32_t first = 0;
      while (first < m - 1 && e[first] != row_max) ++first;
      argmax[t] = first;
      const vec shift = splat(half_square(q + g.row(b, t, h), D, kNormScale<D>) + row_max);
      for (int64_t f = 0; f < m; f += kLanes) store(e + f, exp_nonpositive(load(e + f) - shift));
    }
    features_times<D>(e_tile, rows, kv, m, tile_out, D);
    for (int r = 0; r < rows; ++r) {
      const int64_t t = t0 + r;
      const float total = dot(e_tile + r * m, ksum, m) + eps * kv_total[D];
      den[t] = total;
      const float inverse = 1.0f / (total > 1e-30f ? total : 1.0f);
      float* o = out + g.row(b, t, h);
      for (int j = 0; j < D; ++j) o[j] = (tile_out[r * D + j] + eps * kv_total[j]) * inverse;
    }
  }
}

// One (batch, head): d_q, d_k, d_v from the forward's residuals and d_out.
template <int D>
void backward_task(const float* q, const float* k, const float* v, const bool* mask,
                   const float* weights, const Geometry& g, int64_t b, int64_t h, float eps,
                   const float* out, Saved<const float, const int32_t> saved,
                   const float* d_out, float* d_q, float* d_k, float* d_v, Scratch& s) {
  auto [den, argmax, e_q, e_k, kv, ksum] = saved;
  const int64_t m = g.features, time = g.time, ld = g.stride();
  s.a.resize(2 * m * D + m);
  s.b.resize(m * D);
  s.c.resize(kRows * m);
  s.d.resize(kRows * D);
  s.e.resize(kRows * D);
  float* d_kv = s.a.data();              // [m, D]
  float* d_kv_by_dim = d_kv + m * D;     // [D, m]
  float* d_ksum = d_kv_by_dim + m * D;   // [m]
  float* kv_by_dim = s.b.data();         // [D, m]
  float* d_e = s.c.data();               // [kRows, m]: dL/dE, then dL/du, of a tile
  float* d_o = s.d.data();               // [kRows, D]: dL/dO1[:, :D] of a tile
  float* d_x = s.e.data();               // [kRows, D]
  transpose(kv, m, D, kv_by_dim);
  std::fill(d_kv, d_kv + m * D, 0.0f);
  std::fill(d_ksum, d_ksum + m, 0.0f);
  float d_o_sum[D + 1] = {};             // sum over queries of dL/dO1
  // Queries: dL/dE_q = dO1 KV1^T; dKV1 += E_q^T dO1; d_q = d_u W - s (h' + c').
  for (int64_t t0 = 0; t0 < time; t0 += kRows) {
    const int rows = static_cast<int>(std::min<int64_t>(kRows, time - t0));
    float d_total[kRows], tile_sum[D + 1] = {};
    for (int r = 0; r < rows; ++r) {
      const int64_t t = t0 + r;
      const float total = den[t];
      const bool any_key = total > 1e-30f;     // else the output is 0 whatever q, k and v
      const float clipped = any_key ? total : 1.0f;
      const float* o = out + g.row(b, t, h);
      const float* d_ot = d_out + g.row(b, t, h);
      d_total[r] = any_key ? -dot(d_ot, o, D) / clipped : 0.0f;
      for (int j = 0; j < D; ++j) {
        d_o[r * D + j] = d_ot[j] / clipped;
        tile_sum[j] += d_o[r * D + j];
      }
      tile_sum[D] += d_total[r];
    }
    for (int j = 0; j <= D; ++j) d_o_sum[j] += tile_sum[j];
    const float* e = e_q + t0 * m;
    rows_times<D>(d_o, D, rows, kv_by_dim, m, d_e, m);
    accumulate_outer<D>(e, rows, d_o, D, m, d_kv);
    for (int r = 0; r < rows; ++r) {
      const vec dt = splat(d_total[r]);
      vec sum{};
      for (int64_t f = 0; f < m; f += kLanes) {
        store(d_ksum + f, load(d_ksum + f) + load(e + r * m + f) * dt);
        const vec du = (load(d_e + r * m + f) + load(ksum + f) * dt) * load(e + r * m + f);
        store(d_e + r * m + f, du);
        sum += du;
      }
      d_total[r] = lane_sum(sum);        // now s_r = sum over features of dL/du
    }
    features_times<D>(d_e, rows, weights, m, d_x, D);
    for (int r = 0; r < rows; ++r) {
      const int64_t t = t0 + r;
      const float* qt = q + g.row(b, t, h);
      const float* top_row = weights + argmax[t] * D;
      float* dq = d_q + g.row(b, t, h);
      for (int j = 0; j < D; ++j)
        dq[j] = d_x[r * D + j] - d_total[r] * (kNormScale<D> * qt[j] + top_row[j]);
    }
  }
  for (int64_t f = 0; f < g.used; ++f) {
    for (int j = 0; j < D; ++j) d_kv[f * D + j] += eps * d_o_sum[j];
    d_ksum[f] += eps * d_o_sum[D];
  }
  transpose(d_kv, m, D, d_kv_by_dim);
  float d_kv_total[D] = {};              // eps's share of each valid key's d_v
  add_rows(d_kv, static_cast<int>(m), D, D, d_kv_total);
  for (int j = 0; j < D; ++j) d_kv_total[j] *= eps;
  // Keys: dL/dE_k = v dKV^T + d_ksum; d_v = E_k dKV (+ eps's share); d_k = d_u W - s h'.
  for (int64_t t0 = 0; t0 < time; t0 += kRows) {
    const int rows = static_cast<int>(std::min<int64_t>(kRows, time - t0));
    const float* e = e_k + t0 * m;
    rows_times<D>(v + g.row(b, t0, h), ld, rows, d_kv_by_dim, m, d_e, m);
    features_times<D>(e, rows, d_kv, m, d_x, D);
    for (int r = 0; r < rows; ++r) {
      float* dv = d_v + g.row(b, t0 + r, h);
      const bool valid = mask[t0 + r];
      for (int j = 0; j < D; ++j) dv[j] = d_x[r * D + j] + (valid ? d_kv_total[j] : 0.0f);
    }
    float sums[kRows];
    for (int r = 0; r < rows; ++r) {
      vec sum{};
      for (int64_t f = 0; f < m; f += kLanes) {
        const vec du = (load(d_e + r * m + f) + load(d_ksum + f)) * load(e + r * m + f);
        store(d_e + r * m + f, du);
        sum += du;
      }
      sums[r] = lane_sum(sum);
    }
    features_times<D>(d_e, rows, weights, m, d_x, D);
    for (int r = 0; r < rows; ++r) {
      const int64_t t = t0 + r;
      const float* kt = k + g.row(b, t, h);
      float* dk = d_k + g.row(b, t, h);
      for (int j = 0; j < D; ++j) dk[j] = d_x[r * D + j] - sums[r] * kNormScale<D> * kt[j];
    }
  }
}

ffi::Error check(const Geometry& g) {
  if (!supported_head_dim(g.dim))
    return ffi::Error::InvalidArgument("favor: head_dim must be 32, 64 or 128");
  if (g.features <= 0 || g.features % kLanes != 0)
    return ffi::Error::InvalidArgument("favor: the projection's rows must be a multiple of 16");
  if (g.used <= g.features - kLanes || g.used > g.features)
    return ffi::Error::InvalidArgument("favor: features must be the projection's rows less "
                                       "fewer than 16 rows of padding");
  return ffi::Error::Success();
}

Geometry geometry(const ffi::Buffer<ffi::F32>& x, const ffi::Buffer<ffi::F32>& projection,
                  int64_t used) {
  const auto dims = x.dimensions();
  return Geometry{dims[0], dims[1], dims[2], dims[3], projection.dimensions()[0], used};
}

ffi::Error Forward(ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> k, ffi::Buffer<ffi::F32> v,
                   ffi::Buffer<ffi::PRED> key_mask, ffi::Buffer<ffi::F32> projection,
                   ffi::ResultBuffer<ffi::F32> out, ffi::ResultBuffer<ffi::F32> den,
                   ffi::ResultBuffer<ffi::S32> argmax, ffi::ResultBuffer<ffi::F32> e_q,
                   ffi::ResultBuffer<ffi::F32> e_k, ffi::ResultBuffer<ffi::F32> kv,
                   ffi::ResultBuffer<ffi::F32> ksum, float eps, int64_t features) {
  const Geometry g = geometry(q, projection, features);
  if (auto error = check(g); error.failure()) return error;
  std::vector<float> weights_by_dim(g.features * g.dim);    // [d, m]: u = x W^T
  transpose(scaled_projection(projection.typed_data(), g.features, g.dim).data(), g.features,
            g.dim, weights_by_dim.data());
  const bool keep = e_q->element_count() > 0;   // empty: the forward of an inference call
  for_each_head<Scratch>(g.batch, g.heads, [&](int64_t b, int64_t h, Scratch& s) {
    const auto saved = saved_of<float, int32_t>(
        g, b, h, den->typed_data(), argmax->typed_data(), keep ? e_q->typed_data() : nullptr,
        keep ? e_k->typed_data() : nullptr, kv->typed_data(), ksum->typed_data());
    with_head_dim(g.dim, [&](auto dim) {
      forward_task<dim.value>(q.typed_data(), k.typed_data(), v.typed_data(),
                              key_mask.typed_data() + b * g.time, weights_by_dim.data(), g, b,
                              h, eps, out->typed_data(), saved, s);
    });
  });
  return ffi::Error::Success();
}

ffi::Error Backward(ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> k, ffi::Buffer<ffi::F32> v,
                    ffi::Buffer<ffi::PRED> key_mask, ffi::Buffer<ffi::F32> projection,
                    ffi::Buffer<ffi::F32> out, ffi::Buffer<ffi::F32> den,
                    ffi::Buffer<ffi::S32> argmax, ffi::Buffer<ffi::F32> e_q,
                    ffi::Buffer<ffi::F32> e_k, ffi::Buffer<ffi::F32> kv,
                    ffi::Buffer<ffi::F32> ksum, ffi::Buffer<ffi::F32> d_out,
                    ffi::ResultBuffer<ffi::F32> d_q, ffi::ResultBuffer<ffi::F32> d_k,
                    ffi::ResultBuffer<ffi::F32> d_v, float eps, int64_t features) {
  const Geometry g = geometry(q, projection, features);
  if (auto error = check(g); error.failure()) return error;
  const std::vector<float> weights =                       // [m, d]: d_x = d_u W
      scaled_projection(projection.typed_data(), g.features, g.dim);
  for_each_head<Scratch>(g.batch, g.heads, [&](int64_t b, int64_t h, Scratch& s) {
    const auto saved = saved_of<const float, const int32_t>(
        g, b, h, den.typed_data(), argmax.typed_data(), e_q.typed_data(), e_k.typed_data(),
        kv.typed_data(), ksum.typed_data());
    with_head_dim(g.dim, [&](auto dim) {
      backward_task<dim.value>(q.typed_data(), k.typed_data(), v.typed_data(),
                               key_mask.typed_data() + b * g.time, weights.data(), g, b, h, eps,
                               out.typed_data(), saved, d_out.typed_data(), d_q->typed_data(),
                               d_k->typed_data(), d_v->typed_data(), s);
    });
  });
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(FavorForward, Forward,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()    // q
                                  .Arg<ffi::Buffer<ffi::F32>>()    // k
                                  .Arg<ffi::Buffer<ffi::F32>>()    // v
                                  .Arg<ffi::Buffer<ffi::PRED>>()   // key_mask
                                  .Arg<ffi::Buffer<ffi::F32>>()    // projection
                                  .Ret<ffi::Buffer<ffi::F32>>()    // out
                                  .Ret<ffi::Buffer<ffi::F32>>()    // den
                                  .Ret<ffi::Buffer<ffi::S32>>()    // argmax
                                  .Ret<ffi::Buffer<ffi::F32>>()    // e_q
                                  .Ret<ffi::Buffer<ffi::F32>>()    // e_k
                                  .Ret<ffi::Buffer<ffi::F32>>()    // kv
                                  .Ret<ffi::Buffer<ffi::F32>>()    // ksum
                                  .Attr<float>("eps")
                                  .Attr<int64_t>("features"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(FavorBackward, Backward,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()    // q
                                  .Arg<ffi::Buffer<ffi::F32>>()    // k
                                  .Arg<ffi::Buffer<ffi::F32>>()    // v
                                  .Arg<ffi::Buffer<ffi::PRED>>()   // key_mask
                                  .Arg<ffi::Buffer<ffi::F32>>()    // projection
                                  .Arg<ffi::Buffer<ffi::F32>>()    // out
                                  .Arg<ffi::Buffer<ffi::F32>>()    // den
                                  .Arg<ffi::Buffer<ffi::S32>>()    // argmax
                                  .Arg<ffi::Buffer<ffi::F32>>()    // e_q
                                  .Arg<ffi::Buffer<ffi::F32>>()    // e_k
                                  .Arg<ffi::Buffer<ffi::F32>>()    // kv
                                  .Arg<ffi::Buffer<ffi::F32>>()    // ksum
                                  .Arg<ffi::Buffer<ffi::F32>>()    // d_out
                                  .Ret<ffi::Buffer<ffi::F32>>()    // d_q
                                  .Ret<ffi::Buffer<ffi::F32>>()    // d_k
                                  .Ret<ffi::Buffer<ffi::F32>>()    // d_v
                                  .Attr<float>("eps")
                                  .Attr<int64_t>("features"));
