// Fused CPU kernels of polarity-aware attention for GNT's two short attentions: the view attention
// (one query per point, a few source views as keys) and the ray attention (the samples of one ray).
// The math and the names are those of `view/pytorch_form.py` and `ray/pytorch_form.py`; the fp64
// reference `reference.py` is what the tests compare every output and gradient of these kernels
// with. Each point (view attention) or (ray, head) (ray attention) is computed whole in small
// per-thread buffers, forward or backward in one pass: no `[..., 2d]` feature tensor and none of the
// dozens of elementwise temporaries of the PyTorch forms is written to memory, and a call is one
// parallel region.
//
// Numerics: float or double throughout (the caller casts bf16/fp16 inputs to fp32), exponent inputs
// clamped at EXPONENT_CLAMP, EPSILON on each stream's denominator. Features are expm1 (exact near 0):
// `std::expm1` in double (the reference path), in float a range-reduced polynomial that the compiler
// vectorises (within 2 ulp of expm1 on [0, 20], see `expm1_clamped`). Backward recomputes the
// features and weights from the inputs instead of storing them.
//
// Selections by sign are products with exact 0/1 factors (no branches in the inner loops): of the
// two polarity parts of a channel exactly one can be non-zero, so e.g. the same-sign weight of a key
// channel is `Fs_c K_jc [q_c > 0 == k_jc > 0]`, and a zero channel has a zero feature (expm1(0) = 0).
//
// bf16 inference (`render.precision: bf16`) runs AVX2 forms of the view and ray forward kernels where the
// build has AVX2 and FMA (`core.cpp_build` asks for them where PyTorch runs AVX2 or AVX-512 kernels) and
// the head dim is a multiple of 8: the same functions with bf16 read and written in vectors and the
// per-view and per-stream sums as vector reductions; they are 1.8x and 2x the generic loops here. The float
// and double kernels (training, `render.precision: fp32`) stay the generic loops, bit for bit as before.
//
// Determinism: work is split into blocks fixed by the problem size only (not by the thread count),
// handed to the threads one at a time (`parallel_blocks`), and per-block partial sums of the
// temperature gradients are added in block order by the caller, so results do not depend on how
// many threads run or which thread runs which block.
//
// Layouts (channels innermost and contiguous):
//   view attention: q [P, H, d], k, v [P, V, H, d] with any point and view strides, visible [P, V] (0/1)
//                   or none, temperatures [H, 2d]
//   ray attention:  q, k, v [R, S, H * d] with any row strides, visible [R, S] (0/1) or none
// Temperature gradients come back as per-block partial sums [blocks, H, 2d].

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "../../core/csrc/vector_math.h"

namespace {

constexpr double kExponentClamp = 20.0;  // features.EXPONENT_CLAMP
constexpr double kEpsilon = 1e-6;        // features.EPSILON
constexpr int64_t kPointsPerBlock = 128;
constexpr int64_t kRaysPerBlock = 8;


inline float expm1_clamped(float z) { return pola_gnt_math::expm1_clamped(z, static_cast<float>(kExponentClamp)); }

inline double expm1_clamped(double z) { return std::expm1(std::min(z, kExponentClamp)); }

// bf16 storage (`render.precision: bf16`) is read into float rows before any arithmetic: the compute
// loops are then the float kernels' own, which the compiler vectorises (converting inside them did not).
inline float to_compute(c10::BFloat16 x) { return pola_gnt_math::bf16_to_float(x); }
inline float to_compute(float x) { return x; }
inline double to_compute(double x) { return x; }

// A row of D channels in the compute type T: the row itself when it is stored in T, else a converted copy.
template <typename In, typename T, int D>
struct RowReader {
  T buffer[D];
  const T* read(const In* __restrict src) {
    if constexpr (std::is_same_v<In, T>) {
      return src;
    } else {
      for (int c = 0; c < D; ++c) buffer[c] = to_compute(src[c]);
      return buffer;
    }
  }
};

int64_t blocks_of(int64_t n, int64_t per_block) { return std::max<int64_t>(1, (n + per_block - 1) / per_block); }

// Runs `body(block, block + 1)` for every block, the threads of one parallel region taking blocks one at
// a time: when another process takes a core, the other threads do that thread's share instead of
// waiting for it at the end of a static split (at::parallel_for's), which doubled the time of a call.
// Which thread runs a block does not change what it computes.
template <typename Body>
void parallel_blocks(int64_t blocks, const Body& body) {
  std::atomic<int64_t> next{0};
  const int64_t workers = std::min<int64_t>(blocks, at::get_num_threads());
  at::parallel_for(0, workers, 1, [&](int64_t, int64_t) {
    for (int64_t block = next.fetch_add(1); block < blocks; block = next.fetch_add(1)) body(block, block + 1);
  });
}

// Per-channel temperatures of each polarity of q, laid out like q's channels `[H * d]`:
// same-sign stream t = temp_same[c] for q > 0, temp_same[d + c] for q < 0; opposite-sign stream
// t = temp_opp[d + c] for q > 0, temp_opp[c] for q < 0.
template <typename T>
struct ChannelTemperatures {
  std::vector<T> same_pos, same_neg, opp_pos, opp_neg;
  ChannelTemperatures(const T* temp_same, const T* temp_opp, int64_t heads, int64_t d)
      : same_pos(heads * d), same_neg(heads * d), opp_pos(heads * d), opp_neg(heads * d) {
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t c = 0; c < d; ++c) {
        same_pos[h * d + c] = temp_same[h * 2 * d + c];
        same_neg[h * d + c] = temp_same[h * 2 * d + d + c];
        opp_pos[h * d + c] = temp_opp[h * 2 * d + d + c];
        opp_neg[h * d + c] = temp_opp[h * 2 * d + c];
      }
    }
  }
};

// Query terms of one head's D channels: magnitude, 0/1 positive and negative factors, the
// temperatures in use and both streams' features `Fs = expm1(ts |q|)`, `Fo = expm1(to |q|)`.
template <typename T, int D>
struct QueryTerms {
  T mag[D], pos[D], neg[D], ts[D], to[D], fs[D], fo[D];

  // `temps` is the head's slice of each ChannelTemperatures array.
  void compute(const T* __restrict q, const T* __restrict same_pos, const T* __restrict same_neg,
               const T* __restrict opp_pos, const T* __restrict opp_neg) {
    for (int c = 0; c < D; ++c) {
      const T x = q[c];
      const bool positive = x > 0;
      mag[c] = std::abs(x);
      pos[c] = positive ? T(1) : T(0);
      neg[c] = x < 0 ? T(1) : T(0);
      ts[c] = positive ? same_pos[c] : same_neg[c];
      to[c] = positive ? opp_pos[c] : opp_neg[c];
      fs[c] = expm1_clamped(ts[c] * mag[c]);
      fo[c] = expm1_clamped(to[c] * mag[c]);
    }
  }

  // Backward through the features to q and the temperatures: `grad_fs`, `grad_fo` in, `gq` out, the
  // temperature slopes d t = d z |q| added into the four per-polarity accumulators.
  void backward(const T* grad_fs, const T* grad_fo, T* __restrict gq, T* __restrict same_pos, T* __restrict same_neg,
                T* __restrict opp_pos, T* __restrict opp_neg) const {
    const T clamp = static_cast<T>(kExponentClamp);
    for (int c = 0; c < D; ++c) {
      const T a = mag[c];
      const T z_s = grad_fs[c] * (fs[c] + 1) * (ts[c] * a <= clamp ? T(1) : T(0));
      const T z_o = grad_fo[c] * (fo[c] + 1) * (to[c] * a <= clamp ? T(1) : T(0));
      gq[c] = (z_s * ts[c] + z_o * to[c]) * (pos[c] - neg[c]);
      same_pos[c] += z_s * a * pos[c];
      same_neg[c] += z_s * a * neg[c];
      opp_pos[c] += z_o * a * pos[c];
      opp_neg[c] += z_o * a * neg[c];
    }
  }
};

// Per-block temperature gradients: the four per-polarity accumulators `[H * d]` back into the
// `[H, 2d]` slots of temp_same and temp_opp (see ChannelTemperatures).
template <typename T>
struct TemperatureSlopes {
  std::vector<T> same_pos, same_neg, opp_pos, opp_neg;
  explicit TemperatureSlopes(int64_t n) : same_pos(n), same_neg(n), opp_pos(n), opp_neg(n) {}
  void clear() {
    for (auto* x : {&same_pos, &same_neg, &opp_pos, &opp_neg}) std::fill(x->begin(), x->end(), T(0));
  }
  void write(T* grad_temp_same, T* grad_temp_opp, int64_t heads, int64_t d) const {
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t c = 0; c < d; ++c) {
        grad_temp_same[h * 2 * d + c] = same_pos[h * d + c];
        grad_temp_same[h * 2 * d + d + c] = same_neg[h * d + c];
        grad_temp_opp[h * 2 * d + d + c] = opp_pos[h * d + c];
        grad_temp_opp[h * 2 * d + c] = opp_neg[h * d + c];
      }
    }
  }
};

// The forward kernels also take bf16 q, k, v (and visible) with float32 temperatures: they read bf16,
// compute in float32 and write bf16 (`render.precision: bf16`); the backward kernels take float32 or
// float64 only.
void check_common(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& temp_same,
                  const at::Tensor& temp_opp, bool allow_bf16 = false) {
  TORCH_CHECK(q.device().is_cpu(), "polarity CPU kernels: CPU tensors expected");
  const bool bf16 = allow_bf16 && q.scalar_type() == at::kBFloat16;
  TORCH_CHECK(bf16 || q.scalar_type() == at::kFloat || q.scalar_type() == at::kDouble,
              "polarity CPU kernels: float32 or float64 expected (bf16 in forward), got ", q.scalar_type());
  for (const auto* t : {&k, &v}) {
    TORCH_CHECK(t->scalar_type() == q.scalar_type(), "polarity CPU kernels: q, k and v must share one dtype");
  }
  const auto temperature_type = bf16 ? at::kFloat : q.scalar_type();
  for (const auto* t : {&temp_same, &temp_opp}) {
    TORCH_CHECK(t->scalar_type() == temperature_type,
                "polarity CPU kernels: temperatures in the dtype of q (float32 for bf16 inputs)");
  }
  TORCH_CHECK(q.stride(-1) == 1 && k.stride(-1) == 1 && v.stride(-1) == 1,
              "polarity CPU kernels: channels must be contiguous");
  TORCH_CHECK(temp_same.is_contiguous() && temp_opp.is_contiguous(), "temperatures must be contiguous [H, 2d]");
}

void check_temperatures(const at::Tensor& temp_same, const at::Tensor& temp_opp, int64_t heads, int64_t d,
                        const char* what) {
  TORCH_CHECK(temp_same.dim() == 2 && temp_same.size(0) == heads && temp_same.size(1) == 2 * d &&
                  temp_opp.sizes() == temp_same.sizes(),
              what, ": temperatures [H, 2d]");
}

// The optional 0/1 factors `[rows, cols]` (points x views, rays x samples) in the dtype of `like`.
void check_visible(const c10::optional<at::Tensor>& visible, const at::Tensor& like, int64_t rows, int64_t cols,
                   const char* what) {
  if (visible.has_value()) {
    TORCH_CHECK(visible->scalar_type() == like.scalar_type() && visible->is_contiguous() && visible->dim() == 2 &&
                    visible->size(0) == rows && visible->size(1) == cols,
                what, ": visible [", rows, ", ", cols, "] in the dtype of the inputs");
  }
}

// Head dims with a compiled kernel (the inner loops unroll and vectorise at a fixed size); the
// Python side uses the PyTorch forms for others (`cpu_extension.HEAD_DIMS`).
template <typename F>
void dispatch_head_dim(int64_t d, F&& f) {
  switch (d) {
    case 2: f(std::integral_constant<int, 2>{}); break;
    case 4: f(std::integral_constant<int, 4>{}); break;
    case 8: f(std::integral_constant<int, 8>{}); break;
    case 16: f(std::integral_constant<int, 16>{}); break;
    case 32: f(std::integral_constant<int, 32>{}); break;
    case 64: f(std::integral_constant<int, 64>{}); break;
    default: TORCH_CHECK(false, "polarity CPU kernels: head dim must be 2, 4, 8, 16, 32 or 64, got ", d);
  }
}

template <typename T>
const T* optional_data(const c10::optional<at::Tensor>& t) {
  return t.has_value() ? t->data_ptr<T>() : nullptr;
}

// ------------------------------------------------------------------------------------------------
// View attention: one query per point over its views, one (point, head) at a time.
//   K_jc = expm1(min(|k_jc|, B)),  same_jc = [q_c > 0 == k_jc > 0]
//   w_same_j = sum_c Fs_c K_jc same_jc,   w_opp_j = sum_c Fo_c K_jc (1 - same_jc)
//   out = [sum_j w_same_j v_j[:d/2], sum_j w_opp_j v_j[d/2:]] / ([sum_j w_same_j, sum_j w_opp_j] + eps)

constexpr int64_t kMaxViews = 64;

template <typename T, int D>
struct ViewHead {
  QueryTerms<T, D> query;
  T key[kMaxViews][D], same[kMaxViews][D], ws[kMaxViews], wo[kMaxViews];
  T den_s = 0, den_o = 0;

  // Query terms, key features, the weights (zero for invisible views) and the denominators.
  // `k` points at view 0 of this head; views are `key_stride` apart.
  template <typename In>
  void weights(const In* q, const In* k, int64_t key_stride, const In* visible, int64_t views, const T* same_pos,
               const T* same_neg, const T* opp_pos, const T* opp_neg) {
    RowReader<In, T, D> reader;
    query.compute(reader.read(q), same_pos, same_neg, opp_pos, opp_neg);
    T ds = static_cast<T>(kEpsilon), dop = static_cast<T>(kEpsilon);
    for (int64_t j = 0; j < views; ++j) {
      const T* __restrict kj = reader.read(k + j * key_stride);
      T s = 0, o = 0;
      for (int c = 0; c < D; ++c) {
        const T x = kj[c];
        const T feature = expm1_clamped(std::abs(x));
        const T m = (x > 0 ? T(1) : T(0)) == query.pos[c] ? T(1) : T(0);
        key[j][c] = feature;
        same[j][c] = m;
        s += query.fs[c] * feature * m;
        o += query.fo[c] * feature * (1 - m);
      }
      const T vis = visible ? to_compute(visible[j]) : T(1);
      ws[j] = s * vis;
      wo[j] = o * vis;
      ds += ws[j];
      dop += wo[j];
    }
    den_s = ds;
    den_o = dop;
  }

  // Numerators sum_j w_j v_j per stream.
  template <typename In>
  void numerators(const In* v, int64_t value_stride, int64_t views, T* __restrict num) const {
    constexpr int half = D / 2;
    for (int e = 0; e < D; ++e) num[e] = 0;
    RowReader<In, T, D> reader;
    for (int64_t j = 0; j < views; ++j) {
      const T* __restrict vj = reader.read(v + j * value_stride);
      for (int e = 0; e < half; ++e) num[e] += ws[j] * vj[e];
      for (int e = half; e < D; ++e) num[e] += wo[j] * vj[e];
    }
  }
};

// `In`: the storage type of q, k, v, visible and out (T, or bf16 for inference); T: the compute type.
template <typename In, typename T, int D>
void view_forward_impl(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& temp_same,
                       const at::Tensor& temp_opp, const In* vis_ptr, at::Tensor& out) {
  constexpr int half = D / 2;
  const int64_t points = q.size(0), heads = q.size(1), views = k.size(1), dim = heads * D;
  const In* q_ptr = q.data_ptr<In>();
  const In* k_ptr = k.data_ptr<In>();
  const In* v_ptr = v.data_ptr<In>();
  In* out_ptr = out.data_ptr<In>();
  const ChannelTemperatures<T> temps(temp_same.data_ptr<T>(), temp_opp.data_ptr<T>(), heads, D);
  parallel_blocks(blocks_of(points, kPointsPerBlock), [&](int64_t first, int64_t last) {
    ViewHead<T, D> head;
    for (int64_t p = first * kPointsPerBlock; p < std::min(points, last * kPointsPerBlock); ++p) {
      const In* vis = vis_ptr ? vis_ptr + p * views : nullptr;
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t c0 = h * D;
        head.weights(q_ptr + p * q.stride(0) + c0, k_ptr + p * k.stride(0) + c0, k.stride(1), vis, views,
                     temps.same_pos.data() + c0, temps.same_neg.data() + c0, temps.opp_pos.data() + c0,
                     temps.opp_neg.data() + c0);
        T num[D];
        head.numerators(v_ptr + p * v.stride(0) + c0, v.stride(1), views, num);
        In* o = out_ptr + p * dim + c0;
        const T inv_s = 1 / head.den_s, inv_o = 1 / head.den_o;
        for (int e = 0; e < half; ++e) o[e] = static_cast<In>(num[e] * inv_s);
        for (int e = half; e < D; ++e) o[e] = static_cast<In>(num[e] * inv_o);
      }
    }
  });
}

#if defined(__AVX2__) && defined(__FMA__)
// ------------------------------------------------------------------------------------------------
// The bf16 inference form of the view attention for the presets' 4 heads (C = 32 channels of D = 8,
// or 64 of 16) with AVX2 intrinsics, a whole point at a time: a view's 8 weights (4 heads x 2 streams)
// come out of one transposing reduction of the heads' product vectors (`lane_sums_8`: 8 vectors to one),
// and each head's values are weighted by one permutation of them. The per-head form below reduces
// 4 views of one head at a time and computes the query's features a head at a time; this one is 2.3x it
// on fern's 8 views (docs/benchmarks.md). The same function as `view_forward_impl` (the same polynomial,
// clamp and epsilon); only the order of float additions differs.
template <int C>
void view_forward_bf16_heads4_avx2(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                   const ChannelTemperatures<float>& temps, const c10::BFloat16* vis_ptr,
                                   at::Tensor& out) {
  static_assert(C == 32 || C == 64, "4 heads of 8 or 16 channels");
  constexpr int n = C / 8;        // 8-float vectors per point
  constexpr int per_head = n / 4;  // vectors per head: 1 or 2
  const int64_t points = q.size(0), views = k.size(1);
  const auto* q_ptr = q.data_ptr<c10::BFloat16>();
  const auto* k_ptr = k.data_ptr<c10::BFloat16>();
  const auto* v_ptr = v.data_ptr<c10::BFloat16>();
  auto* out_ptr = out.data_ptr<c10::BFloat16>();
  const int64_t q_point = q.stride(0), k_point = k.stride(0), k_view = k.stride(1), v_point = v.stride(0),
                v_view = v.stride(1);
  const float clamp = static_cast<float>(kExponentClamp);
  const __m256 zero = _mm256_setzero_ps(), one = _mm256_set1_ps(1.0f);
  // Per head h, the lanes of [w_same 0-3 | w_opp 0-3] that its value vector takes: for D = 8 the first
  // 4 channels the same-sign weight, the last 4 the opposite-sign one; for D = 16 a whole vector each.
  __m256i pick[4][2];
  for (int h = 0; h < 4; ++h) {
    if constexpr (per_head == 1) {
      pick[h][0] = _mm256_setr_epi32(h, h, h, h, 4 + h, 4 + h, 4 + h, 4 + h);
    } else {
      pick[h][0] = _mm256_set1_epi32(h);
      pick[h][1] = _mm256_set1_epi32(4 + h);
    }
  }
  parallel_blocks(blocks_of(points, kPointsPerBlock), [&](int64_t first, int64_t last) {
    __m256 weights[kMaxViews];  // per view: [w_same of heads 0-3, w_opp of heads 0-3], visibility applied
    for (int64_t p = first * kPointsPerBlock; p < std::min(points, last * kPointsPerBlock); ++p) {
      __m256 fs[n], fo[n], pos[n];
      for (int t = 0; t < n; ++t) {
        const int c = 8 * t;
        const __m256 x = pola_gnt_math::load_bf16x8(q_ptr + p * q_point + c);
        pos[t] = _mm256_cmp_ps(x, zero, _CMP_GT_OQ);
        const __m256 mag = pola_gnt_math::abs_x8(x);
        const __m256 ts = _mm256_blendv_ps(_mm256_loadu_ps(temps.same_neg.data() + c),
                                           _mm256_loadu_ps(temps.same_pos.data() + c), pos[t]);
        const __m256 to = _mm256_blendv_ps(_mm256_loadu_ps(temps.opp_neg.data() + c),
                                           _mm256_loadu_ps(temps.opp_pos.data() + c), pos[t]);
        fs[t] = pola_gnt_math::expm1_clamped_x8(_mm256_mul_ps(ts, mag), clamp);
        fo[t] = pola_gnt_math::expm1_clamped_x8(_mm256_mul_ps(to, mag), clamp);
      }
      __m256 den = _mm256_set1_ps(static_cast<float>(kEpsilon));
      for (int64_t j = 0; j < views; ++j) {
        const c10::BFloat16* kj = k_ptr + p * k_point + j * k_view;
        __m256 terms[8];  // terms[h]: head h's same-sign products, terms[4 + h]: its opposite-sign ones
        for (int h = 0; h < 4; ++h) {
          terms[h] = zero;
          terms[4 + h] = zero;
          for (int u = 0; u < per_head; ++u) {
            const int t = h * per_head + u;
            const __m256 x = pola_gnt_math::load_bf16x8(kj + 8 * t);
            const __m256 feature = pola_gnt_math::expm1_clamped_x8(pola_gnt_math::abs_x8(x), clamp);
            // same sign as the query: (k > 0) == (q > 0); a zero k or q has a zero feature either way
            const __m256 same = _mm256_xor_ps(_mm256_cmp_ps(x, zero, _CMP_LE_OQ), pos[t]);
            terms[h] = _mm256_fmadd_ps(_mm256_and_ps(same, fs[t]), feature, terms[h]);
            terms[4 + h] = _mm256_fmadd_ps(_mm256_andnot_ps(same, fo[t]), feature, terms[4 + h]);
          }
        }
        __m256 w = pola_gnt_math::lane_sums_8(terms);
        if (vis_ptr) w = _mm256_mul_ps(w, _mm256_set1_ps(to_compute(vis_ptr[p * views + j])));
        weights[j] = w;
        den = _mm256_add_ps(den, w);
      }
      const __m256 inv = _mm256_div_ps(one, den);
      __m256 num[n];
      for (int t = 0; t < n; ++t) num[t] = zero;
      for (int64_t j = 0; j < views; ++j) {
        const c10::BFloat16* vj = v_ptr + p * v_point + j * v_view;
        for (int h = 0; h < 4; ++h) {
          for (int u = 0; u < per_head; ++u) {
            const int t = h * per_head + u;
            const __m256 w = _mm256_permutevar8x32_ps(weights[j], pick[h][u]);
            num[t] = _mm256_fmadd_ps(w, pola_gnt_math::load_bf16x8(vj + 8 * t), num[t]);
          }
        }
      }
      c10::BFloat16* o = out_ptr + p * C;
      for (int h = 0; h < 4; ++h) {
        for (int u = 0; u < per_head; ++u) {
          const int t = h * per_head + u;
          pola_gnt_math::store_bf16x8(o + 8 * t, _mm256_mul_ps(num[t], _mm256_permutevar8x32_ps(inv, pick[h][u])));
        }
      }
    }
  });
}
#endif

#if defined(__AVX2__) && defined(__FMA__)
// ------------------------------------------------------------------------------------------------
// The bf16 inference form of the view attention with AVX2 intrinsics, for head dims that are a multiple
// of 8 (one or more 8-float vectors per head row). The generic loop above leaves each view's two weights
// as scalar horizontal sums and converts bf16 through buffers; here a point's head reads bf16 straight
// into vectors, and the weights of 4 views x 2 streams come out of one transposing reduction (8 vectors
// to one). The same function as `view_forward_impl` (the same polynomial, the same clamp); only the
// order of float additions differs. The float and double kernels stay the generic ones, so that
// `render.precision: fp32` and training keep their outputs bit for bit.


using pola_gnt_math::abs_x8;
using pola_gnt_math::lane_sums_8;
using pola_gnt_math::load_bf16x8;
using pola_gnt_math::store_bf16x8;

inline __m256 expm1_clamped_x8(__m256 z) {
  return pola_gnt_math::expm1_clamped_x8(z, static_cast<float>(kExponentClamp));
}

template <int D>
void view_forward_bf16_avx2(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const ChannelTemperatures<float>& temps, const c10::BFloat16* vis_ptr, at::Tensor& out) {
  static_assert(D % 8 == 0, "one or more 8-float vectors per head row");
  constexpr int n = D / 8;  // vectors per head row
  const int64_t points = q.size(0), heads = q.size(1), views = k.size(1), dim = heads * D;
  const int64_t groups = (views + 3) / 4;  // views in groups of 4 (the last padded with zero weights)
  const auto* q_ptr = q.data_ptr<c10::BFloat16>();
  const auto* k_ptr = k.data_ptr<c10::BFloat16>();
  const auto* v_ptr = v.data_ptr<c10::BFloat16>();
  auto* out_ptr = out.data_ptr<c10::BFloat16>();
  const int64_t q_point = q.stride(0), k_point = k.stride(0), k_view = k.stride(1), v_point = v.stride(0),
                v_view = v.stride(1);
  const __m256 zero = _mm256_setzero_ps(), eps = _mm256_set1_ps(static_cast<float>(kEpsilon));
  parallel_blocks(blocks_of(points, kPointsPerBlock), [&](int64_t first, int64_t last) {
    // Per group: [w_same of its 4 views, w_opp of its 4 views], visibility applied.
    __m256 weights[(kMaxViews + 3) / 4];
    for (int64_t p = first * kPointsPerBlock; p < std::min(points, last * kPointsPerBlock); ++p) {
      const c10::BFloat16* vis = vis_ptr ? vis_ptr + p * views : nullptr;
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t c0 = h * D;
        __m256 fs[n], fo[n], pos[n];
        for (int t = 0; t < n; ++t) {
          const int64_t c = c0 + 8 * t;
          const __m256 x = load_bf16x8(q_ptr + p * q_point + c);
          pos[t] = _mm256_cmp_ps(x, zero, _CMP_GT_OQ);
          const __m256 mag = abs_x8(x);
          const __m256 ts = _mm256_blendv_ps(_mm256_loadu_ps(temps.same_neg.data() + c),
                                             _mm256_loadu_ps(temps.same_pos.data() + c), pos[t]);
          const __m256 to = _mm256_blendv_ps(_mm256_loadu_ps(temps.opp_neg.data() + c),
                                             _mm256_loadu_ps(temps.opp_pos.data() + c), pos[t]);
          fs[t] = expm1_clamped_x8(_mm256_mul_ps(ts, mag));
          fo[t] = expm1_clamped_x8(_mm256_mul_ps(to, mag));
        }
        __m256 den = zero;  // [sum of w_same over each group's lanes, sum of w_opp ...]
        for (int64_t g = 0; g < groups; ++g) {
          __m256 terms[8];  // terms[i]: view 4g + i's same-sign products, terms[4 + i]: its opposite-sign ones
          for (int i = 0; i < 4; ++i) {
            terms[i] = zero;
            terms[4 + i] = zero;
            const int64_t j = 4 * g + i;
            if (j >= views) continue;
            for (int t = 0; t < n; ++t) {
              const __m256 x = load_bf16x8(k_ptr + p * k_point + j * k_view + c0 + 8 * t);
              const __m256 feature = expm1_clamped_x8(abs_x8(x));
              // same sign as the query: (k > 0) == (q > 0); a zero k or q has a zero feature either way
              const __m256 same = _mm256_xor_ps(_mm256_cmp_ps(x, zero, _CMP_LE_OQ), pos[t]);
              terms[i] = _mm256_fmadd_ps(_mm256_and_ps(same, fs[t]), feature, terms[i]);
              terms[4 + i] = _mm256_fmadd_ps(_mm256_andnot_ps(same, fo[t]), feature, terms[4 + i]);
            }
          }
          __m256 w = lane_sums_8(terms);
          if (vis) {
            alignas(32) float factors[8];
            for (int i = 0; i < 4; ++i) {
              const int64_t j = 4 * g + i;
              factors[i] = factors[4 + i] = j < views ? to_compute(vis[j]) : 0.0f;
            }
            w = _mm256_mul_ps(w, _mm256_load_ps(factors));
          }
          weights[g] = w;
          den = _mm256_add_ps(den, w);
        }
        // den lanes 0-3 -> one w_same total, lanes 4-7 -> one w_opp total.
        const __m256 pair = _mm256_hadd_ps(den, den);  // [a01, a23, a01, a23 | b01, b23, b01, b23]
        const __m256 totals = _mm256_add_ps(_mm256_hadd_ps(pair, pair), eps);  // [S, S, S, S | O, O, O, O]
        const __m256 inv = _mm256_div_ps(_mm256_set1_ps(1.0f), totals);
        __m256 num[n];
        for (int t = 0; t < n; ++t) num[t] = zero;
        for (int64_t j = 0; j < views; ++j) {
          const __m256 w = weights[j / 4];
          const int i = static_cast<int>(j % 4);
          const __m256 w_same = _mm256_permutevar8x32_ps(w, _mm256_set1_epi32(i));
          const __m256 w_opp = _mm256_permutevar8x32_ps(w, _mm256_set1_epi32(4 + i));
          const c10::BFloat16* vj = v_ptr + p * v_point + j * v_view + c0;
          if constexpr (n == 1) {
            // lanes 0-3: the same-sign stream, 4-7: the opposite-sign one
            num[0] = _mm256_fmadd_ps(_mm256_blend_ps(w_same, w_opp, 0xF0), load_bf16x8(vj), num[0]);
          } else {
            for (int t = 0; t < n; ++t) {
              num[t] = _mm256_fmadd_ps(t < n / 2 ? w_same : w_opp, load_bf16x8(vj + 8 * t), num[t]);
            }
          }
        }
        const __m256 inv_same = _mm256_permute2f128_ps(inv, inv, 0x00), inv_opp = _mm256_permute2f128_ps(inv, inv, 0x11);
        c10::BFloat16* o = out_ptr + p * dim + c0;
        for (int t = 0; t < n; ++t) {
          __m256 r;
          if constexpr (n == 1) {
            r = _mm256_mul_ps(num[0], inv);
          } else {
            r = _mm256_mul_ps(num[t], t < n / 2 ? inv_same : inv_opp);
          }
          store_bf16x8(o + 8 * t, r);
        }
      }
    }
  });
}

// The bf16 inference form of the ray attention with AVX2 intrinsics (head dims a multiple of 8), the
// same function as `ray_forward_impl`: per (ray, head) the key statistics W, Z in registers and memory
// rows, then each query against them. Each row of W is stored twice, blended for the query's sign:
// lanes of the same-sign stream from the key part a positive query meets, lanes of the opposite-sign
// stream from the other part (`rows_pos[c]`), and the reverse for a negative query (`rows_neg[c]`), so
// a query channel costs one load and one multiply-add per 8 output channels.
template <int D>
void ray_forward_bf16_avx2(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const ChannelTemperatures<float>& temps, const c10::BFloat16* vis_ptr, int64_t heads,
                           at::Tensor& out) {
  static_assert(D % 8 == 0, "one or more 8-float vectors per head row");
  constexpr int n = D / 8;
  const int64_t rays = q.size(0), samples = q.size(1), dim = heads * D;
  const auto* q_ptr = q.data_ptr<c10::BFloat16>();
  const auto* k_ptr = k.data_ptr<c10::BFloat16>();
  const auto* v_ptr = v.data_ptr<c10::BFloat16>();
  auto* out_ptr = out.data_ptr<c10::BFloat16>();
  const int64_t q_ray = q.stride(0), q_sample = q.stride(1), k_ray = k.stride(0), k_sample = k.stride(1),
                v_ray = v.stride(0), v_sample = v.stride(1);
  const __m256 zero = _mm256_setzero_ps(), eps = _mm256_set1_ps(static_cast<float>(kEpsilon));
  parallel_blocks(blocks_of(rays, kRaysPerBlock), [&](int64_t first, int64_t last) {
    alignas(32) float W[2 * D][D];             // row c: the k > 0 part of channel c, row D + c: the k < 0 part
    alignas(32) float rows_pos[D][D], rows_neg[D][D];
    alignas(32) float feature[D], fs[D], fo[D];
    for (int64_t r = first * kRaysPerBlock; r < std::min(rays, last * kRaysPerBlock); ++r) {
      const c10::BFloat16* vis = vis_ptr ? vis_ptr + r * samples : nullptr;
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t c0 = h * D;
        // Key statistics.
        for (int row = 0; row < 2 * D; ++row)
          for (int t = 0; t < n; ++t) _mm256_store_ps(W[row] + 8 * t, zero);
        __m256 z_pos[n], z_neg[n];
        for (int t = 0; t < n; ++t) z_pos[t] = z_neg[t] = zero;
        for (int64_t j = 0; j < samples; ++j) {
          const __m256 vis_j = _mm256_set1_ps(vis ? to_compute(vis[j]) : 1.0f);
          uint32_t negative = 0;  // bit c: k_c <= 0 (its feature goes to row D + c; a zero k adds 0 either way)
          __m256 vj[n];
          for (int t = 0; t < n; ++t) {
            const __m256 x = load_bf16x8(k_ptr + r * k_ray + j * k_sample + c0 + 8 * t);
            const __m256 f = _mm256_mul_ps(expm1_clamped_x8(abs_x8(x)), vis_j);
            const __m256 positive = _mm256_cmp_ps(x, zero, _CMP_GT_OQ);
            z_pos[t] = _mm256_add_ps(z_pos[t], _mm256_and_ps(positive, f));
            z_neg[t] = _mm256_add_ps(z_neg[t], _mm256_andnot_ps(positive, f));
            negative |= static_cast<uint32_t>(~_mm256_movemask_ps(positive) & 0xFF) << (8 * t);
            _mm256_store_ps(feature + 8 * t, f);
            vj[t] = load_bf16x8(v_ptr + r * v_ray + j * v_sample + c0 + 8 * t);
          }
          for (int c = 0; c < D; ++c) {
            float* w = W[c + D * ((negative >> c) & 1u)];
            const __m256 f = _mm256_broadcast_ss(feature + c);
            for (int t = 0; t < n; ++t) _mm256_store_ps(w + 8 * t, _mm256_fmadd_ps(f, vj[t], _mm256_load_ps(w + 8 * t)));
          }
        }
        // Rows for each sign of a query channel: output channels e < D/2 (same-sign stream) from the key part
        // of the query's sign, e >= D/2 (opposite-sign stream) from the other.
        for (int c = 0; c < D; ++c) {
          for (int t = 0; t < n; ++t) {
            const __m256 plus = _mm256_load_ps(W[c] + 8 * t), minus = _mm256_load_ps(W[D + c] + 8 * t);
            if constexpr (n == 1) {
              _mm256_store_ps(rows_pos[c], _mm256_blend_ps(plus, minus, 0xF0));
              _mm256_store_ps(rows_neg[c], _mm256_blend_ps(minus, plus, 0xF0));
            } else {
              _mm256_store_ps(rows_pos[c] + 8 * t, t < n / 2 ? plus : minus);
              _mm256_store_ps(rows_neg[c] + 8 * t, t < n / 2 ? minus : plus);
            }
          }
        }
        // Queries.
        for (int64_t i = 0; i < samples; ++i) {
          uint32_t negative = 0;  // bit c: q_c <= 0
          __m256 den_s = zero, den_o = zero;
          for (int t = 0; t < n; ++t) {
            const int64_t c = c0 + 8 * t;
            const __m256 x = load_bf16x8(q_ptr + r * q_ray + i * q_sample + c);
            const __m256 positive = _mm256_cmp_ps(x, zero, _CMP_GT_OQ);
            const __m256 mag = abs_x8(x);
            const __m256 ts = _mm256_blendv_ps(_mm256_loadu_ps(temps.same_neg.data() + c),
                                               _mm256_loadu_ps(temps.same_pos.data() + c), positive);
            const __m256 to = _mm256_blendv_ps(_mm256_loadu_ps(temps.opp_neg.data() + c),
                                               _mm256_loadu_ps(temps.opp_pos.data() + c), positive);
            const __m256 f_s = expm1_clamped_x8(_mm256_mul_ps(ts, mag));
            const __m256 f_o = expm1_clamped_x8(_mm256_mul_ps(to, mag));
            _mm256_store_ps(fs + 8 * t, f_s);
            _mm256_store_ps(fo + 8 * t, f_o);
            negative |= static_cast<uint32_t>(~_mm256_movemask_ps(positive) & 0xFF) << (8 * t);
            // Denominators: the same-sign stream meets the key part of the query's sign, the other the opposite.
            den_s = _mm256_fmadd_ps(f_s, _mm256_blendv_ps(z_neg[t], z_pos[t], positive), den_s);
            den_o = _mm256_fmadd_ps(f_o, _mm256_blendv_ps(z_pos[t], z_neg[t], positive), den_o);
          }
          __m256 acc[n];
          for (int t = 0; t < n; ++t) acc[t] = zero;
          for (int c = 0; c < D; ++c) {
            const float* row = ((negative >> c) & 1u) ? rows_neg[c] : rows_pos[c];
            const __m256 f_s = _mm256_broadcast_ss(fs + c), f_o = _mm256_broadcast_ss(fo + c);
            if constexpr (n == 1) {
              acc[0] = _mm256_fmadd_ps(_mm256_blend_ps(f_s, f_o, 0xF0), _mm256_load_ps(row), acc[0]);
            } else {
              for (int t = 0; t < n; ++t) acc[t] = _mm256_fmadd_ps(t < n / 2 ? f_s : f_o, _mm256_load_ps(row + 8 * t), acc[t]);
            }
          }
          // [den_s total x4 | den_o total x4] from the two lane vectors.
          const __m256 pair = _mm256_hadd_ps(den_s, den_o);          // [s01 s23 o01 o23 | s45 s67 o45 o67]
          const __m256 quad = _mm256_hadd_ps(pair, pair);            // [s0-3 o0-3 s0-3 o0-3 | s4-7 o4-7 ...]
          const __m256 both = _mm256_add_ps(quad, _mm256_permute2f128_ps(quad, quad, 0x01));  // [S O S O | S O S O]
          const __m256 inv = _mm256_div_ps(_mm256_set1_ps(1.0f), _mm256_add_ps(both, eps));
          const __m256 inv_s = _mm256_permute_ps(inv, 0x00), inv_o = _mm256_permute_ps(inv, 0x55);
          c10::BFloat16* o = out_ptr + (r * samples + i) * dim + c0;
          for (int t = 0; t < n; ++t) {
            __m256 scale;
            if constexpr (n == 1) {
              scale = _mm256_blend_ps(inv_s, inv_o, 0xF0);
            } else {
              scale = t < n / 2 ? inv_s : inv_o;
            }
            store_bf16x8(o + 8 * t, _mm256_mul_ps(acc[t], scale));
          }
        }
      }
    }
  });
}
#endif

template <typename T, int D>
void view_backward_impl(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                        const at::Tensor& temp_same, const at::Tensor& temp_opp, const T* vis_ptr, at::Tensor& grad_q,
                        at::Tensor& grad_k, at::Tensor& grad_v, at::Tensor& grad_temp_same, at::Tensor& grad_temp_opp) {
  constexpr int half = D / 2;
  const int64_t points = q.size(0), heads = q.size(1), views = k.size(1), dim = heads * D;
  const T* g_ptr = grad_out.data_ptr<T>();
  const T* q_ptr = q.data_ptr<T>();
  const T* k_ptr = k.data_ptr<T>();
  const T* v_ptr = v.data_ptr<T>();
  T* gq_ptr = grad_q.data_ptr<T>();
  T* gk_ptr = grad_k.data_ptr<T>();
  T* gv_ptr = grad_v.data_ptr<T>();
  const ChannelTemperatures<T> temps(temp_same.data_ptr<T>(), temp_opp.data_ptr<T>(), heads, D);
  const T clamp = static_cast<T>(kExponentClamp);
  parallel_blocks(blocks_of(points, kPointsPerBlock), [&](int64_t first, int64_t last) {
    ViewHead<T, D> head;
    TemperatureSlopes<T> slopes(dim);
    T grad_ws[kMaxViews], grad_wo[kMaxViews];
    for (int64_t block = first; block < last; ++block) {
      slopes.clear();
      for (int64_t p = block * kPointsPerBlock; p < std::min(points, (block + 1) * kPointsPerBlock); ++p) {
        const T* vis = vis_ptr ? vis_ptr + p * views : nullptr;
        for (int64_t h = 0; h < heads; ++h) {
          const int64_t c0 = h * D, q_offset = p * dim + c0, k_offset = p * views * dim + c0;  // of the gradients
          const T* kh = k_ptr + p * k.stride(0) + c0;
          const T* vh = v_ptr + p * v.stride(0) + c0;
          const T* __restrict g = g_ptr + q_offset;
          head.weights(q_ptr + p * q.stride(0) + c0, kh, k.stride(1), vis, views, temps.same_pos.data() + c0,
                       temps.same_neg.data() + c0, temps.opp_pos.data() + c0, temps.opp_neg.data() + c0);
          T num[D];
          head.numerators(vh, v.stride(1), views, num);
          // out = num / den per stream: d v_j = g w_j / den, d w_j = (g . v_j - g . out) / den.
          const T inv_s = 1 / head.den_s, inv_o = 1 / head.den_o;
          T g_out_s = 0, g_out_o = 0;
          for (int e = 0; e < half; ++e) g_out_s += g[e] * num[e];
          for (int e = half; e < D; ++e) g_out_o += g[e] * num[e];
          g_out_s *= inv_s * inv_s;
          g_out_o *= inv_o * inv_o;
          T grad_fs[D] = {}, grad_fo[D] = {};
          for (int64_t j = 0; j < views; ++j) {
            const T* __restrict vj = vh + j * v.stride(1);
            const T* __restrict kj = kh + j * k.stride(1);
            T* __restrict gvj = gv_ptr + k_offset + j * dim;
            T* __restrict gkj = gk_ptr + k_offset + j * dim;
            T g_v_s = 0, g_v_o = 0;
            for (int e = 0; e < half; ++e) g_v_s += g[e] * vj[e];
            for (int e = half; e < D; ++e) g_v_o += g[e] * vj[e];
            const T vis_j = vis ? vis[j] : T(1);
            const T dws = (g_v_s * inv_s - g_out_s) * vis_j;
            const T dwo = (g_v_o * inv_o - g_out_o) * vis_j;
            const T a_s = head.ws[j] * inv_s, a_o = head.wo[j] * inv_o;
            for (int e = 0; e < half; ++e) gvj[e] = g[e] * a_s;
            for (int e = half; e < D; ++e) gvj[e] = g[e] * a_o;
            // Keys: d K_jc = d w_same_j Fs_c same_jc + d w_opp_j Fo_c (1 - same_jc), dk = dK (K + 1) sign(k)
            // below the clamp. Query features: d Fs_c = sum_j d w_same_j K_jc same_jc, d Fo_c likewise.
            for (int c = 0; c < D; ++c) {
              const T x = kj[c];
              const T kw = head.key[j][c], m = head.same[j][c];
              const T grad_key = dws * head.query.fs[c] * m + dwo * head.query.fo[c] * (1 - m);
              grad_fs[c] += dws * kw * m;
              grad_fo[c] += dwo * kw * (1 - m);
              const T sign = (x > 0 ? T(1) : T(0)) - (x < 0 ? T(1) : T(0));
              gkj[c] = std::abs(x) <= clamp ? grad_key * (kw + 1) * sign : T(0);
            }
          }
          head.query.backward(grad_fs, grad_fo, gq_ptr + q_offset, slopes.same_pos.data() + c0,
                              slopes.same_neg.data() + c0, slopes.opp_pos.data() + c0, slopes.opp_neg.data() + c0);
        }
      }
      slopes.write(grad_temp_same.data_ptr<T>() + block * heads * 2 * D,
                   grad_temp_opp.data_ptr<T>() + block * heads * 2 * D, heads, D);
    }
  });
}

void check_view(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& temp_same,
                const at::Tensor& temp_opp, const c10::optional<at::Tensor>& visible, bool allow_bf16 = false) {
  check_common(q, k, v, temp_same, temp_opp, allow_bf16);
  TORCH_CHECK(q.dim() == 3 && k.dim() == 4 && k.sizes() == v.sizes(), "view attention: q [P, H, d], k, v [P, V, H, d]");
  // Heads packed in each token (the point and view axes may be strided, as chunks of one projection are).
  TORCH_CHECK(q.stride(1) == q.size(2) && k.stride(2) == k.size(3) && v.stride(2) == v.size(3),
              "view attention: each token's heads must be packed");
  TORCH_CHECK(k.size(0) == q.size(0) && k.size(2) == q.size(1) && k.size(3) == q.size(2), "view attention: shapes");
  TORCH_CHECK(k.size(1) <= kMaxViews, "view attention: at most ", kMaxViews, " views");
  check_temperatures(temp_same, temp_opp, q.size(1), q.size(2), "view attention");
  check_visible(visible, q, q.size(0), k.size(1), "view attention");
}

at::Tensor view_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& temp_same,
                        const at::Tensor& temp_opp, const c10::optional<at::Tensor>& visible) {
  check_view(q, k, v, temp_same, temp_opp, visible, /*allow_bf16=*/true);
  at::Tensor out = at::empty(q.sizes(), q.options());
  if (q.scalar_type() == at::kBFloat16) {
#if defined(__AVX2__) && defined(__FMA__)
    const int64_t width = q.size(1) * q.size(2);
    if (q.size(1) == 4 && (width == 32 || width == 64)) {
      const ChannelTemperatures<float> temps(temp_same.data_ptr<float>(), temp_opp.data_ptr<float>(), q.size(1),
                                             q.size(2));
      const auto* visible_data = optional_data<c10::BFloat16>(visible);
      if (width == 32) {
        view_forward_bf16_heads4_avx2<32>(q, k, v, temps, visible_data, out);
      } else {
        view_forward_bf16_heads4_avx2<64>(q, k, v, temps, visible_data, out);
      }
      return out;
    }
#endif
    dispatch_head_dim(q.size(2), [&](auto D) {
      constexpr int d = decltype(D)::value;
#if defined(__AVX2__) && defined(__FMA__)
      if constexpr (d % 8 == 0) {
        const ChannelTemperatures<float> temps(temp_same.data_ptr<float>(), temp_opp.data_ptr<float>(), q.size(1), d);
        view_forward_bf16_avx2<d>(q, k, v, temps, optional_data<c10::BFloat16>(visible), out);
        return;
      }
#endif
      view_forward_impl<c10::BFloat16, float, d>(q, k, v, temp_same, temp_opp, optional_data<c10::BFloat16>(visible),
                                                 out);
    });
    return out;
  }
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "view_forward", [&] {
    dispatch_head_dim(q.size(2), [&](auto D) {
      view_forward_impl<scalar_t, scalar_t, decltype(D)::value>(q, k, v, temp_same, temp_opp,
                                                                optional_data<scalar_t>(visible), out);
    });
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> view_backward(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& temp_same, const at::Tensor& temp_opp, const c10::optional<at::Tensor>& visible) {
  check_view(q, k, v, temp_same, temp_opp, visible);
  TORCH_CHECK(grad_out.sizes() == q.sizes() && grad_out.scalar_type() == q.scalar_type(), "view attention: grad_out");
  const at::Tensor g = grad_out.contiguous();
  at::Tensor grad_q = at::empty(q.sizes(), q.options());
  at::Tensor grad_k = at::empty(k.sizes(), k.options());
  at::Tensor grad_v = at::empty(v.sizes(), v.options());
  const int64_t blocks = blocks_of(q.size(0), kPointsPerBlock);
  at::Tensor grad_temp_same = at::empty({blocks, temp_same.size(0), temp_same.size(1)}, q.options());
  at::Tensor grad_temp_opp = at::empty_like(grad_temp_same);
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "view_backward", [&] {
    dispatch_head_dim(q.size(2), [&](auto D) {
      view_backward_impl<scalar_t, decltype(D)::value>(g, q, k, v, temp_same, temp_opp,
                                                       optional_data<scalar_t>(visible), grad_q, grad_k, grad_v,
                                                       grad_temp_same, grad_temp_opp);
    });
  });
  return {grad_q, grad_k, grad_v, grad_temp_same, grad_temp_opp};
}

// ------------------------------------------------------------------------------------------------
// Ray attention: the linear form over the samples of each ray, one (ray, head) at a time.
//
// Key statistics, rows by the key part (row c: k+ part of channel c, row d + c: its k- part):
//   W[row, e] = sum_j Kpart_j[row] v_je,  Z[row] = sum_j Kpart_j[row]   (Kpart = [K [k > 0], K [k < 0]])
// Of a channel's two rows a key fills only the one of its sign, and a query feature meets only one
// row per stream: same-sign row_s(c) = c if q_c > 0 else d + c, opposite-sign row_o(c) = d + c if
// q_c > 0 else c (q+ meets k-). So
//   out_s[e < d/2] = sum_c Fs_c W[row_s(c), e] / (sum_c Fs_c Z[row_s(c)] + eps),  out_o likewise,
// d^2 multiply-adds per key and per query (a zero channel has a zero feature, so its row is moot).

template <typename T, int D>
inline void key_features(const T* __restrict k, T vis, T* __restrict feature, int* __restrict row) {
  for (int c = 0; c < D; ++c) {
    const T x = k[c];
    feature[c] = expm1_clamped(std::abs(x)) * vis;  // K vis
    row[c] = x > 0 ? c : D + c;
  }
}

template <typename T, int D>
struct RayHead {
  T W[2 * D][D], Z[2 * D], out[D];
  int row_s[D], row_o[D];
  QueryTerms<T, D> query;
  T den_s = 0, den_o = 0;

  template <typename In>
  void key_stats(const In* k, const In* v, const In* visible, int64_t samples, int64_t k_row, int64_t v_row) {
    RowReader<In, T, D> key_reader, value_reader;
    for (int row = 0; row < 2 * D; ++row) {
      for (int e = 0; e < D; ++e) W[row][e] = 0;
      Z[row] = 0;
    }
    for (int64_t j = 0; j < samples; ++j) {
      const T vis = visible ? to_compute(visible[j]) : T(1);
      const T* __restrict vj = value_reader.read(v + j * v_row);
      T feature[D];
      int row[D];
      key_features<T, D>(key_reader.read(k + j * k_row), vis, feature, row);
      for (int c = 0; c < D; ++c) {
        T* __restrict w = W[row[c]];
        for (int e = 0; e < D; ++e) w[e] += feature[c] * vj[e];
        Z[row[c]] += feature[c];
      }
    }
  }

  // One query: its terms and rows, the output and the denominators.
  template <typename In>
  void attend(const In* q_in, const T* same_pos, const T* same_neg, const T* opp_pos, const T* opp_neg) {
    constexpr int half = D / 2;
    RowReader<In, T, D> reader;
    const T* __restrict q = reader.read(q_in);
    query.compute(q, same_pos, same_neg, opp_pos, opp_neg);
    for (int c = 0; c < D; ++c) {
      row_s[c] = q[c] > 0 ? c : D + c;
      row_o[c] = q[c] > 0 ? D + c : c;
    }
    T acc[D] = {};
    T ds = static_cast<T>(kEpsilon), dop = static_cast<T>(kEpsilon);
    for (int c = 0; c < D; ++c) {
      const T fs = query.fs[c], fo = query.fo[c];
      const T* __restrict w_s = W[row_s[c]];
      const T* __restrict w_o = W[row_o[c]];
      for (int e = 0; e < half; ++e) acc[e] += fs * w_s[e];
      for (int e = half; e < D; ++e) acc[e] += fo * w_o[e];
      ds += fs * Z[row_s[c]];
      dop += fo * Z[row_o[c]];
    }
    den_s = ds;
    den_o = dop;
    for (int e = 0; e < half; ++e) out[e] = acc[e] / ds;
    for (int e = half; e < D; ++e) out[e] = acc[e] / dop;
  }
};

template <typename In, typename T, int D>
void ray_forward_impl(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& temp_same,
                      const at::Tensor& temp_opp, const In* vis_ptr, int64_t heads, at::Tensor& out) {
  const int64_t rays = q.size(0), samples = q.size(1), dim = heads * D;
  const In* q_ptr = q.data_ptr<In>();
  const In* k_ptr = k.data_ptr<In>();
  const In* v_ptr = v.data_ptr<In>();
  In* out_ptr = out.data_ptr<In>();  // [R, S, H * d] contiguous
  const ChannelTemperatures<T> temps(temp_same.data_ptr<T>(), temp_opp.data_ptr<T>(), heads, D);
  parallel_blocks(blocks_of(rays, kRaysPerBlock), [&](int64_t first, int64_t last) {
    RayHead<T, D> head;
    for (int64_t r = first * kRaysPerBlock; r < std::min(rays, last * kRaysPerBlock); ++r) {
      const In* vis = vis_ptr ? vis_ptr + r * samples : nullptr;
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t c0 = h * D;
        head.key_stats(k_ptr + r * k.stride(0) + c0, v_ptr + r * v.stride(0) + c0, vis, samples, k.stride(1),
                       v.stride(1));
        for (int64_t i = 0; i < samples; ++i) {
          head.attend(q_ptr + r * q.stride(0) + i * q.stride(1) + c0, temps.same_pos.data() + c0,
                      temps.same_neg.data() + c0, temps.opp_pos.data() + c0, temps.opp_neg.data() + c0);
          In* o = out_ptr + (r * samples + i) * dim + c0;
          for (int e = 0; e < D; ++e) o[e] = static_cast<In>(head.out[e]);
        }
      }
    }
  });
}

template <typename T, int D>
void ray_backward_impl(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                       const at::Tensor& temp_same, const at::Tensor& temp_opp, const T* vis_ptr, int64_t heads,
                       at::Tensor& grad_q, at::Tensor& grad_k, at::Tensor& grad_v, at::Tensor& grad_temp_same,
                       at::Tensor& grad_temp_opp) {
  constexpr int half = D / 2;
  const int64_t rays = q.size(0), samples = q.size(1), dim = heads * D;
  const T* g_ptr = grad_out.data_ptr<T>();  // contiguous [R, S, dim]
  const T* q_ptr = q.data_ptr<T>();
  const T* k_ptr = k.data_ptr<T>();
  const T* v_ptr = v.data_ptr<T>();
  T* gq_ptr = grad_q.data_ptr<T>();  // contiguous [R, S, dim] each
  T* gk_ptr = grad_k.data_ptr<T>();
  T* gv_ptr = grad_v.data_ptr<T>();
  const ChannelTemperatures<T> temps(temp_same.data_ptr<T>(), temp_opp.data_ptr<T>(), heads, D);
  const T clamp = static_cast<T>(kExponentClamp);
  parallel_blocks(blocks_of(rays, kRaysPerBlock), [&](int64_t first, int64_t last) {
    RayHead<T, D> head;
    TemperatureSlopes<T> slopes(dim);
    T grad_W[2 * D][D], grad_Z[2 * D];
    for (int64_t block = first; block < last; ++block) {
      slopes.clear();
      for (int64_t r = block * kRaysPerBlock; r < std::min(rays, (block + 1) * kRaysPerBlock); ++r) {
        const T* vis = vis_ptr ? vis_ptr + r * samples : nullptr;
        for (int64_t h = 0; h < heads; ++h) {
          const int64_t c0 = h * D;
          const T* kh = k_ptr + r * k.stride(0) + c0;
          const T* vh = v_ptr + r * v.stride(0) + c0;
          head.key_stats(kh, vh, vis, samples, k.stride(1), v.stride(1));
          for (int row = 0; row < 2 * D; ++row) {
            for (int e = 0; e < D; ++e) grad_W[row][e] = 0;
            grad_Z[row] = 0;
          }
          // Queries: out = num / den, so d num = g / den and d den = -(g . out) / den.
          for (int64_t i = 0; i < samples; ++i) {
            head.attend(q_ptr + r * q.stride(0) + i * q.stride(1) + c0, temps.same_pos.data() + c0,
                        temps.same_neg.data() + c0, temps.opp_pos.data() + c0, temps.opp_neg.data() + c0);
            const T* __restrict g = g_ptr + (r * samples + i) * dim + c0;
            T grad_den_s = 0, grad_den_o = 0, grad_num[D];
            for (int e = 0; e < half; ++e) grad_den_s -= g[e] * head.out[e];
            for (int e = half; e < D; ++e) grad_den_o -= g[e] * head.out[e];
            grad_den_s /= head.den_s;
            grad_den_o /= head.den_o;
            const T inv_s = 1 / head.den_s, inv_o = 1 / head.den_o;
            for (int e = 0; e < half; ++e) grad_num[e] = g[e] * inv_s;
            for (int e = half; e < D; ++e) grad_num[e] = g[e] * inv_o;
            // Each feature meets one row per stream: d F = g_num . W[row] + d den Z[row], and back into W, Z.
            T grad_fs[D], grad_fo[D];
            for (int c = 0; c < D; ++c) {
              const int rs = head.row_s[c], ro = head.row_o[c];
              const T fs = head.query.fs[c], fo = head.query.fo[c];
              const T* __restrict w_s = head.W[rs];
              const T* __restrict w_o = head.W[ro];
              T* __restrict gw_s = grad_W[rs];
              T* __restrict gw_o = grad_W[ro];
              T s = grad_den_s * head.Z[rs], o = grad_den_o * head.Z[ro];
              for (int e = 0; e < half; ++e) {
                s += grad_num[e] * w_s[e];
                gw_s[e] += fs * grad_num[e];
              }
              for (int e = half; e < D; ++e) {
                o += grad_num[e] * w_o[e];
                gw_o[e] += fo * grad_num[e];
              }
              grad_fs[c] = s;
              grad_fo[c] = o;
              grad_Z[rs] += fs * grad_den_s;
              grad_Z[ro] += fo * grad_den_o;
            }
            head.query.backward(grad_fs, grad_fo, gq_ptr + (r * samples + i) * dim + c0, slopes.same_pos.data() + c0,
                                slopes.same_neg.data() + c0, slopes.opp_pos.data() + c0, slopes.opp_neg.data() + c0);
          }
          // Keys: d v_j = sum_c K_jc dW[row_jc], d (K_jc vis_j) = v_j . dW[row_jc] + dZ[row_jc].
          for (int64_t j = 0; j < samples; ++j) {
            const T vis_j = vis ? vis[j] : T(1);
            const T* __restrict kj = kh + j * k.stride(1);
            const T* __restrict vj = vh + j * v.stride(1);
            T* __restrict gk = gk_ptr + (r * samples + j) * dim + c0;
            T* __restrict gv = gv_ptr + (r * samples + j) * dim + c0;
            T feature[D], grad_feature[D], acc[D] = {};
            int row[D];
            key_features<T, D>(kj, vis_j, feature, row);
            for (int c = 0; c < D; ++c) {
              const T* __restrict gw = grad_W[row[c]];
              T s = grad_Z[row[c]];
              for (int e = 0; e < D; ++e) {
                acc[e] += feature[c] * gw[e];
                s += vj[e] * gw[e];
              }
              grad_feature[c] = s;
            }
            for (int e = 0; e < D; ++e) gv[e] = acc[e];
            for (int c = 0; c < D; ++c) {
              const T x = kj[c];
              const T sign = (x > 0 ? T(1) : T(0)) - (x < 0 ? T(1) : T(0));
              // d(K vis)/dk = (K + 1) vis sign(k) below the clamp; feature = K vis.
              gk[c] = std::abs(x) <= clamp ? grad_feature[c] * (feature[c] + vis_j) * sign : T(0);
            }
          }
        }
      }
      slopes.write(grad_temp_same.data_ptr<T>() + block * heads * 2 * D,
                   grad_temp_opp.data_ptr<T>() + block * heads * 2 * D, heads, D);
    }
  });
}

void check_ray(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& temp_same,
               const at::Tensor& temp_opp, const c10::optional<at::Tensor>& visible, int64_t heads,
               bool allow_bf16 = false) {
  check_common(q, k, v, temp_same, temp_opp, allow_bf16);
  TORCH_CHECK(q.dim() == 3 && q.sizes() == k.sizes() && q.sizes() == v.sizes(), "ray attention: q, k, v [R, S, H * d]");
  TORCH_CHECK(heads > 0 && q.size(2) % heads == 0, "ray attention: channels divisible by heads");
  check_temperatures(temp_same, temp_opp, heads, q.size(2) / heads, "ray attention");
  check_visible(visible, q, q.size(0), q.size(1), "ray attention");
}

at::Tensor ray_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& temp_same,
                       const at::Tensor& temp_opp, const c10::optional<at::Tensor>& visible, int64_t heads) {
  check_ray(q, k, v, temp_same, temp_opp, visible, heads, /*allow_bf16=*/true);
  at::Tensor out = at::empty(q.sizes(), q.options());
  if (q.scalar_type() == at::kBFloat16) {
    dispatch_head_dim(q.size(2) / heads, [&](auto D) {
      constexpr int d = decltype(D)::value;
#if defined(__AVX2__) && defined(__FMA__)
      if constexpr (d % 8 == 0) {
        const ChannelTemperatures<float> temps(temp_same.data_ptr<float>(), temp_opp.data_ptr<float>(), heads, d);
        ray_forward_bf16_avx2<d>(q, k, v, temps, optional_data<c10::BFloat16>(visible), heads, out);
        return;
      }
#endif
      ray_forward_impl<c10::BFloat16, float, d>(q, k, v, temp_same, temp_opp, optional_data<c10::BFloat16>(visible),
                                                heads, out);
    });
    return out;
  }
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "ray_forward", [&] {
    dispatch_head_dim(q.size(2) / heads, [&](auto D) {
      ray_forward_impl<scalar_t, scalar_t, decltype(D)::value>(q, k, v, temp_same, temp_opp,
                                                               optional_data<scalar_t>(visible), heads, out);
    });
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> ray_backward(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& temp_same, const at::Tensor& temp_opp, const c10::optional<at::Tensor>& visible, int64_t heads) {
  check_ray(q, k, v, temp_same, temp_opp, visible, heads);
  TORCH_CHECK(grad_out.sizes() == q.sizes() && grad_out.scalar_type() == q.scalar_type(), "ray attention: grad_out");
  const at::Tensor g = grad_out.contiguous();
  at::Tensor grad_q = at::empty(q.sizes(), q.options());
  at::Tensor grad_k = at::empty(q.sizes(), q.options());
  at::Tensor grad_v = at::empty(q.sizes(), q.options());
  const int64_t blocks = blocks_of(q.size(0), kRaysPerBlock);
  at::Tensor grad_temp_same = at::empty({blocks, temp_same.size(0), temp_same.size(1)}, q.options());
  at::Tensor grad_temp_opp = at::empty_like(grad_temp_same);
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "ray_backward", [&] {
    dispatch_head_dim(q.size(2) / heads, [&](auto D) {
      ray_backward_impl<scalar_t, decltype(D)::value>(g, q, k, v, temp_same, temp_opp,
                                                      optional_data<scalar_t>(visible), heads, grad_q, grad_k, grad_v,
                                                      grad_temp_same, grad_temp_opp);
    });
  });
  return {grad_q, grad_k, grad_v, grad_temp_same, grad_temp_opp};
}

// ------------------------------------------------------------------------------------------------
// LePE of the ray attention: a depthwise convolution of the (masked) values along the samples of
// each ray, zero-padded, added to the attention output. Channels-last, so no transposes:
//   out[r, i, c] = residual[r, i, c] + bias[c] + sum_t weight[t, c] x[r, i + t - K/2, c] vis[r, i + t - K/2]
// (x outside [0, S) is 0). Backward: d x[j] = vis[j] sum_t weight[t] g[j - t + K/2]; d weight[t] and
// d bias are sums over rays and samples, per block of rays (added in block order by the caller).

// `In`: the storage type of x, visible, residual and out (T, or bf16 for inference); weight and bias in T,
// the sums in T (one row of T per thread, written out once).
template <typename In, typename T>
void samples_conv_forward_impl(const at::Tensor& x, const at::Tensor& weight, const T* bias, const In* vis_ptr,
                               const at::Tensor& residual, at::Tensor& out) {
  const int64_t rays = x.size(0), samples = x.size(1), channels = x.size(2), taps = weight.size(0), pad = taps / 2;
  const In* x_ptr = x.data_ptr<In>();
  const T* w_ptr = weight.data_ptr<T>();
  const In* res_ptr = residual.defined() ? residual.data_ptr<In>() : nullptr;
  In* out_ptr = out.data_ptr<In>();
  parallel_blocks(blocks_of(rays, kRaysPerBlock), [&](int64_t first, int64_t last) {
    std::vector<T> row(channels);
    T* __restrict o = row.data();
    for (int64_t r = first * kRaysPerBlock; r < std::min(rays, last * kRaysPerBlock); ++r) {
      const In* vis = vis_ptr ? vis_ptr + r * samples : nullptr;
      for (int64_t i = 0; i < samples; ++i) {
        const In* __restrict res = res_ptr ? res_ptr + r * residual.stride(0) + i * residual.stride(1) : nullptr;
        for (int64_t c = 0; c < channels; ++c) {
          o[c] = (res ? to_compute(res[c]) : T(0)) + (bias ? bias[c] : T(0));
        }
        for (int64_t t = 0; t < taps; ++t) {
          const int64_t j = i + t - pad;
          if (j < 0 || j >= samples) continue;
          const T m = vis ? to_compute(vis[j]) : T(1);
          const In* __restrict xj = x_ptr + r * x.stride(0) + j * x.stride(1);
          const T* __restrict w = w_ptr + t * channels;
          for (int64_t c = 0; c < channels; ++c) o[c] += w[c] * m * to_compute(xj[c]);
        }
        In* __restrict dst = out_ptr + (r * samples + i) * channels;
        for (int64_t c = 0; c < channels; ++c) dst[c] = static_cast<In>(o[c]);
      }
    }
  });
}

template <typename T>
void samples_conv_backward_impl(const at::Tensor& grad, const at::Tensor& x, const at::Tensor& weight,
                                const T* vis_ptr, at::Tensor& grad_x, at::Tensor& grad_weight, at::Tensor& grad_bias) {
  const int64_t rays = x.size(0), samples = x.size(1), channels = x.size(2), taps = weight.size(0), pad = taps / 2;
  const T* g_ptr = grad.data_ptr<T>();  // contiguous
  const T* x_ptr = x.data_ptr<T>();
  const T* w_ptr = weight.data_ptr<T>();
  T* gx_ptr = grad_x.data_ptr<T>();   // contiguous
  T* gw_ptr = grad_weight.data_ptr<T>();  // [blocks, taps, channels], zeroed
  T* gb_ptr = grad_bias.data_ptr<T>();    // [blocks, channels], zeroed
  parallel_blocks(blocks_of(rays, kRaysPerBlock), [&](int64_t first, int64_t last) {
    for (int64_t block = first; block < last; ++block) {
      T* __restrict gw_block = gw_ptr + block * taps * channels;
      T* __restrict gb = gb_ptr + block * channels;
      for (int64_t r = block * kRaysPerBlock; r < std::min(rays, (block + 1) * kRaysPerBlock); ++r) {
        const T* vis = vis_ptr ? vis_ptr + r * samples : nullptr;
        for (int64_t j = 0; j < samples; ++j) {
          const T m = vis ? vis[j] : T(1);
          const T* __restrict xj = x_ptr + r * x.stride(0) + j * x.stride(1);
          const T* __restrict gj = g_ptr + (r * samples + j) * channels;
          T* __restrict gx = gx_ptr + (r * samples + j) * channels;
          for (int64_t c = 0; c < channels; ++c) {
            gx[c] = 0;
            gb[c] += gj[c];
          }
          for (int64_t t = 0; t < taps; ++t) {
            const int64_t i = j - t + pad;  // the output sample that reads x[j] through tap t
            if (i < 0 || i >= samples) continue;
            const T* __restrict gi = g_ptr + (r * samples + i) * channels;
            const T* __restrict w = w_ptr + t * channels;
            T* __restrict gw = gw_block + t * channels;
            for (int64_t c = 0; c < channels; ++c) {
              gx[c] += w[c] * gi[c] * m;
              gw[c] += gi[c] * xj[c] * m;
            }
          }
        }
      }
    }
  });
}

// Forward also takes bf16 x (visible, residual) with float32 weight and bias, as the attention kernels.
void check_samples_conv(const at::Tensor& x, const at::Tensor& weight, const c10::optional<at::Tensor>& bias,
                        const c10::optional<at::Tensor>& visible, bool allow_bf16 = false) {
  const bool bf16 = allow_bf16 && x.scalar_type() == at::kBFloat16;
  TORCH_CHECK(x.device().is_cpu() && (bf16 || x.scalar_type() == at::kFloat || x.scalar_type() == at::kDouble),
              "samples_conv: float32 or float64 CPU tensors expected (bf16 in forward)");
  const auto weight_type = bf16 ? at::kFloat : x.scalar_type();
  TORCH_CHECK(x.dim() == 3 && x.stride(2) == 1, "samples_conv: x [R, S, C] with contiguous channels");
  TORCH_CHECK(weight.dim() == 2 && weight.size(1) == x.size(2) && weight.size(0) % 2 == 1 && weight.is_contiguous() &&
                  weight.scalar_type() == weight_type,
              "samples_conv: weight [K (odd), C], contiguous, in the dtype of x (float32 for bf16 x)");
  if (bias.has_value()) {
    TORCH_CHECK(bias->dim() == 1 && bias->size(0) == x.size(2) && bias->is_contiguous() &&
                    bias->scalar_type() == weight_type,
                "samples_conv: bias [C] in the dtype of the weight");
  }
  check_visible(visible, x, x.size(0), x.size(1), "samples_conv");
}

at::Tensor samples_conv_forward(const at::Tensor& x, const at::Tensor& weight, const c10::optional<at::Tensor>& bias,
                                const c10::optional<at::Tensor>& visible, const c10::optional<at::Tensor>& residual) {
  check_samples_conv(x, weight, bias, visible, /*allow_bf16=*/true);
  if (residual.has_value()) {
    TORCH_CHECK(residual->sizes() == x.sizes() && residual->stride(2) == 1 && residual->scalar_type() == x.scalar_type(),
                "samples_conv: residual like x");
  }
  at::Tensor out = at::empty(x.sizes(), x.options());
  const at::Tensor res = residual.has_value() ? *residual : at::Tensor();
  if (x.scalar_type() == at::kBFloat16) {
    samples_conv_forward_impl<c10::BFloat16, float>(x, weight, optional_data<float>(bias),
                                                    optional_data<c10::BFloat16>(visible), res, out);
    return out;
  }
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "samples_conv_forward", [&] {
    samples_conv_forward_impl<scalar_t, scalar_t>(x, weight, optional_data<scalar_t>(bias),
                                                  optional_data<scalar_t>(visible), res, out);
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> samples_conv_backward(const at::Tensor& grad, const at::Tensor& x,
                                                                     const at::Tensor& weight,
                                                                     const c10::optional<at::Tensor>& visible) {
  check_samples_conv(x, weight, c10::nullopt, visible);
  TORCH_CHECK(grad.sizes() == x.sizes() && grad.scalar_type() == x.scalar_type(), "samples_conv: grad like x");
  const at::Tensor g = grad.contiguous();
  at::Tensor grad_x = at::empty(x.sizes(), x.options());
  const int64_t blocks = blocks_of(x.size(0), kRaysPerBlock);
  at::Tensor grad_weight = at::zeros({blocks, weight.size(0), weight.size(1)}, x.options());
  at::Tensor grad_bias = at::zeros({blocks, weight.size(1)}, x.options());
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "samples_conv_backward", [&] {
    samples_conv_backward_impl<scalar_t>(g, x, weight, optional_data<scalar_t>(visible), grad_x, grad_weight,
                                         grad_bias);
  });
  return {grad_x, grad_weight, grad_bias};
}

}  // namespace

// Whether the bf16 forward kernels were compiled with their AVX2 forms (`view_forward_bf16_avx2`,
// `ray_forward_bf16_avx2`), for the tests.
bool avx2_forms() {
#if defined(__AVX2__) && defined(__FMA__)
  return true;
#else
  return false;
#endif
}

TORCH_LIBRARY(pola_gnt_cpu, m) {
  m.def("avx2_forms() -> bool");
  m.def("view_forward(Tensor q, Tensor k, Tensor v, Tensor temp_same, Tensor temp_opp, Tensor? visible) -> Tensor");
  m.def(
      "view_backward(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor temp_same, Tensor temp_opp, "
      "Tensor? visible) -> (Tensor, Tensor, Tensor, Tensor, Tensor)");
  m.def(
      "ray_forward(Tensor q, Tensor k, Tensor v, Tensor temp_same, Tensor temp_opp, Tensor? visible, int heads) "
      "-> Tensor");
  m.def(
      "ray_backward(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor temp_same, Tensor temp_opp, "
      "Tensor? visible, int heads) -> (Tensor, Tensor, Tensor, Tensor, Tensor)");
  m.def("samples_conv_forward(Tensor x, Tensor weight, Tensor? bias, Tensor? visible, Tensor? residual) -> Tensor");
  m.def("samples_conv_backward(Tensor grad, Tensor x, Tensor weight, Tensor? visible) -> (Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(pola_gnt_cpu, CompositeExplicitAutograd, m) { m.impl("avx2_forms", &avx2_forms); }

TORCH_LIBRARY_IMPL(pola_gnt_cpu, CPU, m) {
  m.impl("view_forward", &view_forward);
  m.impl("view_backward", &view_backward);
  m.impl("ray_forward", &ray_forward);
  m.impl("ray_backward", &ray_backward);
  m.impl("samples_conv_forward", &samples_conv_forward);
  m.impl("samples_conv_backward", &samples_conv_backward);
}
