// Fused CPU kernels of the rendering network (`model/inference.py`, `render.precision: bf16`), for both
// models alike: each replaces a chain of PyTorch operations that pass over `[points, views, width]`
// tensors several times (at width 32 those passes, not the matmuls, are most of a render's time) by one
// pass that keeps a point's rows in registers. `model/render_kernels.py` holds the PyTorch form of each,
// which the tests compare them with and which runs where these cannot be built.
//
//   view_token_inputs   relu(visible * bilinear(W_f F) + W_rgb rgb + b) written as [points, views, width]
//                        (the first layer of the view tokens after the projection moved out of the
//                        per-sample path; grid_sample's border padding with align_corners)
//   masked_max_views    the maximum over the visible views of each point's tokens, 0 where none is
//   layer_norm_rows     LayerNorm over the last axis with float32 statistics, optionally of x + residual
//                        (then also returning the sum)
//   subtraction_view_attention   GNT's view attention (a small MLP of k - q per view and channel, softmax
//                        over the views) from its keys and values, before its output layer
//   softmax_ray_attention   GNT's ray attention (softmax over a ray's samples, per head) between its
//                        projections
//   sample_geometry     each sample projected into every source view (`geometry.projection.project_points`:
//                        its grid_sample coordinates and visibility) and GNT's relative directions
//                        (`relative_directions`), without the [views, points, 3] intermediates
//   prior_statistics    the read-out's consistency prior per sample (`model/consistency_prior.py`): the
//                        colours and features read in every view, their spreads over the views and the
//                        (angle-weighted) mean colour, each point's reads kept in registers
//
// Storage is bf16 or float32; arithmetic is float32. bf16 is written rounded to nearest even. Sums along
// a row are SIMD reductions (`omp simd`: partial sums per lane, as PyTorch's vectorised kernels sum), and
// softmax_ray_attention runs in AVX2 vectors where the build has them (the float math is
// `core/csrc/vector_math.h`).

#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <tuple>
#include <type_traits>
#include <vector>

#include "../../core/csrc/vector_math.h"

namespace {

constexpr int64_t kMaxWidth = 512;
constexpr int64_t kGrain = 256;
constexpr int64_t kMaxSubtractionViews = 64;

using pola_gnt_math::exp_nonpositive;

inline float to_float(c10::BFloat16 x) { return pola_gnt_math::bf16_to_float(x); }
inline float to_float(float x) { return x; }

// Round to nearest even (the values are finite: no NaN case), as c10's conversion does for finite values.
inline void store(c10::BFloat16* out, float x) {
  uint32_t bits = std::bit_cast<uint32_t>(x);
  bits += 0x7FFFu + ((bits >> 16) & 1u);
  out->x = static_cast<uint16_t>(bits >> 16);
}
inline void store(float* out, float x) { *out = x; }

// The value `store` writes into T, as a float.
template <typename T>
inline float stored_value(float x) {
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    uint32_t bits = std::bit_cast<uint32_t>(x);
    bits += 0x7FFFu + ((bits >> 16) & 1u);
    return std::bit_cast<float>(bits & 0xFFFF0000u);
  } else {
    return x;
  }
}

template <typename F>
void dispatch_storage(const at::Tensor& t, F&& f) {
  if (t.scalar_type() == at::kBFloat16) {
    f(c10::BFloat16{});
  } else {
    TORCH_CHECK(t.scalar_type() == at::kFloat, "render kernels: bf16 or float32 storage, got ", t.scalar_type());
    f(float{});
  }
}

// ------------------------------------------------------------------------------------------------
// view_token_inputs(projected [V, h, w, C] f32, grid [V, P, 2] f32, visible [V, P] bool, rgb [V, 3, P] f32,
//                   rgb_weight [C, 3] f32, bias [C] f32, out_dtype) -> [P, V, C]
// grid_sample's bilinear read (align_corners=True, border padding): x = (g + 1) / 2 (w - 1) clipped to
// [0, w - 1]; corners beyond the edge get weight 0 (they only occur with weight 0 after the clip).

template <typename Out>
void view_token_inputs_impl(const at::Tensor& projected, const at::Tensor& grid, const at::Tensor& visible,
                            const at::Tensor& rgb, const at::Tensor& rgb_weight, const at::Tensor& bias,
                            at::Tensor& out) {
  const int64_t views = projected.size(0), h = projected.size(1), w = projected.size(2), C = projected.size(3);
  const int64_t points = grid.size(1);
  const float* maps = projected.data_ptr<float>();
  const float* g = grid.data_ptr<float>();
  const bool* vis = visible.data_ptr<bool>();
  const float* colours = rgb.data_ptr<float>();
  const float* wr = rgb_weight.data_ptr<float>();
  const float* b = bias.data_ptr<float>();
  Out* o = out.data_ptr<Out>();
  float w0[kMaxWidth], w1[kMaxWidth], w2[kMaxWidth];  // the colour weights by input channel
  for (int64_t c = 0; c < C; ++c) {
    w0[c] = wr[c * 3];
    w1[c] = wr[c * 3 + 1];
    w2[c] = wr[c * 3 + 2];
  }
  const float sx = 0.5f * static_cast<float>(w - 1), sy = 0.5f * static_cast<float>(h - 1);
  at::parallel_for(0, points, kGrain, [&](int64_t first, int64_t last) {
    float row[kMaxWidth];
    for (int64_t p = first; p < last; ++p) {
      for (int64_t v = 0; v < views; ++v) {
        const int64_t vp = v * points + p;
        const float r = colours[(v * 3) * points + p], gr = colours[(v * 3 + 1) * points + p],
                    bl = colours[(v * 3 + 2) * points + p];
        for (int64_t c = 0; c < C; ++c) row[c] = b[c] + w0[c] * r + w1[c] * gr + w2[c] * bl;
        if (vis[vp]) {
          const float x = std::clamp((g[2 * vp] + 1.0f) * sx, 0.0f, static_cast<float>(w - 1));
          const float y = std::clamp((g[2 * vp + 1] + 1.0f) * sy, 0.0f, static_cast<float>(h - 1));
          const int64_t x0 = static_cast<int64_t>(std::floor(x)), y0 = static_cast<int64_t>(std::floor(y));
          const int64_t x1 = std::min(x0 + 1, w - 1), y1 = std::min(y0 + 1, h - 1);
          const float fx = x - static_cast<float>(x0), fy = y - static_cast<float>(y0);
          const float a00 = (1 - fx) * (1 - fy), a01 = fx * (1 - fy), a10 = (1 - fx) * fy, a11 = fx * fy;
          const float* m = maps + v * h * w * C;
          const float* p00 = m + (y0 * w + x0) * C;
          const float* p01 = m + (y0 * w + x1) * C;
          const float* p10 = m + (y1 * w + x0) * C;
          const float* p11 = m + (y1 * w + x1) * C;
          for (int64_t c = 0; c < C; ++c) row[c] += a00 * p00[c] + a01 * p01[c] + a10 * p10[c] + a11 * p11[c];
        }
        Out* dst = o + (p * views + v) * C;
        for (int64_t c = 0; c < C; ++c) store(dst + c, std::max(row[c], 0.0f));
      }
    }
  });
}

at::Tensor view_token_inputs(const at::Tensor& projected, const at::Tensor& grid, const at::Tensor& visible,
                             const at::Tensor& rgb, const at::Tensor& rgb_weight, const at::Tensor& bias,
                             at::ScalarType out_dtype) {
  TORCH_CHECK(projected.dim() == 4 && projected.is_contiguous() && projected.scalar_type() == at::kFloat,
              "view_token_inputs: projected [V, h, w, C] float32 contiguous");
  const int64_t views = projected.size(0), C = projected.size(3);
  TORCH_CHECK(C <= kMaxWidth, "view_token_inputs: at most ", kMaxWidth, " channels");
  TORCH_CHECK(grid.dim() == 3 && grid.size(0) == views && grid.size(2) == 2 && grid.is_contiguous() &&
                  grid.scalar_type() == at::kFloat,
              "view_token_inputs: grid [V, P, 2] float32 contiguous");
  const int64_t points = grid.size(1);
  TORCH_CHECK(visible.sizes() == at::IntArrayRef({views, points}) && visible.scalar_type() == at::kBool &&
                  visible.is_contiguous(),
              "view_token_inputs: visible [V, P] bool contiguous");
  TORCH_CHECK(rgb.sizes() == at::IntArrayRef({views, 3, points}) && rgb.scalar_type() == at::kFloat &&
                  rgb.is_contiguous(),
              "view_token_inputs: rgb [V, 3, P] float32 contiguous");
  TORCH_CHECK(rgb_weight.sizes() == at::IntArrayRef({C, 3}) && rgb_weight.is_contiguous() &&
                  rgb_weight.scalar_type() == at::kFloat,
              "view_token_inputs: rgb_weight [C, 3] float32");
  TORCH_CHECK(bias.sizes() == at::IntArrayRef({C}) && bias.is_contiguous() && bias.scalar_type() == at::kFloat,
              "view_token_inputs: bias [C] float32");
  at::Tensor out = at::empty({points, views, C}, projected.options().dtype(out_dtype));
  dispatch_storage(out, [&](auto tag) {
    using Out = decltype(tag);
    view_token_inputs_impl<Out>(projected, grid, visible, rgb, rgb_weight, bias, out);
  });
  return out;
}

// ------------------------------------------------------------------------------------------------
// masked_max_views(tokens [P, V, C], mask [P, V] bool) -> [P, C]: exact (a maximum of stored values).

template <typename T>
void masked_max_views_impl(const at::Tensor& tokens, const at::Tensor& mask, at::Tensor& out) {
  const int64_t points = tokens.size(0), views = tokens.size(1), C = tokens.size(2);
  const T* x = tokens.data_ptr<T>();
  const bool* m = mask.data_ptr<bool>();
  T* o = out.data_ptr<T>();
  at::parallel_for(0, points, kGrain, [&](int64_t first, int64_t last) {
    float best[kMaxWidth];
    for (int64_t p = first; p < last; ++p) {
      bool any = false;
      for (int64_t c = 0; c < C; ++c) best[c] = -INFINITY;
      for (int64_t v = 0; v < views; ++v) {
        if (!m[p * views + v]) continue;
        any = true;
        const T* row = x + (p * views + v) * C;
        for (int64_t c = 0; c < C; ++c) best[c] = std::max(best[c], to_float(row[c]));
      }
      T* dst = o + p * C;
      for (int64_t c = 0; c < C; ++c) store(dst + c, any ? best[c] : 0.0f);  // exact: best is a stored value
    }
  });
}

at::Tensor masked_max_views(const at::Tensor& tokens, const at::Tensor& mask) {
  TORCH_CHECK(tokens.dim() == 3 && tokens.is_contiguous() && tokens.size(2) <= kMaxWidth,
              "masked_max_views: tokens [P, V, C] contiguous");
  TORCH_CHECK(mask.sizes() == tokens.sizes().slice(0, 2) && mask.scalar_type() == at::kBool && mask.is_contiguous(),
              "masked_max_views: mask [P, V] bool contiguous");
  at::Tensor out = at::empty({tokens.size(0), tokens.size(2)}, tokens.options());
  dispatch_storage(tokens, [&](auto tag) {
    using T = decltype(tag);
    masked_max_views_impl<T>(tokens, mask, out);
  });
  return out;
}

// ------------------------------------------------------------------------------------------------
// layer_norm_rows(x [N, C], residual [N, C]?, weight [C] f32, bias [C] f32, eps) -> (normed, x + residual)
// Mean and variance in float32 over each row (two passes over the row in registers), as PyTorch's CPU
// LayerNorm computes them for bf16 and float32 inputs. Without a residual the second output is empty.

// C: the width when it has a compiled size (the row loops then unroll and vectorise), else 0 (any width).
template <typename T, int C_>
void layer_norm_rows_impl(const at::Tensor& x, const T* res, const at::Tensor& weight, const at::Tensor& bias,
                          double eps, at::Tensor& normed, T* summed) {
  const int64_t rows = x.size(0);
  const int64_t C = C_ > 0 ? C_ : x.size(1);
  const T* in = x.data_ptr<T>();
  const float* gamma = weight.data_ptr<float>();
  const float* beta = bias.data_ptr<float>();
  T* out = normed.data_ptr<T>();
  const float inv_c = 1.0f / static_cast<float>(C);
  at::parallel_for(0, rows, kGrain, [&](int64_t first, int64_t last) {
    float row[kMaxWidth];
    for (int64_t r = first; r < last; ++r) {
      const T* src = in + r * C;
      if (res != nullptr) {
        const T* add = res + r * C;
        T* sum = summed + r * C;
        for (int64_t c = 0; c < C; ++c) {
          // the stored sum: what a separate add would hand the norm
          row[c] = stored_value<T>(to_float(src[c]) + to_float(add[c]));
          store(sum + c, row[c]);  // exact: row[c] is representable in T
        }
      } else {
        for (int64_t c = 0; c < C; ++c) row[c] = to_float(src[c]);
      }
      // Reductions in SIMD lanes (`omp simd`: partial sums per lane, then added), as PyTorch's own
      // vectorised LayerNorm sums; the strict left-to-right order would keep them scalar.
      float mean = 0;
#pragma omp simd reduction(+ : mean)
      for (int64_t c = 0; c < C; ++c) mean += row[c];
      mean *= inv_c;
      float var = 0;
#pragma omp simd reduction(+ : var)
      for (int64_t c = 0; c < C; ++c) var += (row[c] - mean) * (row[c] - mean);
      const float rstd = 1.0f / std::sqrt(var * inv_c + static_cast<float>(eps));
      T* dst = out + r * C;
      for (int64_t c = 0; c < C; ++c) store(dst + c, (row[c] - mean) * rstd * gamma[c] + beta[c]);
    }
  });
}

std::tuple<at::Tensor, at::Tensor> layer_norm_rows(const at::Tensor& x, const c10::optional<at::Tensor>& residual,
                                                   const at::Tensor& weight, const at::Tensor& bias, double eps) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.size(1) <= kMaxWidth, "layer_norm_rows: x [N, C] contiguous");
  const int64_t C = x.size(1);
  TORCH_CHECK(weight.sizes() == at::IntArrayRef({C}) && bias.sizes() == at::IntArrayRef({C}) &&
                  weight.scalar_type() == at::kFloat && bias.scalar_type() == at::kFloat && weight.is_contiguous() &&
                  bias.is_contiguous(),
              "layer_norm_rows: weight and bias [C] float32");
  if (residual.has_value()) {
    TORCH_CHECK(residual->sizes() == x.sizes() && residual->scalar_type() == x.scalar_type() &&
                    residual->is_contiguous(),
                "layer_norm_rows: residual like x");
  }
  at::Tensor normed = at::empty_like(x);
  at::Tensor summed = residual.has_value() ? at::empty_like(x) : at::empty({0}, x.options());
  dispatch_storage(x, [&](auto tag) {
    using T = decltype(tag);
    const T* res = residual.has_value() ? residual->data_ptr<T>() : nullptr;
    T* sum = residual.has_value() ? summed.data_ptr<T>() : nullptr;
    switch (C) {
      case 32: layer_norm_rows_impl<T, 32>(x, res, weight, bias, eps, normed, sum); break;
      case 64: layer_norm_rows_impl<T, 64>(x, res, weight, bias, eps, normed, sum); break;
      default: layer_norm_rows_impl<T, 0>(x, res, weight, bias, eps, normed, sum);
    }
  });
  return {normed, summed};
}

// ------------------------------------------------------------------------------------------------
// subtraction_view_attention(q [P, C], kv [P, V, 2C] (k + pos, v + pos), mask [P, V] bool,
//                            w1 [H, C], b1 [H], w2 [C, H], b2 [C] (float32)) -> [P, C]
// GNT's view attention before its output layer (`SubtractionViewAttention.attend_with_kv`, eval):
//   a_v = W2 relu(W1 (k_v - q) + b1) + b2;  w = softmax over the visible views of a (per channel);
//   out = sum_v w_v (v_v).  A point no view sees: zeros (`zero_unseen_points`, as the network renders).
// The point's rows stay in registers: no [points, views, width] temporaries.

// C_, H_: the width and hidden units where they have a compiled size (GNT's attn_fc: H = C / 8), else 0.
template <typename T, int C_, int H_>
void subtraction_view_attention_impl(const at::Tensor& q, const at::Tensor& kv, const at::Tensor& mask,
                                     const at::Tensor& w1, const at::Tensor& b1, const at::Tensor& w2,
                                     const at::Tensor& b2, at::Tensor& out) {
  const int64_t points = q.size(0), views = kv.size(1);
  const int64_t C = C_ > 0 ? C_ : q.size(1);
  const int64_t H = H_ > 0 ? H_ : w1.size(0);
  const T* qp = q.data_ptr<T>();
  const T* kvp = kv.data_ptr<T>();
  const int64_t q_stride = q.stride(0), kv_point = kv.stride(0), kv_view = kv.stride(1);
  const bool* m = mask.data_ptr<bool>();
  const float* W1 = w1.data_ptr<float>();  // [H, C]: each hidden unit's weights a contiguous row
  const float* B1 = b1.data_ptr<float>();
  const float* B2 = b2.data_ptr<float>();
  // W2 by hidden unit: column j of W2 as a contiguous row, so the score loop runs along the channels.
  std::vector<float> w2_columns(H * C);
  const float* W2 = w2.data_ptr<float>();
  for (int64_t j = 0; j < H; ++j)
    for (int64_t c = 0; c < C; ++c) w2_columns[j * C + c] = W2[c * H + j];
  const float* W2c = w2_columns.data();
  T* o = out.data_ptr<T>();
  at::parallel_for(0, points, kGrain, [&](int64_t first, int64_t last) {
    float query[kMaxWidth], diff[kMaxWidth], score[kMaxSubtractionViews][kMaxWidth];
    float hidden[kMaxWidth];
    for (int64_t p = first; p < last; ++p) {
      for (int64_t c = 0; c < C; ++c) query[c] = to_float(qp[p * q_stride + c]);
      const bool* seen = m + p * views;
      bool any = false;
      for (int64_t v = 0; v < views; ++v) any = any || seen[v];
      T* dst = o + p * C;
      if (!any) {
        for (int64_t c = 0; c < C; ++c) store(dst + c, 0.0f);
        continue;
      }
      for (int64_t v = 0; v < views; ++v) {
        const T* k = kvp + p * kv_point + v * kv_view;
        for (int64_t c = 0; c < C; ++c) diff[c] = to_float(k[c]) - query[c];
        for (int64_t j = 0; j < H; ++j) {
          const float* row = W1 + j * C;
          float h = 0;
#pragma omp simd reduction(+ : h)
          for (int64_t c = 0; c < C; ++c) h += row[c] * diff[c];
          hidden[j] = std::max(h + B1[j], 0.0f);
        }
        float* a = score[v];
        for (int64_t c = 0; c < C; ++c) a[c] = B2[c];
        for (int64_t j = 0; j < H; ++j) {
          const float* column = W2c + j * C;
          const float h = hidden[j];
          for (int64_t c = 0; c < C; ++c) a[c] += column[c] * h;
        }
      }
      // Softmax over the views the point sees.
      float top[kMaxWidth], total[kMaxWidth], acc[kMaxWidth];
      for (int64_t c = 0; c < C; ++c) {
        top[c] = -INFINITY;
        total[c] = 0;
        acc[c] = 0;
      }
      for (int64_t v = 0; v < views; ++v) {
        if (!seen[v]) continue;
        for (int64_t c = 0; c < C; ++c) top[c] = std::max(top[c], score[v][c]);
      }
      for (int64_t v = 0; v < views; ++v) {
        if (!seen[v]) continue;
        const T* value = kvp + p * kv_point + v * kv_view + C;
        for (int64_t c = 0; c < C; ++c) {
          const float e = exp_nonpositive(score[v][c] - top[c]);
          total[c] += e;
          acc[c] += e * to_float(value[c]);
        }
      }
      for (int64_t c = 0; c < C; ++c) store(dst + c, acc[c] / total[c]);
    }
  });
}

at::Tensor subtraction_view_attention(const at::Tensor& q, const at::Tensor& kv, const at::Tensor& mask,
                                      const at::Tensor& w1, const at::Tensor& b1, const at::Tensor& w2,
                                      const at::Tensor& b2) {
  TORCH_CHECK(q.dim() == 2 && q.stride(1) == 1 && q.size(1) <= kMaxWidth, "subtraction_view_attention: q [P, C]");
  const int64_t points = q.size(0), C = q.size(1);
  TORCH_CHECK(kv.dim() == 3 && kv.size(0) == points && kv.size(2) == 2 * C && kv.stride(2) == 1 &&
                  kv.scalar_type() == q.scalar_type() && kv.size(1) <= kMaxSubtractionViews,
              "subtraction_view_attention: kv [P, V, 2C] (V <= ", kMaxSubtractionViews, ") like q");
  TORCH_CHECK(mask.sizes() == kv.sizes().slice(0, 2) && mask.scalar_type() == at::kBool && mask.is_contiguous(),
              "subtraction_view_attention: mask [P, V] bool contiguous");
  const int64_t H = w1.size(0);
  for (const auto* t : {&w1, &b1, &w2, &b2}) {
    TORCH_CHECK(t->scalar_type() == at::kFloat && t->is_contiguous(), "subtraction_view_attention: float32 weights");
  }
  TORCH_CHECK(w1.sizes() == at::IntArrayRef({H, C}) && b1.sizes() == at::IntArrayRef({H}) &&
                  w2.sizes() == at::IntArrayRef({C, H}) && b2.sizes() == at::IntArrayRef({C}) && H <= kMaxWidth,
              "subtraction_view_attention: w1 [H, C], b1 [H], w2 [C, H], b2 [C]");
  at::Tensor out = at::empty({points, C}, q.options());
  dispatch_storage(q, [&](auto tag) {
    using T = decltype(tag);
    if (C == 32 && H == 4) {
      subtraction_view_attention_impl<T, 32, 4>(q, kv, mask, w1, b1, w2, b2, out);
    } else if (C == 64 && H == 8) {
      subtraction_view_attention_impl<T, 64, 8>(q, kv, mask, w1, b1, w2, b2, out);
    } else {
      subtraction_view_attention_impl<T, 0, 0>(q, kv, mask, w1, b1, w2, b2, out);
    }
  });
  return out;
}

// ------------------------------------------------------------------------------------------------
// softmax_ray_attention(qkv [R, S, 3C] ([q | k | v], heads of d = C / H channels each), mask [R, S] bool,
//                       heads) -> [R, S, C]
// GNT's ray attention between its projections (`SoftmaxRayAttention`, eval, `masked_sdpa`): per ray and
// head, softmax(q k^T / sqrt(d)) over the samples the mask keeps, times v; a ray whose mask keeps no
// sample gets zeros. Keys and values are held transposed ([d][S], float) so that a query's scores and
// its output are loops along the samples, which vectorise; the softmax runs in float32.


#if defined(__AVX2__) && defined(__FMA__)
using pola_gnt_math::exp_nonpositive_x8;
using pola_gnt_math::horizontal_max;
using pola_gnt_math::horizontal_sum;
using pola_gnt_math::lane_sums_8;

// One query of `softmax_ray_attention_impl` on 8-sample vectors: kt, vt [d][padded] with padded a multiple
// of 8 and keep 0 beyond the samples; `out` gets d floats.
inline void softmax_query_avx2(const float* query, const float* kt, const float* vt, const float* keep, int64_t d,
                               int64_t padded, float* score, float* out) {
  const __m256 minus_inf = _mm256_set1_ps(-INFINITY);
  __m256 top = minus_inf;
  for (int64_t j = 0; j < padded; j += 8) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t c = 0; c < d; ++c) acc = _mm256_fmadd_ps(_mm256_set1_ps(query[c]), _mm256_load_ps(kt + c * padded + j), acc);
    const __m256 kept = _mm256_cmp_ps(_mm256_load_ps(keep + j), _mm256_setzero_ps(), _CMP_GT_OQ);
    acc = _mm256_blendv_ps(minus_inf, acc, kept);
    _mm256_store_ps(score + j, acc);
    top = _mm256_max_ps(top, acc);
  }
  const __m256 top_all = _mm256_set1_ps(horizontal_max(top));
  __m256 total = _mm256_setzero_ps();
  for (int64_t j = 0; j < padded; j += 8) {
    const __m256 e = _mm256_mul_ps(exp_nonpositive_x8(_mm256_sub_ps(_mm256_load_ps(score + j), top_all)),
                                   _mm256_load_ps(keep + j));
    _mm256_store_ps(score + j, e);
    total = _mm256_add_ps(total, e);
  }
  const float inv = 1.0f / horizontal_sum(total);
  int64_t e = 0;
  for (; e + 8 <= d; e += 8) {  // 8 output channels at a time: their 8 sums in one transposing reduction
    __m256 acc[8];
    for (int u = 0; u < 8; ++u) acc[u] = _mm256_setzero_ps();
    for (int64_t j = 0; j < padded; j += 8) {
      const __m256 p = _mm256_load_ps(score + j);
      for (int u = 0; u < 8; ++u) acc[u] = _mm256_fmadd_ps(p, _mm256_load_ps(vt + (e + u) * padded + j), acc[u]);
    }
    _mm256_storeu_ps(out + e, _mm256_mul_ps(lane_sums_8(acc), _mm256_set1_ps(inv)));
  }
  for (; e < d; ++e) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t j = 0; j < padded; j += 8) acc = _mm256_fmadd_ps(_mm256_load_ps(score + j), _mm256_load_ps(vt + e * padded + j), acc);
    out[e] = horizontal_sum(acc) * inv;
  }
}
#endif

template <typename T>
void softmax_ray_attention_impl(const at::Tensor& qkv, const bool* mask, int64_t heads, at::Tensor& out) {
  const int64_t rays = qkv.size(0), samples = qkv.size(1), C = qkv.size(2) / 3, d = C / heads;
  const int64_t padded = (samples + 7) / 8 * 8;  // samples rounded up to whole 8-float vectors
  const T* in = qkv.data_ptr<T>();
  const int64_t ray_stride = qkv.stride(0), sample_stride = qkv.stride(1);
  T* o = out.data_ptr<T>();
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  at::parallel_for(0, rays, 1, [&](int64_t first, int64_t last) {
    // [d][padded] each, 32-byte aligned (the vectors load them aligned); zero beyond the samples.
    std::vector<float> storage(2 * d * padded + 2 * padded + d + d + 16, 0.0f);
    float* base = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(storage.data()) + 31) & ~uintptr_t{31});
    float* kt = base;
    float* vt = kt + d * padded;
    float* score = vt + d * padded;
    float* keep = score + padded;
    float* query = keep + padded;
    float* result = query + d;
    for (int64_t r = first; r < last; ++r) {
      const bool* m = mask + r * samples;
      bool any = false;
      for (int64_t j = 0; j < samples; ++j) {
        keep[j] = m[j] ? 1.0f : 0.0f;
        any = any || m[j];
      }
      T* dst = o + r * samples * C;
      if (!any) {
        for (int64_t x = 0; x < samples * C; ++x) store(dst + x, 0.0f);
        continue;
      }
      const T* ray = in + r * ray_stride;
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t c0 = h * d;
        for (int64_t j = 0; j < samples; ++j) {
          const T* row = ray + j * sample_stride;
          for (int64_t c = 0; c < d; ++c) {
            kt[c * padded + j] = to_float(row[C + c0 + c]);
            vt[c * padded + j] = to_float(row[2 * C + c0 + c]);
          }
        }
        for (int64_t i = 0; i < samples; ++i) {
          const T* q = ray + i * sample_stride + c0;
          for (int64_t c = 0; c < d; ++c) query[c] = to_float(q[c]) * scale;
#if defined(__AVX2__) && defined(__FMA__)
          softmax_query_avx2(query, kt, vt, keep, d, padded, score, result);
#else
          float top = -INFINITY;
          for (int64_t j = 0; j < samples; ++j) {
            float sum = 0.0f;
            for (int64_t c = 0; c < d; ++c) sum += query[c] * kt[c * padded + j];
            score[j] = sum;
            if (keep[j] > 0.0f) top = std::max(top, sum);
          }
          float total = 0.0f;
          for (int64_t j = 0; j < samples; ++j) {
            score[j] = keep[j] > 0.0f ? exp_nonpositive(score[j] - top) : 0.0f;
            total += score[j];
          }
          for (int64_t e = 0; e < d; ++e) {
            float acc = 0.0f;
            for (int64_t j = 0; j < samples; ++j) acc += score[j] * vt[e * padded + j];
            result[e] = acc / total;
          }
#endif
          T* out_row = dst + i * C + c0;
          for (int64_t e = 0; e < d; ++e) store(out_row + e, result[e]);
        }
      }
    }
  });
}

at::Tensor softmax_ray_attention(const at::Tensor& qkv, const at::Tensor& mask, int64_t heads) {
  TORCH_CHECK(qkv.dim() == 3 && qkv.stride(2) == 1 && qkv.size(2) % 3 == 0,
              "softmax_ray_attention: qkv [R, S, 3C] with contiguous channels");
  const int64_t C = qkv.size(2) / 3;
  TORCH_CHECK(heads > 0 && C % heads == 0, "softmax_ray_attention: channels divisible by heads");
  TORCH_CHECK(mask.sizes() == qkv.sizes().slice(0, 2) && mask.scalar_type() == at::kBool && mask.is_contiguous(),
              "softmax_ray_attention: mask [R, S] bool contiguous");
  at::Tensor out = at::empty({qkv.size(0), qkv.size(1), C}, qkv.options());
  dispatch_storage(qkv, [&](auto tag) {
    using T = decltype(tag);
    softmax_ray_attention_impl<T>(qkv, mask.data_ptr<bool>(), heads, out);
  });
  return out;
}

// ------------------------------------------------------------------------------------------------
// sample_geometry(points [P, 3] f32, w2c [V, 4, 4] f32, intrinsics [V, 3, 3] f32, origins [R, 3] f32
//                 (P = R x samples: each ray's target camera), centers [V, 3] f32, height, width, margin)
//   -> (grid [V, P, 2] f32, visible [V, P] bool, view_mask [P, V] bool, rel_dirs [P, V, 4] f32)
// `project_points` then `pixels_to_grid` and `relative_directions` (plain unit vectors: F.normalize's
// max(|v|, 1e-12)), in float32 with the same formulas; the visibility the same tests on the same pixels.

inline void unit3(float* v) {
  const float n = std::max(std::sqrt(v[0] * v[0] + v[1] * v[1] + v[2] * v[2]), 1e-12f);
  v[0] /= n;
  v[1] /= n;
  v[2] /= n;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> sample_geometry(
    const at::Tensor& points, const at::Tensor& w2c, const at::Tensor& intrinsics, const at::Tensor& origins,
    const at::Tensor& centers, int64_t height, int64_t width, double margin) {
  for (const auto* t : {&points, &w2c, &intrinsics, &origins, &centers}) {
    TORCH_CHECK(t->scalar_type() == at::kFloat && t->is_contiguous(), "sample_geometry: float32 contiguous tensors");
  }
  const int64_t P = points.size(0), V = w2c.size(0), R = origins.size(0);
  TORCH_CHECK(points.dim() == 2 && points.size(1) == 3 && R > 0 && P % R == 0, "sample_geometry: points [R x S, 3]");
  TORCH_CHECK(w2c.sizes() == at::IntArrayRef({V, 4, 4}) && intrinsics.sizes() == at::IntArrayRef({V, 3, 3}) &&
                  centers.sizes() == at::IntArrayRef({V, 3}) && origins.sizes() == at::IntArrayRef({R, 3}),
              "sample_geometry: w2c [V, 4, 4], intrinsics [V, 3, 3], centers [V, 3], origins [R, 3]");
  const int64_t S = P / R;
  at::Tensor grid = at::empty({V, P, 2}, points.options());
  at::Tensor visible = at::empty({V, P}, points.options().dtype(at::kBool));
  at::Tensor mask = at::empty({P, V}, points.options().dtype(at::kBool));
  at::Tensor rel = at::empty({P, V, 4}, points.options());
  const float* x = points.data_ptr<float>();
  const float* M = w2c.data_ptr<float>();
  const float* K = intrinsics.data_ptr<float>();
  const float* o = origins.data_ptr<float>();
  const float* c = centers.data_ptr<float>();
  float* g = grid.data_ptr<float>();
  bool* vis = visible.data_ptr<bool>();
  bool* m = mask.data_ptr<bool>();
  float* r = rel.data_ptr<float>();
  const float lo = -static_cast<float>(margin);
  const float hi_u = static_cast<float>(width - 1) + static_cast<float>(margin);
  const float hi_v = static_cast<float>(height - 1) + static_cast<float>(margin);
  const float scale_u = static_cast<float>(width - 1), scale_v = static_cast<float>(height - 1);
  at::parallel_for(0, P, kGrain, [&](int64_t first, int64_t last) {
    for (int64_t p = first; p < last; ++p) {
      const float* xp = x + 3 * p;
      const float* op = o + 3 * (p / S);
      float to_target[3] = {op[0] - xp[0], op[1] - xp[1], op[2] - xp[2]};
      unit3(to_target);
      for (int64_t v = 0; v < V; ++v) {
        const float* Mv = M + 16 * v;
        const float* Kv = K + 9 * v;
        float cam[3];
        for (int i = 0; i < 3; ++i) cam[i] = Mv[4 * i] * xp[0] + Mv[4 * i + 1] * xp[1] + Mv[4 * i + 2] * xp[2] + Mv[4 * i + 3];
        float image[3];
        for (int i = 0; i < 3; ++i) image[i] = Kv[3 * i] * cam[0] + Kv[3 * i + 1] * cam[1] + Kv[3 * i + 2] * cam[2];
        const float depth = cam[2];
        const float safe = std::abs(depth) < 1e-8f ? 1e-8f : depth;
        const float u = image[0] / safe, w = image[1] / safe;
        const bool seen = depth > 1e-6f && u >= lo && u <= hi_u && w >= lo && w <= hi_v;
        vis[v * P + p] = seen;
        m[p * V + v] = seen;
        g[2 * (v * P + p)] = 2.0f * u / scale_u - 1.0f;
        g[2 * (v * P + p) + 1] = 2.0f * w / scale_v - 1.0f;
        const float* cv = c + 3 * v;
        float to_source[3] = {cv[0] - xp[0], cv[1] - xp[1], cv[2] - xp[2]};
        unit3(to_source);
        float difference[3] = {to_target[0] - to_source[0], to_target[1] - to_source[1], to_target[2] - to_source[2]};
        unit3(difference);
        float* rp = r + 4 * (p * V + v);
        rp[0] = difference[0];
        rp[1] = difference[1];
        rp[2] = difference[2];
        rp[3] = to_target[0] * to_source[0] + to_target[1] * to_source[1] + to_target[2] * to_source[2];
      }
    }
  });
  return {grid, visible, mask, rel};
}

// ------------------------------------------------------------------------------------------------
// prior_statistics(colours [V, H, W, Cc] f32, grid [V, P, 2] f32, visible [V, P] bool,
//                  features [V, h, w, F] f32 (F = 0: none), cosines [P, V] f32 (or [0]: no angle weights),
//                  first_level, feature_stride, feature_offset, feature_scale, feature_weight, temperature)
//   -> (mean [P, 3], spread [P], rgb [V, 3, P]), all f32
// `colours` holds each view's image (channels 0-2) and blurred levels (3 channels each); the spread's levels
// are the 3-channel groups from `first_level` on (0: the image is level 0). The features are read at the
// image pixel's place in the feature map, ((pixel + 1/2) / feature_scale - 1/2 - offset) / stride, border
// padded, as `FeatureRead.feature_pixels` reads them. Reads, spreads and weights as
// `consistency_prior.view_major_statistics` computes them (its PyTorch form), in float32.

constexpr int64_t kMaxPriorViews = 32;
constexpr int64_t kMaxPriorChannels = 64;
constexpr int64_t kPriorBlock = 64;  // points per block of reads

inline int64_t blocks_of(int64_t n, int64_t block) { return (n + block - 1) / block; }

struct BilinearCorner {
  int64_t offsets[4];
  float weights[4];
};

// grid_sample's bilinear read with align_corners and border padding at pixel (x, y) of a [h, w] map:
// the coordinate clipped to [0, size - 1], corners beyond the edge with weight 0.
inline BilinearCorner bilinear_corners(float x, float y, int64_t h, int64_t w, int64_t channels) {
  x = std::clamp(x, 0.0f, static_cast<float>(w - 1));
  y = std::clamp(y, 0.0f, static_cast<float>(h - 1));
  const int64_t x0 = static_cast<int64_t>(std::floor(x)), y0 = static_cast<int64_t>(std::floor(y));
  const int64_t x1 = std::min(x0 + 1, w - 1), y1 = std::min(y0 + 1, h - 1);
  const float fx = x - static_cast<float>(x0), fy = y - static_cast<float>(y0);
  return {{(y0 * w + x0) * channels, (y0 * w + x1) * channels, (y1 * w + x0) * channels, (y1 * w + x1) * channels},
          {(1 - fx) * (1 - fy), fx * (1 - fy), (1 - fx) * fy, fx * fy}};
}

inline void bilinear_read(const float* map, const BilinearCorner& at, int64_t channels, float* out) {
  const float* p00 = map + at.offsets[0];
  const float* p01 = map + at.offsets[1];
  const float* p10 = map + at.offsets[2];
  const float* p11 = map + at.offsets[3];
  for (int64_t c = 0; c < channels; ++c) {
    out[c] = at.weights[0] * p00[c] + at.weights[1] * p01[c] + at.weights[2] * p10[c] + at.weights[3] * p11[c];
  }
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> prior_statistics(
    const at::Tensor& colours, const at::Tensor& grid, const at::Tensor& visible, const at::Tensor& features,
    const at::Tensor& cosines, int64_t first_level, double feature_stride, double feature_offset,
    double feature_scale, double feature_weight, double temperature) {
  TORCH_CHECK(colours.dim() == 4 && colours.is_contiguous() && colours.scalar_type() == at::kFloat,
              "prior_statistics: colours [V, H, W, C] float32 contiguous");
  const int64_t views = colours.size(0), H = colours.size(1), W = colours.size(2), Cc = colours.size(3);
  TORCH_CHECK(views <= kMaxPriorViews, "prior_statistics: at most ", kMaxPriorViews, " views");
  TORCH_CHECK(Cc >= 3 && Cc % 3 == 0 && Cc <= kMaxPriorChannels, "prior_statistics: colours in groups of 3");
  TORCH_CHECK(first_level >= 0 && 3 * first_level < Cc, "prior_statistics: first_level within the colours");
  TORCH_CHECK(grid.dim() == 3 && grid.size(0) == views && grid.size(2) == 2 && grid.is_contiguous() &&
                  grid.scalar_type() == at::kFloat,
              "prior_statistics: grid [V, P, 2] float32 contiguous");
  const int64_t points = grid.size(1);
  TORCH_CHECK(visible.sizes() == at::IntArrayRef({views, points}) && visible.scalar_type() == at::kBool &&
                  visible.is_contiguous(),
              "prior_statistics: visible [V, P] bool contiguous");
  TORCH_CHECK(features.dim() == 4 && features.size(0) == views && features.is_contiguous() &&
                  features.scalar_type() == at::kFloat && features.size(3) <= kMaxPriorChannels,
              "prior_statistics: features [V, h, w, F] float32 contiguous");
  const int64_t fh = features.size(1), fw = features.size(2), F = features.size(3);
  const bool weighted = temperature > 0;
  TORCH_CHECK(!weighted || (cosines.sizes() == at::IntArrayRef({points, views}) && cosines.is_contiguous() &&
                            cosines.scalar_type() == at::kFloat),
              "prior_statistics: cosines [P, V] float32 contiguous");
  at::Tensor mean = at::empty({points, 3}, grid.options());
  at::Tensor spread = at::empty({points}, grid.options());
  at::Tensor rgb = at::empty({views, 3, points}, grid.options());
  const float* col = colours.data_ptr<float>();
  const float* g = grid.data_ptr<float>();
  const bool* vis = visible.data_ptr<bool>();
  const float* feat = F > 0 ? features.data_ptr<float>() : nullptr;
  const float* cos_ptr = weighted ? cosines.data_ptr<float>() : nullptr;
  float* mean_ptr = mean.data_ptr<float>();
  float* spread_ptr = spread.data_ptr<float>();
  float* rgb_ptr = rgb.data_ptr<float>();
  const float sx = 0.5f * static_cast<float>(W - 1), sy = 0.5f * static_cast<float>(H - 1);
  const float stride = static_cast<float>(feature_stride), offset = static_cast<float>(feature_offset);
  const float scale = static_cast<float>(feature_scale), fweight = static_cast<float>(feature_weight);
  const float temp = static_cast<float>(temperature);
  const int64_t levels = Cc / 3 - first_level;
  // Blocks of points, read view by view: consecutive samples of a ray fall near each other in a view
  // (along its epipolar line), so reading one view's maps for a whole block stays in its cache lines,
  // where reading every view for one point would jump between the views' images. The reads are kept
  // [view][channel][point of the block], so that the statistics run across a block's points in vectors.
  constexpr int64_t B = kPriorBlock;
  at::parallel_for(0, blocks_of(points, B), 1, [&](int64_t first_block, int64_t last_block) {
    std::vector<float> reads(views * Cc * B), freads(views * std::max<int64_t>(F, 1) * B), seen(views * B),
        cosine(views * B);
    float read[kMaxPriorChannels];
    for (int64_t block = first_block; block < last_block; ++block) {
      const int64_t begin = block * B, size = std::min(points, begin + B) - begin;
      std::fill(reads.begin(), reads.end(), 0.0f);
      std::fill(freads.begin(), freads.end(), 0.0f);
      for (int64_t v = 0; v < views; ++v) {
        const float* colour_map = col + v * H * W * Cc;
        const float* feature_map = F > 0 ? feat + v * fh * fw * F : nullptr;
        for (int64_t i = 0; i < B; ++i) {
          const int64_t p = begin + i, vp = v * points + p;
          seen[v * B + i] = i < size && vis[vp] ? 1.0f : 0.0f;
          cosine[v * B + i] = weighted && i < size ? cos_ptr[p * views + v] : 1.0f;
          if (i >= size) continue;
          if (!vis[vp]) {
            for (int64_t c = 0; c < 3; ++c) rgb_ptr[(v * 3 + c) * points + p] = 0.0f;
            continue;
          }
          const float x = (g[2 * vp] + 1.0f) * sx, y = (g[2 * vp + 1] + 1.0f) * sy;
          bilinear_read(colour_map, bilinear_corners(x, y, H, W, Cc), Cc, read);
          for (int64_t c = 0; c < Cc; ++c) reads[(v * Cc + c) * B + i] = read[c];
          for (int64_t c = 0; c < 3; ++c) rgb_ptr[(v * 3 + c) * points + p] = read[c];
          if (F > 0) {
            const float u = ((x + 0.5f) / scale - 0.5f - offset) / stride;
            const float t = ((y + 0.5f) / scale - 0.5f - offset) / stride;
            bilinear_read(feature_map, bilinear_corners(u, t, fh, fw, F), F, read);
            for (int64_t c = 0; c < F; ++c) freads[(v * F + c) * B + i] = read[c];
          }
        }
      }
      // The statistics, for the block's points side by side (unseen views read as zeros, weight 0).
      alignas(64) float count[B], n[B], colour[B], total[B], work[B], second[B];
#pragma omp simd
      for (int64_t i = 0; i < B; ++i) count[i] = 0.0f;
      for (int64_t v = 0; v < views; ++v) {
        const float* w = seen.data() + v * B;
#pragma omp simd
        for (int64_t i = 0; i < B; ++i) count[i] += w[i];
      }
#pragma omp simd
      for (int64_t i = 0; i < B; ++i) {
        n[i] = std::max(count[i], 1.0f);
        colour[i] = 0.0f;
      }
      // The colour spread: per level, the channel mean of the standard deviation over the visible views.
      for (int64_t c = 3 * first_level; c < Cc; ++c) {
#pragma omp simd
        for (int64_t i = 0; i < B; ++i) work[i] = 0.0f;
        for (int64_t v = 0; v < views; ++v) {
          const float* x = reads.data() + (v * Cc + c) * B;
#pragma omp simd
          for (int64_t i = 0; i < B; ++i) work[i] += x[i];
        }
#pragma omp simd
        for (int64_t i = 0; i < B; ++i) {
          work[i] /= n[i];  // the mean
          second[i] = 0.0f;
        }
        for (int64_t v = 0; v < views; ++v) {
          const float* x = reads.data() + (v * Cc + c) * B;
          const float* w = seen.data() + v * B;
#pragma omp simd
          for (int64_t i = 0; i < B; ++i) {
            const float d = x[i] - work[i];
            second[i] += d * d * w[i];
          }
        }
#pragma omp simd
        for (int64_t i = 0; i < B; ++i) colour[i] += std::sqrt(std::max(second[i] / n[i], 0.0f)) / 3.0f;
      }
#pragma omp simd
      for (int64_t i = 0; i < B; ++i) total[i] = count[i] >= 2.0f ? colour[i] / static_cast<float>(levels) : 0.5f;
      if (F > 0) {
        // sqrt(mean squared length - squared length of the mean): one pass (`feature_spread`).
#pragma omp simd
        for (int64_t i = 0; i < B; ++i) second[i] = 0.0f;  // the squared lengths' sum
        for (int64_t v = 0; v < views; ++v) {
          for (int64_t c = 0; c < F; ++c) {
            const float* x = freads.data() + (v * F + c) * B;
#pragma omp simd
            for (int64_t i = 0; i < B; ++i) second[i] += x[i] * x[i];
          }
        }
#pragma omp simd
        for (int64_t i = 0; i < B; ++i) colour[i] = 0.0f;  // now: the mean's squared length
        for (int64_t c = 0; c < F; ++c) {
#pragma omp simd
          for (int64_t i = 0; i < B; ++i) work[i] = 0.0f;
          for (int64_t v = 0; v < views; ++v) {
            const float* x = freads.data() + (v * F + c) * B;
#pragma omp simd
            for (int64_t i = 0; i < B; ++i) work[i] += x[i];
          }
#pragma omp simd
          for (int64_t i = 0; i < B; ++i) {
            const float m = work[i] / n[i];
            colour[i] += m * m;
          }
        }
#pragma omp simd
        for (int64_t i = 0; i < B; ++i) {
          const float feature = std::sqrt(std::max(second[i] / n[i] - colour[i], 0.0f));
          total[i] += fweight * (count[i] >= 2.0f ? feature : 1.0f);
        }
      }
      for (int64_t i = 0; i < size; ++i) spread_ptr[begin + i] = total[i];
      // The mean colour: plain, or weighted by the views' angles to the target ray (`angle_weights`):
      // softmax(-(angle - nearest) / (temperature x mean angle)) over the visible views.
      float* weights = cosine.data();  // in place: [view][point] angles, then weights
      if (weighted) {
        alignas(64) float nearest[B];
#pragma omp simd
        for (int64_t i = 0; i < B; ++i) {
          nearest[i] = static_cast<float>(M_PI);
          work[i] = 0.0f;  // the visible views' angles' sum
        }
        for (int64_t v = 0; v < views; ++v) {
          float* a = weights + v * B;
          const float* w = seen.data() + v * B;
#pragma omp simd
          for (int64_t i = 0; i < B; ++i) {
            a[i] = pola_gnt_math::arccos(std::clamp(a[i], -1.0f, 1.0f));
            nearest[i] = w[i] > 0.0f ? std::min(nearest[i], a[i]) : nearest[i];
            work[i] += a[i] * w[i];
          }
        }
#pragma omp simd
        for (int64_t i = 0; i < B; ++i) {
          work[i] = -1.0f / (temp * std::max(work[i] / n[i], 1e-6f));  // the scores' scale
          second[i] = 0.0f;  // the softmax's sum
        }
        for (int64_t v = 0; v < views; ++v) {
          float* a = weights + v * B;
          const float* w = seen.data() + v * B;
#pragma omp simd
          for (int64_t i = 0; i < B; ++i) {
            // The nearest view's score is 0, the largest: no maximum to subtract. A view that does not
            // see the point may be nearer than the nearest that does: its exponent stays out.
            const float score = w[i] > 0.0f ? (a[i] - nearest[i]) * work[i] : -87.0f;
            a[i] = w[i] * pola_gnt_math::exp_nonpositive(score);
            second[i] += a[i];
          }
        }
#pragma omp simd
        for (int64_t i = 0; i < B; ++i) second[i] = 1.0f / std::max(second[i], 1e-30f);
        for (int64_t v = 0; v < views; ++v) {
          float* a = weights + v * B;
#pragma omp simd
          for (int64_t i = 0; i < B; ++i) a[i] *= second[i];
        }
      } else {
        for (int64_t v = 0; v < views; ++v) {
          float* a = weights + v * B;
          const float* w = seen.data() + v * B;
#pragma omp simd
          for (int64_t i = 0; i < B; ++i) a[i] = w[i] / n[i];
        }
      }
      for (int64_t c = 0; c < 3; ++c) {
#pragma omp simd
        for (int64_t i = 0; i < B; ++i) work[i] = 0.0f;
        for (int64_t v = 0; v < views; ++v) {
          const float* x = reads.data() + (v * Cc + c) * B;
          const float* a = weights + v * B;
#pragma omp simd
          for (int64_t i = 0; i < B; ++i) work[i] += a[i] * x[i];
        }
        for (int64_t i = 0; i < size; ++i) mean_ptr[(begin + i) * 3 + c] = work[i];
      }
    }
  });
  return {mean, spread, rgb};
}

}  // namespace

TORCH_LIBRARY(pola_gnt_render, m) {
  m.def(
      "view_token_inputs(Tensor projected, Tensor grid, Tensor visible, Tensor rgb, Tensor rgb_weight, Tensor bias, "
      "ScalarType out_dtype) -> Tensor");
  m.def("masked_max_views(Tensor tokens, Tensor mask) -> Tensor");
  m.def("layer_norm_rows(Tensor x, Tensor? residual, Tensor weight, Tensor bias, float eps) -> (Tensor, Tensor)");
  m.def(
      "subtraction_view_attention(Tensor q, Tensor kv, Tensor mask, Tensor w1, Tensor b1, Tensor w2, Tensor b2) "
      "-> Tensor");
  m.def("softmax_ray_attention(Tensor qkv, Tensor mask, int heads) -> Tensor");
  m.def(
      "sample_geometry(Tensor points, Tensor w2c, Tensor intrinsics, Tensor origins, Tensor centers, int height, "
      "int width, float margin) -> (Tensor, Tensor, Tensor, Tensor)");
  m.def(
      "prior_statistics(Tensor colours, Tensor grid, Tensor visible, Tensor features, Tensor cosines, int first_level, "
      "float feature_stride, float feature_offset, float feature_scale, float feature_weight, float temperature) "
      "-> (Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(pola_gnt_render, CPU, m) {
  m.impl("view_token_inputs", &view_token_inputs);
  m.impl("masked_max_views", &masked_max_views);
  m.impl("layer_norm_rows", &layer_norm_rows);
  m.impl("subtraction_view_attention", &subtraction_view_attention);
  m.impl("softmax_ray_attention", &softmax_ray_attention);
  m.impl("sample_geometry", &sample_geometry);
  m.impl("prior_statistics", &prior_statistics);
}
