// Exact centred sliding-window attention on the CPU, forward and backward, as XLA FFI
// handlers (multiformer_jax/model/attention/local_cpu.py builds and calls them).
//
// Query i attends to keys j with |i - j| <= radius and key_mask[j]. Queries are taken in tiles
// of kTile; a tile's scores are computed against the keys its band spans (kTile + 2 * radius,
// rounded to whole vectors), not against whole key blocks, so the products do ~1.1x the band's
// work for radius 64 (a block-of-64 layout in XLA does 1.5x). Each (batch, head) is one task;
// tasks run on an OpenMP team. Arrays are [batch, time, heads, head_dim] float32, read in place
// (rows of one head are heads * head_dim apart); keys and values are transposed per task into a
// [head_dim, time] scratch so that sixteen consecutive keys form one vector.
//
// The backward recomputes each tile's weights from the saved log-sum-exp (FlashAttention-2's
// scheme): dP = dO V^T, dS = P (dP - rowsum(dO * O)), dQ = scale dS K, dK += scale dS^T Q,
// dV += P^T dO.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "simd.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

using namespace multiformer;

constexpr int kTile = 4;          // queries per tile
constexpr int kGroup = 4;         // key vectors per register block of the score product
constexpr float kMaskedLogit = -1e30f;
constexpr int kMaxVectors = 64;   // key vectors per tile: radius <= 494

struct Geometry {
  int64_t batch, time, heads, dim;
  int64_t offset(int64_t b, int64_t t, int64_t h) const { return ((b * time + t) * heads + h) * dim; }
};

// Columns of the transposed keys and values: whole vectors, plus one so that a tile's last
// vector may start at its last key.
int64_t padded_time(int64_t time) { return (time + kLanes - 1) / kLanes * kLanes + kLanes; }

// Key vectors a tile's row of weights holds: the keys its band spans, from a vector boundary.
int64_t tile_vectors(int64_t radius) { return (kTile + 2 * radius) / kLanes + 2; }

// [time, dim] rows of head (b, h) -> [dim, padded] columns, zero beyond `time`.
void transpose_rows(const float* x, const Geometry& g, int64_t b, int64_t h, int64_t padded,
                    float* out) {
  std::fill(out, out + g.dim * padded, 0.0f);
  for (int64_t t = 0; t < g.time; ++t) {
    const float* src = x + g.offset(b, t, h);
    for (int64_t d = 0; d < g.dim; ++d) out[d * padded + t] = src[d];
  }
}

// scores[t][c] = scale * sum_d rows[t][d] * columns[d][first + c], for c < vectors * 16.
// rows: kTile pointers (nullptr rows give zeros); columns: [dim, padded].
template <int D>
void tile_products(const float* const rows[kTile], const float* columns, int64_t padded,
                   int64_t first, int vectors, float scale, float* scores, int stride) {
  for (int v0 = 0; v0 < vectors; v0 += kGroup) {
    const int width = std::min(kGroup, vectors - v0);
    vec acc[kTile][kGroup] = {};
    for (int d = 0; d < D; ++d) {
      const float* column = columns + d * padded + first + v0 * kLanes;
      vec keys[kGroup];
      for (int u = 0; u < kGroup; ++u) keys[u] = u < width ? load(column + u * kLanes) : vec{};
      for (int t = 0; t < kTile; ++t) {
        const vec q = splat(rows[t] ? rows[t][d] : 0.0f);
        for (int u = 0; u < kGroup; ++u) acc[t][u] += q * keys[u];
      }
    }
    for (int t = 0; t < kTile; ++t)
      for (int u = 0; u < width; ++u) store(scores + t * stride + (v0 + u) * kLanes, acc[t][u] * scale);
  }
}

// out[t][:] += sum_c weights[t][c] * x[first + c][:] over the keys [lo, hi) of the tile.
template <int D>
void weighted_rows(const float* weights, int stride, const float* x, const Geometry& g,
                   int64_t b, int64_t h, int64_t first, int64_t lo, int64_t hi,
                   vec out[kTile][D / kLanes]) {
  for (int64_t j = lo; j < hi; ++j) {
    const float* row = x + g.offset(b, j, h);
    vec values[D / kLanes];
    for (int c = 0; c < D / kLanes; ++c) values[c] = load(row + c * kLanes);
    for (int t = 0; t < kTile; ++t) {
      const vec w = splat(weights[t * stride + (j - first)]);
      for (int c = 0; c < D / kLanes; ++c) out[t][c] += w * values[c];
    }
  }
}

// Attention dropout with the XLA band's very masks (local.py, dropout.py): the band's chunk c
// of `chunk_blocks` query blocks of `block` queries draws mask[b, h, cb, qi, w] (cb the block
// in the chunk, qi the query in the block, w the key's place among the block's `width` =
// block + 2 * radius keys) as lowbias32(lowbias32(index ^ key0) ^ key1) of the element's
// row-major index under chunk c's key words, kept where the top 23 bits as a float in [0, 1)
// are below keep_below; kept weights are scaled by `scale` = 1 / (1 - rate).
struct Dropout {
  const uint32_t* words = nullptr;   // [chunks, 2]; null: no dropout
  int64_t block = 1, chunk_blocks = 1, heads = 1, radius = 0;
  float keep_below = 1.0f, scale = 1.0f;
  bool active() const { return words != nullptr; }
};

inline uvec lowbias32(uvec x) {
  x ^= x >> 16; x *= 0x7FEB352Du; x ^= x >> 15; x *= 0x846CA68Bu;
  return x ^ (x >> 16);
}

// weights[t][c] *= the mask (0 or scale) of query i0 + t and key first + c, for the tile's
// `vectors` vectors of keys (entries outside a query's band are 0 already and stay so).
void apply_dropout(const Dropout& d, int64_t b, int64_t h, int64_t i0, int64_t time,
                   int64_t first, int vectors, float* weights, int stride) {
  const int64_t width = d.block + 2 * d.radius;
  uvec lanes;
  for (int l = 0; l < kLanes; ++l) lanes[l] = static_cast<uint32_t>(l);
  for (int t = 0; t < kTile && i0 + t < time; ++t) {
    const int64_t i = i0 + t, block = i / d.block;
    const int64_t chunk = block / d.chunk_blocks, in_chunk = block % d.chunk_blocks;
    const uint32_t key0 = d.words[2 * chunk], key1 = d.words[2 * chunk + 1];
    // The index of (i, first): key j sits at w = j - (block * d.block - radius) in its row.
    const int64_t row = (((b * d.heads + h) * d.chunk_blocks + in_chunk) * d.block + i % d.block);
    const int64_t w0 = first - (block * d.block - d.radius);
    const uint32_t base = static_cast<uint32_t>(row * width + w0);
    float* w = weights + t * stride;
    for (int v = 0; v < vectors; ++v) {
      uvec bits = lowbias32(lowbias32((lanes + (base + static_cast<uint32_t>(v * kLanes))) ^ key0) ^ key1);
      const uvec mantissa = (bits >> 9) | 0x3F800000u;
      vec uniform;
      std::memcpy(&uniform, &mantissa, sizeof(uniform));
      uniform -= 1.0f;
      const vec kept = (uniform < d.keep_below) ? splat(d.scale) : vec{};
      store(w + v * kLanes, load(w + v * kLanes) * kept);
    }
  }
}

struct Band {
  int64_t radius;
  // The keys tile [i0, i0 + kTile) can see: [lo, hi), read from `first` (lo rounded down to a
  // vector) in `vectors` whole vectors.
  int64_t lo, hi, first;
  int vectors;
  void place(int64_t i0, int64_t time) {
    lo = std::max<int64_t>(0, i0 - radius);
    hi = std::min<int64_t>(time, i0 + kTile - 1 + radius + 1);
    first = lo - lo % kLanes;
    vectors = static_cast<int>((hi - first + kLanes - 1) / kLanes);
  }
};

// Scores of the tile's queries -> weights exp(s - shift) in the band, zero elsewhere; writes
// the row maxima and sums when `lse` is null, else uses shift = lse[i].
template <int D>
void tile_weights(const float* q, const float* key_columns, int64_t padded, const Geometry& g,
                  int64_t b, int64_t h, int64_t i0, const Band& band, const bool* mask,
                  float scale, const float* lse, float* weights, int stride, float* peak,
                  float* total) {
  const float* rows[kTile];
  for (int t = 0; t < kTile; ++t)
    rows[t] = i0 + t < g.time ? q + g.offset(b, i0 + t, h) : nullptr;
  tile_products<D>(rows, key_columns, padded, band.first, band.vectors, scale, weights, stride);
  // valid[c]: key first + c exists and is not padding.
  float valid[kMaxVectors * kLanes];
  for (int c = 0; c < band.vectors * kLanes; ++c) {
    const int64_t j = band.first + c;
    valid[c] = (j >= band.lo && j < band.hi && mask[j]) ? 1.0f : 0.0f;
  }
  vec lanes;
  for (int l = 0; l < kLanes; ++l) lanes[l] = static_cast<float>(l);
  for (int t = 0; t < kTile; ++t) {
    const int64_t i = i0 + t;
    float* w = weights + t * stride;
    // In the band: first + c in [i - radius, i + radius].
    const float band_lo = static_cast<float>(i - band.radius - band.first);
    const float band_hi = static_cast<float>(i + band.radius - band.first);
    auto visible = [&](int v) {
      const vec c = lanes + static_cast<float>(v * kLanes);
      return (c >= band_lo) & (c <= band_hi) & (load(valid + v * kLanes) > 0.5f);
    };
    if (i >= g.time) { std::fill(w, w + band.vectors * kLanes, 0.0f); continue; }
    float shift;
    if (lse) {
      shift = lse[i];
    } else {
      vec m = splat(kMaskedLogit);
      for (int v = 0; v < band.vectors; ++v) {
        const vec s = load(w + v * kLanes);
        m = visible(v) ? (s > m ? s : m) : m;
      }
      shift = lane_max(m);
    }
    vec sum{};
    for (int v = 0; v < band.vectors; ++v) {
      const vec e = visible(v) ? exp_nonpositive(load(w + v * kLanes) - shift) : vec{};
      store(w + v * kLanes, e);
      sum += e;
    }
    if (!lse) { peak[t] = shift; total[t] = lane_sum(sum); }
  }
}

template <int D>
void forward_task(const float* q, const float* k, const float* v, const bool* mask_all,
                  const Geometry& g, int64_t radius, const Dropout& dropout, int64_t b,
                  int64_t h, float* out, float* lse_all, std::vector<float>& scratch) {
  const int64_t padded = padded_time(g.time);
  const int stride = static_cast<int>(tile_vectors(radius) * kLanes);
  scratch.resize(D * padded + kTile * stride);
  float* key_columns = scratch.data();
  float* weights = key_columns + D * padded;
  transpose_rows(k, g, b, h, padded, key_columns);
  const bool* mask = mask_all + b * g.time;
  float* lse = lse_all + (b * g.heads + h) * g.time;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  Band band{radius};
  for (int64_t i0 = 0; i0 < g.time; i0 += kTile) {
    band.place(i0, g.time);
    float peak[kTile], total[kTile];
    tile_weights<D>(q, key_columns, padded, g, b, h, i0, band, mask, scale, nullptr, weights,
                    stride, peak, total);
    // Dropped after the normaliser is taken: the kept weights are divided by the full sum.
    if (dropout.active())
      apply_dropout(dropout, b, h, i0, g.time, band.first, band.vectors, weights, stride);
    vec acc[kTile][D / kLanes] = {};
    weighted_rows<D>(weights, stride, v, g, b, h, band.first, band.lo, band.hi, acc);
    for (int t = 0; t < kTile && i0 + t < g.time; ++t) {
      const float normaliser = std::max(total[t], 1e-30f);
      float* o = out + g.offset(b, i0 + t, h);
      for (int c = 0; c < D / kLanes; ++c) store(o + c * kLanes, acc[t][c] / normaliser);
      lse[i0 + t] = peak[t] + std::log(normaliser);
    }
  }
}

template <int D>
void backward_task(const float* q, const float* k, const float* v, const bool* mask_all,
                   const float* out, const float* lse_all, const float* d_out,
                   const Geometry& g, int64_t radius, const Dropout& dropout, int64_t b,
                   int64_t h, float* d_q, float* d_k, float* d_v, std::vector<float>& scratch) {
  const int64_t padded = padded_time(g.time);
  const int stride = static_cast<int>(tile_vectors(radius) * kLanes);
  scratch.resize(2 * D * padded + 3 * kTile * stride);
  float* key_columns = scratch.data();
  float* value_columns = key_columns + D * padded;
  float* probs = value_columns + D * padded;
  float* d_scores = probs + kTile * stride;
  // The weights the values were taken with: probs times the dropout mask (probs without it).
  float* kept = dropout.active() ? d_scores + kTile * stride : probs;
  transpose_rows(k, g, b, h, padded, key_columns);
  transpose_rows(v, g, b, h, padded, value_columns);
  for (int64_t t = 0; t < g.time; ++t) {
    std::fill(d_k + g.offset(b, t, h), d_k + g.offset(b, t, h) + D, 0.0f);
    std::fill(d_v + g.offset(b, t, h), d_v + g.offset(b, t, h) + D, 0.0f);
  }
  const bool* mask = mask_all + b * g.time;
  const float* lse = lse_all + (b * g.heads + h) * g.time;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  Band band{radius};
  for (int64_t i0 = 0; i0 < g.time; i0 += kTile) {
    band.place(i0, g.time);
    tile_weights<D>(q, key_columns, padded, g, b, h, i0, band, mask, scale, lse, probs, stride,
                    nullptr, nullptr);
    if (dropout.active()) {
      std::copy(probs, probs + kTile * stride, kept);
      apply_dropout(dropout, b, h, i0, g.time, band.first, band.vectors, kept, stride);
    }
    const float* rows[kTile];
    float delta[kTile] = {};
    for (int t = 0; t < kTile; ++t) {
      rows[t] = i0 + t < g.time ? d_out + g.offset(b, i0 + t, h) : nullptr;
      if (!rows[t]) continue;
      const float* o = out + g.offset(b, i0 + t, h);
      for (int d = 0; d < D; ++d) delta[t] += rows[t][d] * o[d];
    }
    tile_products<D>(rows, value_columns, padded, band.first, band.vectors, 1.0f, d_scores,
                     stride);
    for (int t = 0; t < kTile; ++t)
      for (int c = 0; c < band.vectors * kLanes; ++c) {
        // dS = P (m dP - delta), m the dropout mask (0 or 1 / (1 - rate)): kept dP - P delta.
        float& ds = d_scores[t * stride + c];
        const float p = probs[t * stride + c];
        ds = (dropout.active() ? kept[t * stride + c] * ds - p * delta[t] : p * (ds - delta[t])) *
             scale;
      }
    vec acc[kTile][D / kLanes] = {};
    weighted_rows<D>(d_scores, stride, k, g, b, h, band.first, band.lo, band.hi, acc);
    for (int t = 0; t < kTile && i0 + t < g.time; ++t) {
      float* dq = d_q + g.offset(b, i0 + t, h);
      for (int c = 0; c < D / kLanes; ++c) store(dq + c * kLanes, acc[t][c]);
    }
    // dK_j += sum_t dS[t][j] q_t, dV_j += sum_t (P m)[t][j] dO_t.
    vec q_rows[kTile][D / kLanes], d_out_rows[kTile][D / kLanes];
    for (int t = 0; t < kTile; ++t)
      for (int c = 0; c < D / kLanes; ++c) {
        const bool in = i0 + t < g.time;
        q_rows[t][c] = in ? load(q + g.offset(b, i0 + t, h) + c * kLanes) : vec{};
        d_out_rows[t][c] = in ? load(d_out + g.offset(b, i0 + t, h) + c * kLanes) : vec{};
      }
    for (int64_t j = band.lo; j < band.hi; ++j) {
      float* dk = d_k + g.offset(b, j, h);
      float* dv = d_v + g.offset(b, j, h);
      vec sum_k[D / kLanes], sum_v[D / kLanes];
      for (int c = 0; c < D / kLanes; ++c) { sum_k[c] = load(dk + c * kLanes); sum_v[c] = load(dv + c * kLanes); }
      for (int t = 0; t < kTile; ++t) {
        const vec ds = splat(d_scores[t * stride + (j - band.first)]);
        const vec p = splat(kept[t * stride + (j - band.first)]);
        for (int c = 0; c < D / kLanes; ++c) {
          sum_k[c] += ds * q_rows[t][c];
          sum_v[c] += p * d_out_rows[t][c];
        }
      }
      for (int c = 0; c < D / kLanes; ++c) { store(dk + c * kLanes, sum_k[c]); store(dv + c * kLanes, sum_v[c]); }
    }
  }
}

Geometry geometry(const ffi::Buffer<ffi::F32>& x) {
  const auto dims = x.dimensions();
  return Geometry{dims[0], dims[1], dims[2], dims[3]};
}

ffi::Error check(const Geometry& g, int64_t radius) {
  if (!supported_head_dim(g.dim))
    return ffi::Error::InvalidArgument("local_band: head_dim must be 32, 64 or 128");
  if (radius < 0 || tile_vectors(radius) > kMaxVectors)
    return ffi::Error::InvalidArgument("local_band: radius out of range");
  return ffi::Error::Success();
}

Dropout dropout_of(const ffi::Buffer<ffi::U32>& keys, const Geometry& g, int64_t radius,
                   float keep_below, float scale, int64_t block, int64_t chunk_blocks) {
  Dropout d;
  if (keys.element_count() == 0) return d;    // no dropout
  d.words = keys.typed_data();
  d.block = block, d.chunk_blocks = chunk_blocks, d.heads = g.heads, d.radius = radius;
  d.keep_below = keep_below, d.scale = scale;
  return d;
}

ffi::Error Forward(ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> k, ffi::Buffer<ffi::F32> v,
                   ffi::Buffer<ffi::PRED> key_mask, ffi::Buffer<ffi::U32> dropout_keys,
                   ffi::ResultBuffer<ffi::F32> out, ffi::ResultBuffer<ffi::F32> lse,
                   int64_t radius, float keep_below, float scale, int64_t block,
                   int64_t chunk_blocks) {
  const Geometry g = geometry(q);
  if (auto error = check(g, radius); error.failure()) return error;
  const Dropout dropout = dropout_of(dropout_keys, g, radius, keep_below, scale, block,
                                     chunk_blocks);
  for_each_head<std::vector<float>>(g.batch, g.heads, [&](int64_t b, int64_t h, auto& scratch) {
    with_head_dim(g.dim, [&](auto dim) {
      forward_task<dim.value>(q.typed_data(), k.typed_data(), v.typed_data(),
                              key_mask.typed_data(), g, radius, dropout, b, h,
                              out->typed_data(), lse->typed_data(), scratch);
    });
  });
  return ffi::Error::Success();
}

ffi::Error Backward(ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> k, ffi::Buffer<ffi::F32> v,
                    ffi::Buffer<ffi::PRED> key_mask, ffi::Buffer<ffi::U32> dropout_keys,
                    ffi::Buffer<ffi::F32> out, ffi::Buffer<ffi::F32> lse,
                    ffi::Buffer<ffi::F32> d_out, ffi::ResultBuffer<ffi::F32> d_q,
                    ffi::ResultBuffer<ffi::F32> d_k, ffi::ResultBuffer<ffi::F32> d_v,
                    int64_t radius, float keep_below, float scale, int64_t block,
                    int64_t chunk_blocks) {
  const Geometry g = geometry(q);
  if (auto error = check(g, radius); error.failure()) return error;
  const Dropout dropout = dropout_of(dropout_keys, g, radius, keep_below, scale, block,
                                     chunk_blocks);
  for_each_head<std::vector<float>>(g.batch, g.heads, [&](int64_t b, int64_t h, auto& scratch) {
    with_head_dim(g.dim, [&](auto dim) {
      backward_task<dim.value>(q.typed_data(), k.typed_data(), v.typed_data(),
                               key_mask.typed_data(), out.typed_data(), lse.typed_data(),
                               d_out.typed_data(), g, radius, dropout, b, h, d_q->typed_data(),
                               d_k->typed_data(), d_v->typed_data(), scratch);
    });
  });
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(LocalBandForward, Forward,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::PRED>>()
                                  .Arg<ffi::Buffer<ffi::U32>>()    // dropout keys [chunks, 2]
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<int64_t>("radius")
                                  .Attr<float>("keep_below")
                                  .Attr<float>("scale")
                                  .Attr<int64_t>("block")
                                  .Attr<int64_t>("chunk_blocks"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(LocalBandBackward, Backward,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::PRED>>()
                                  .Arg<ffi::Buffer<ffi::U32>>()    // dropout keys [chunks, 2]
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<int64_t>("radius")
                                  .Attr<float>("keep_below")
                                  .Attr<float>("scale")
                                  .Attr<int64_t>("block")
                                  .Attr<int64_t>("chunk_blocks"));
