// x @ W^T for rows of x and a bfloat16 copy of a weight W [N, K]: what engine/decoding/greedy_screen.py reads instead of a
// float32 output layer to find which tokens can still be a greedy step's argmax. Two ways, by what the CPU has:
// - x in float32: each bfloat16 weight value widens to float32 exactly (its 16 bits become the float's high half)
//   and the products are summed in float32. Half the bytes of float32, as much arithmetic: it pays where one
//   sequence's decode waits on memory.
// - x rounded to bfloat16 too, where the CPU multiplies bfloat16 pairs (AVX512_BF16: Intel since Cooper Lake,
//   AMD since Zen 4): vdpbf16ps adds 32 exact products into 16 float32 sums an instruction, twice a float32 FMA's
//   work on Zen 4 (as much on an Intel Xeon that issues one a cycle) and nothing to widen, so it pays at 32 rows
//   too, where the layer's arithmetic sets the pace. The weight is packed for it once (pack_bfloat16_pairs,
//   bfloat16_pairs.h): panels of kPairPanel rows, each value pair (2i, 2i + 1) of the panel's rows side by side,
//   so that a tile multiplies a broadcast input pair by 16 rows' pairs a vector and sums outer products into
//   kPairTileRows x kPairPanel sums, with no horizontal sums (reading the rows as they lie, a tile of 6 inputs by
//   4 rows spends a third of its time summing across lanes at SmolLM2's K of 576). Where AMX's tiles serve, they read the same packed
//   copy (bfloat16_tiles.cpp).
// The screen bounds both roundings, the weight's and the input's, and float32 sums of K products in any order.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "bfloat16_pairs.h"
#include "float_vec.h"
#include "weight_rows.h"

namespace {

using float_vec::kLanes;
using float_vec::Vec;

constexpr int kStreams = 8;  // weight rows one input row reads side by side (weight_rows::for_each_row_group)
constexpr int kPanelVecs = kPairPanel / 16;  // 16 float32 sums a vector

inline float widen(uint16_t v) {
  const uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

#if defined(__AVX512F__)
constexpr int kWidenTileRows = 4;  // 16 of 32 registers hold sums
inline Vec widened(const uint16_t* p) {
  const __m256i halves = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(halves), 16));
}
#else
constexpr int kWidenTileRows = 2;  // 8 of AVX2's 16
inline Vec widened(const uint16_t* p) {
  const __m128i halves = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(halves), 16));
}
#endif

// out[r, ns[c]] for ROWS float32 input rows and COLS weight rows ns[0..COLS), each weight value widened: each
// weight vector is loaded once and used by every row. Each output is summed the same way in every tile (lane by
// lane, then sum_lanes, then the tail), so a row's result does not depend on the other rows of its step.
template <int ROWS, int COLS>
void widen_tile(const float* x, const uint16_t* w, int64_t k, const int64_t* ns, float* out, int64_t out_stride) {
  const int64_t done = k / kLanes * kLanes;
  Vec acc[ROWS][COLS];
  for (int r = 0; r < ROWS; ++r)
    for (int c = 0; c < COLS; ++c) acc[r][c] = float_vec::zero();
  for (int64_t i = 0; i < done; i += kLanes) {
    Vec wv[COLS];
    for (int c = 0; c < COLS; ++c) wv[c] = widened(w + ns[c] * k + i);
    for (int r = 0; r < ROWS; ++r) {
      const Vec xv = float_vec::load(x + r * k + i);
      for (int c = 0; c < COLS; ++c) acc[r][c] = float_vec::fma(wv[c], xv, acc[r][c]);
    }
  }
#if defined(__AVX512F__)
  if constexpr (COLS == 4) {
    if (done == k) {  // the same bits with a third of sum_lanes' shuffles
      for (int r = 0; r < ROWS; ++r) {
        float sums[4];
        float_vec::store_sums_of_4(acc[r], sums);
        for (int c = 0; c < COLS; ++c) out[r * out_stride + ns[c]] = sums[c];
      }
      return;
    }
  }
#endif
  for (int r = 0; r < ROWS; ++r)
    for (int c = 0; c < COLS; ++c) {
      float s = float_vec::sum_lanes(acc[r][c]);
      for (int64_t i = done; i < k; ++i) s += widen(w[ns[c] * k + i]) * x[r * k + i];
      out[r * out_stride + ns[c]] = s;
    }
}

#if defined(__AVX512BF16__)
constexpr int kPairTileRows = 8;  // 8 x 3 sums, 3 weight vectors and a broadcast pair of 32 registers

// out[r, 0:kPairPanel) = x[r] . the panel's rows for r < ROWS: x rows as `pairs` bfloat16 pairs (uint32), the panel
// [pairs][kPairPanel][2]. Each output is one chain of vdpbf16ps over its pairs in order, whatever the tile.
template <int ROWS>
void pair_tile(const uint32_t* x, int64_t pairs, const uint16_t* panel, float* out, int64_t out_stride) {
  __m512 acc[ROWS][kPanelVecs];
  for (int r = 0; r < ROWS; ++r)
    for (int c = 0; c < kPanelVecs; ++c) acc[r][c] = _mm512_setzero_ps();
  for (int64_t i = 0; i < pairs; ++i) {
    __m512bh w[kPanelVecs];
    for (int c = 0; c < kPanelVecs; ++c)
      w[c] = reinterpret_cast<__m512bh>(_mm512_loadu_si512(panel + (i * kPairPanel + c * 16) * 2));
    for (int r = 0; r < ROWS; ++r) {
      const __m512bh xv = reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(x[r * pairs + i])));
      for (int c = 0; c < kPanelVecs; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], w[c], xv);
    }
  }
  for (int r = 0; r < ROWS; ++r)
    for (int c = 0; c < kPanelVecs; ++c) _mm512_storeu_ps(out + r * out_stride + c * 16, acc[r][c]);
}
#endif

}  // namespace

bool bfloat16_dot_available() {
#if defined(__AVX512BF16__)
  return true;
#else
  return false;
#endif
}

// out [rows, n] = x @ w^T for x [rows, k] float32 and w [n, k] bfloat16.
void bfloat16_products(const float* x, int64_t rows, const uint16_t* w, int64_t n, int64_t k, float* out) {
  const auto kernel = [&](auto cols, const int64_t* ns) {
    float_vec::even_tiles<kWidenTileRows>(rows, [&](auto tile_rows, int64_t first) {
      widen_tile<tile_rows(), cols()>(x + first * k, w, k, ns, out + first * n, n);
    });
  };
  // One sequence: as many weight rows side by side as keep the memory busy. More: a tile's sums, kWidenTileRows x 4.
  if (rows == 1)
    weight_rows::for_each_row_group<kStreams>(n, weight_rows::kSmallestChunk, kernel);
  else
    weight_rows::for_each_row_group<4>(n, weight_rows::kSmallestChunk, kernel);
}

void bfloat16_pair_products(const uint16_t* x, int64_t rows, const uint16_t* packed, int64_t n, int64_t pairs,
                            float* out, bool tiles) {
  if (tiles && bfloat16_tiles_serve(pairs))
    return bfloat16_tile_products(x, rows, packed, n, pairs, out);
#if defined(__AVX512BF16__)
  const uint32_t* xp = reinterpret_cast<const uint32_t*>(x);
  const int64_t panels = (n + kPairPanel - 1) / kPairPanel;
  weight_rows::guided_chunks(panels, 1, INT64_MAX, [&](int64_t first, int64_t last) {
    alignas(64) float partial[kPairTileRows * kPairPanel];  // the last panel's tiles, where it holds fewer rows
    for (int64_t p = first; p < last; ++p) {
      const uint16_t* panel = packed + p * pairs * kPairPanel * 2;
      const int64_t n0 = p * kPairPanel, cols = std::min(kPairPanel, n - n0);
      float_vec::even_tiles<kPairTileRows>(rows, [&](auto tile_rows, int64_t m) {
        if (cols == kPairPanel) return pair_tile<tile_rows()>(xp + m * pairs, pairs, panel, out + m * n + n0, n);
        pair_tile<tile_rows()>(xp + m * pairs, pairs, panel, partial, kPairPanel);
        for (int r = 0; r < tile_rows(); ++r) std::copy_n(partial + r * kPairPanel, cols, out + (m + r) * n + n0);
      });
    }
  });
#else
  (void)x, (void)rows, (void)packed, (void)n, (void)pairs, (void)out, (void)tiles;
  TORCH_CHECK(false, "this CPU does not multiply bfloat16 pairs");
#endif
}

// x: [M, K] float32; weight: [N, K] bfloat16. Returns x @ weight^T, [M, N] float32.
torch::Tensor bfloat16_linear(torch::Tensor x, torch::Tensor weight) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.scalar_type() == torch::kFloat32, "x: contiguous [M, K] float32");
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == torch::kBFloat16 && weight.is_contiguous() &&
                  weight.size(1) == x.size(1),
              "weight: contiguous [N, K] bfloat16");
  const int64_t rows = x.size(0), k = x.size(1), n = weight.size(0);
  auto out = torch::empty({rows, n}, x.options());
  bfloat16_products(x.data_ptr<float>(), rows, reinterpret_cast<const uint16_t*>(weight.data_ptr<at::BFloat16>()), n,
                    k, out.data_ptr<float>());
  return out;
}

// weight [N, K] bfloat16 -> [panels, ceil(K / 2), kPairPanel, 2] bfloat16: panel p holds rows p * kPairPanel ..., value
// pair i of its row j at [p, i, j]; rows past N and an odd K's last pair padded with zeros.
torch::Tensor pack_bfloat16_pairs(torch::Tensor weight) {
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == torch::kBFloat16 && weight.is_contiguous(),
              "weight: contiguous [N, K] bfloat16");
  const int64_t n = weight.size(0), k = weight.size(1), pairs = (k + 1) / 2, panels = (n + kPairPanel - 1) / kPairPanel;
  auto packed = torch::zeros({panels, pairs, kPairPanel, 2}, weight.options());
  const uint16_t* w = reinterpret_cast<const uint16_t*>(weight.data_ptr<at::BFloat16>());
  uint16_t* out = reinterpret_cast<uint16_t*>(packed.data_ptr<at::BFloat16>());
  at::parallel_for(0, panels, 1, [&](int64_t first, int64_t last) {
    for (int64_t p = first; p < last; ++p)
      for (int64_t j = 0; j < std::min(kPairPanel, n - p * kPairPanel); ++j)
        for (int64_t i = 0; i < k; ++i)
          out[((p * pairs + i / 2) * kPairPanel + j) * 2 + i % 2] = w[(p * kPairPanel + j) * k + i];
  });
  return packed;
}

void check_bfloat16_pairs(const torch::Tensor& packed, int64_t n, int64_t k) {
  TORCH_CHECK(packed.dim() == 4 && packed.scalar_type() == torch::kBFloat16 && packed.is_contiguous() &&
                  packed.size(2) == kPairPanel && packed.size(3) == 2 && packed.size(1) == (k + 1) / 2 && n >= 0 &&
                  packed.size(0) == (n + kPairPanel - 1) / kPairPanel,
              "packed: pack_bfloat16_pairs of an [n, K] weight");
}

// x: [M, K] bfloat16; packed: pack_bfloat16_pairs of a weight [n, K]. Returns x @ weight^T, [M, n] float32, where
// bfloat16_dot_available(); through AMX's tiles where `tiles` and they serve (bfloat16_pair_products).
torch::Tensor bfloat16_pair_linear(torch::Tensor x, torch::Tensor packed, int64_t n, bool tiles) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kBFloat16, "x: [M, K] bfloat16");
  check_bfloat16_pairs(packed, n, x.size(1));
  torch::Tensor padded = x.contiguous();
  if (x.size(1) % 2) padded = torch::constant_pad_nd(padded, {0, 1});
  auto out = torch::empty({x.size(0), n}, x.options().dtype(torch::kFloat32));
  bfloat16_pair_products(reinterpret_cast<const uint16_t*>(padded.data_ptr<at::BFloat16>()), x.size(0),
                         reinterpret_cast<const uint16_t*>(packed.data_ptr<at::BFloat16>()), n, packed.size(1),
                         out.data_ptr<float>(), tiles);
  return out;
}
