// x @ W^T for a few rows of x (float32) and a bfloat16 copy of a weight W [N, K]: what engine/greedy_screen.py
// reads instead of a float32 output layer to find which tokens can still be a greedy step's argmax. Each bfloat16
// value widens to float32 exactly (its 16 bits become the float's high half) and the products are summed in
// float32, so the only difference from the float32 weight's logits is the weight's rounding, which the screen
// bounds. Half the bytes of float32: one sequence's decode reads the output layer from memory at its full speed.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

#include <cstdint>
#include <cstring>

#include "weight_rows.h"

namespace {

constexpr int64_t kMaxRows = 8;  // input rows a call takes: decode steps of a few sequences
constexpr int kStreams = 8;      // weight rows one input row reads side by side (weight_rows::for_each_row_group)

inline float widen(uint16_t v) {
  const uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

#if defined(__AVX512F__)
using Vec = __m512;
constexpr int64_t kLanes = 16;
inline Vec widen_vec(const uint16_t* p) {
  const __m256i halves = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(halves), 16));
}
inline Vec load(const float* p) { return _mm512_loadu_ps(p); }
inline Vec zero() { return _mm512_setzero_ps(); }
inline Vec fma(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
inline float sum_lanes(Vec v) { return _mm512_reduce_add_ps(v); }
#elif defined(__AVX2__) && defined(__FMA__)
using Vec = __m256;
constexpr int64_t kLanes = 8;
inline Vec widen_vec(const uint16_t* p) {
  const __m128i halves = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(halves), 16));
}
inline Vec load(const float* p) { return _mm256_loadu_ps(p); }
inline Vec zero() { return _mm256_setzero_ps(); }
inline Vec fma(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
using weight_rows::sum_lanes;
#endif

#if defined(__AVX512F__)
constexpr int kTileRows = 4;  // input rows of a tile beside 4 weight rows: 16 of 32 registers hold sums
#else
constexpr int kTileRows = 2;  // 8 of AVX2's 16
#endif

// out[r, ns[c]] for ROWS input rows and COLS weight rows ns[0..COLS): each weight vector is widened once and used
// by every row. Each output is summed the same way in every tile (lane by lane, then sum_lanes, then the tail), so
// a row's logits do not depend on the other rows of its step.
template <int ROWS, int COLS>
void tile(const float* x, const uint16_t* w, int64_t k, const int64_t* ns, float* out, int64_t out_stride) {
  int64_t done = 0;
#if defined(__AVX2__) && defined(__FMA__)
  done = k / kLanes * kLanes;
  Vec acc[ROWS][COLS];
  for (int r = 0; r < ROWS; ++r)
    for (int c = 0; c < COLS; ++c) acc[r][c] = zero();
  for (int64_t i = 0; i < done; i += kLanes) {
    Vec wv[COLS];
    for (int c = 0; c < COLS; ++c) wv[c] = widen_vec(w + ns[c] * k + i);
    for (int r = 0; r < ROWS; ++r) {
      const Vec xv = load(x + r * k + i);
      for (int c = 0; c < COLS; ++c) acc[r][c] = fma(wv[c], xv, acc[r][c]);
    }
  }
  for (int r = 0; r < ROWS; ++r)
    for (int c = 0; c < COLS; ++c) out[r * out_stride + ns[c]] = sum_lanes(acc[r][c]);
#else
  for (int r = 0; r < ROWS; ++r)
    for (int c = 0; c < COLS; ++c) out[r * out_stride + ns[c]] = 0.f;
#endif
  for (int r = 0; r < ROWS; ++r)
    for (int c = 0; c < COLS; ++c) {
      float rest = 0.f;
      for (int64_t i = done; i < k; ++i) rest += widen(w[ns[c] * k + i]) * x[r * k + i];
      out[r * out_stride + ns[c]] += rest;
    }
}

// Every input row against COLS weight rows, in tiles of kTileRows rows and then one at a time.
template <int COLS>
void rows_times_weight_rows(const float* x, int64_t rows, const uint16_t* w, int64_t k, const int64_t* ns, float* out,
                            int64_t out_stride) {
  int64_t r = 0;
  for (; r + kTileRows <= rows; r += kTileRows)
    tile<kTileRows, COLS>(x + r * k, w, k, ns, out + r * out_stride, out_stride);
  for (; r < rows; ++r) tile<1, COLS>(x + r * k, w, k, ns, out + r * out_stride, out_stride);
}

}  // namespace

// x: [M, K] float32, M <= 8; weight: [N, K] bfloat16. Returns x @ weight^T, [M, N] float32.
torch::Tensor bfloat16_linear(torch::Tensor x, torch::Tensor weight) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat32 && x.is_contiguous(), "x: contiguous [M, K] float32");
  TORCH_CHECK(x.size(0) <= kMaxRows, "bfloat16_linear takes at most 8 input rows");
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == torch::kBFloat16 && weight.is_contiguous() &&
                  weight.size(1) == x.size(1),
              "weight: contiguous [N, K] bfloat16");
  const int64_t rows = x.size(0), k = x.size(1), n = weight.size(0);
  auto out = torch::empty({rows, n}, x.options());
  const float* xp = x.data_ptr<float>();
  const uint16_t* wp = reinterpret_cast<const uint16_t*>(weight.data_ptr<at::BFloat16>());
  float* op = out.data_ptr<float>();
  const auto kernel = [&](auto cols, const int64_t* ns) {
    rows_times_weight_rows<cols()>(xp, rows, wp, k, ns, op, n);
  };
  if (rows == 1)  // one sequence: as many weight rows side by side as keep the memory busy
    weight_rows::for_each_row_group<kStreams>(n, weight_rows::kSmallestChunk, kernel);
  else  // a tile's sums: kTileRows x 4
    weight_rows::for_each_row_group<4>(n, weight_rows::kSmallestChunk, kernel);
  return out;
}
