// x @ W^T for rows of x and a bfloat16 copy of a weight W [N, K]: what engine/greedy_screen.py reads instead of a
// float32 output layer to find which tokens can still be a greedy step's argmax. Two ways, by what the CPU has:
// - x in float32: each bfloat16 weight value widens to float32 exactly (its 16 bits become the float's high half)
//   and the products are summed in float32. Half the bytes of float32, as much arithmetic: it pays where one
//   sequence's decode waits on memory.
// - x rounded to bfloat16 too, where the CPU multiplies bfloat16 pairs (AVX512_BF16: Intel since Cooper Lake,
//   AMD since Zen 4): vdpbf16ps adds 32 exact products into 16 float32 sums an instruction, twice a float32 FMA's
//   work and nothing to widen, so it pays at 32 rows too, where the layer's arithmetic sets the pace.
// The screen bounds both roundings, the weight's and the input's.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <cstdint>
#include <cstring>

#include "float_vec.h"
#include "weight_rows.h"

namespace {

using float_vec::kLanes;
using float_vec::Vec;

constexpr int kStreams = 8;  // weight rows one input row reads side by side (weight_rows::for_each_row_group)

inline float widen(uint16_t v) {
  const uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// x float32, the weight widened.
struct Widen {
  using Input = float;
  using Weight = Vec;
  using Operand = Vec;
  static constexpr int64_t kStep = kLanes;
#if defined(__AVX512F__)
  static constexpr int kTileRows = 4;  // 16 of 32 registers hold sums
  static Weight weight(const uint16_t* p) {
    const __m256i halves = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(halves), 16));
  }
#else
  static constexpr int kTileRows = 2;  // 8 of AVX2's 16
  static Weight weight(const uint16_t* p) {
    const __m128i halves = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(halves), 16));
  }
#endif
  static Operand input(const float* p) { return float_vec::load(p); }
  static Vec madd(Vec acc, Weight w, Operand x) { return float_vec::fma(w, x, acc); }
  static float value(float x) { return x; }
};

#if defined(__AVX512BF16__)
// x bfloat16, pairs of products summed by vdpbf16ps.
struct Dot {
  using Input = uint16_t;
  using Weight = __m512bh;
  using Operand = __m512bh;
  static constexpr int64_t kStep = 32;
  static constexpr int kTileRows = 6;  // 24 of 32 registers hold sums, as dense_linear's float32 tiles
  static Weight weight(const uint16_t* p) { return reinterpret_cast<__m512bh>(_mm512_loadu_si512(p)); }
  static Operand input(const uint16_t* p) { return reinterpret_cast<__m512bh>(_mm512_loadu_si512(p)); }
  static Vec madd(Vec acc, Weight w, Operand x) { return _mm512_dpbf16_ps(acc, w, x); }
  static float value(uint16_t x) { return widen(x); }
};
#endif

// out[r, ns[c]] for ROWS input rows and COLS weight rows ns[0..COLS): each weight vector is loaded once and used by
// every row. Each output is summed the same way in every tile (lane by lane, then sum_lanes, then the tail), so a
// row's result does not depend on the other rows of its step.
template <typename Ops, int ROWS, int COLS>
void tile(const typename Ops::Input* x, const uint16_t* w, int64_t k, const int64_t* ns, float* out,
          int64_t out_stride) {
  const int64_t done = k / Ops::kStep * Ops::kStep;
  Vec acc[ROWS][COLS];
  for (int r = 0; r < ROWS; ++r)
    for (int c = 0; c < COLS; ++c) acc[r][c] = float_vec::zero();
  for (int64_t i = 0; i < done; i += Ops::kStep) {
    typename Ops::Weight wv[COLS];
    for (int c = 0; c < COLS; ++c) wv[c] = Ops::weight(w + ns[c] * k + i);
    for (int r = 0; r < ROWS; ++r) {
      const typename Ops::Operand xv = Ops::input(x + r * k + i);
      for (int c = 0; c < COLS; ++c) acc[r][c] = Ops::madd(acc[r][c], wv[c], xv);
    }
  }
#if defined(__AVX512F__)
  if constexpr (COLS == 4) {
    if (done == k) {  // the same bits with a third of sum_lanes' shuffles: at 32 rows the sums took a third
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
      for (int64_t i = done; i < k; ++i) s += widen(w[ns[c] * k + i]) * Ops::value(x[r * k + i]);
      out[r * out_stride + ns[c]] = s;
    }
}

template <typename Ops>
void linear(const typename Ops::Input* x, int64_t rows, const uint16_t* w, int64_t n, int64_t k, float* out) {
  const auto kernel = [&](auto cols, const int64_t* ns) {
    float_vec::even_tiles<Ops::kTileRows>(rows, [&](auto tile_rows, int64_t first) {
      tile<Ops, tile_rows(), cols()>(x + first * k, w, k, ns, out + first * n, n);
    });
  };
  // One sequence: as many weight rows side by side as keep the memory busy. More: a tile's sums, kTileRows x 4.
  // (Prefetching the next 4 weight rows into L2, as dense_linear's tiles do, changed nothing here at 8 to 64
  // rows on an AMD EPYC Zen 4.)
  if (rows == 1)
    weight_rows::for_each_row_group<kStreams>(n, weight_rows::kSmallestChunk, kernel);
  else
    weight_rows::for_each_row_group<4>(n, weight_rows::kSmallestChunk, kernel);
}

}  // namespace

bool bfloat16_dot_available() {
#if defined(__AVX512BF16__)
  return true;
#else
  return false;
#endif
}

// out [rows, n] = x @ w^T for w [n, k] in bfloat16: x [rows, k] float32 (x_rounded null), or x_rounded, its
// bfloat16 values, where bfloat16_dot_available().
void bfloat16_products(const float* x, const uint16_t* x_rounded, int64_t rows, const uint16_t* w, int64_t n,
                       int64_t k, float* out) {
#if defined(__AVX512BF16__)
  if (x_rounded) return linear<Dot>(x_rounded, rows, w, n, k, out);
#endif
  TORCH_CHECK(!x_rounded, "this CPU does not multiply bfloat16 pairs");
  linear<Widen>(x, rows, w, n, k, out);
}

// x: [M, K] float32, or bfloat16 where bfloat16_dot_available(); weight: [N, K] bfloat16. Returns x @ weight^T,
// [M, N] float32.
torch::Tensor bfloat16_linear(torch::Tensor x, torch::Tensor weight) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous(), "x: contiguous [M, K]");
  TORCH_CHECK(x.scalar_type() == torch::kFloat32 || (x.scalar_type() == torch::kBFloat16 && bfloat16_dot_available()),
              "x: float32 (bfloat16 only where the CPU multiplies bfloat16 pairs)");
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == torch::kBFloat16 && weight.is_contiguous() &&
                  weight.size(1) == x.size(1),
              "weight: contiguous [N, K] bfloat16");
  const int64_t rows = x.size(0), k = x.size(1), n = weight.size(0);
  auto out = torch::empty({rows, n}, x.options().dtype(torch::kFloat32));
  const uint16_t* wp = reinterpret_cast<const uint16_t*>(weight.data_ptr<at::BFloat16>());
  float* op = out.data_ptr<float>();
  if (x.scalar_type() == torch::kFloat32)
    bfloat16_products(x.data_ptr<float>(), nullptr, rows, wp, n, k, op);
  else
    bfloat16_products(nullptr, reinterpret_cast<const uint16_t*>(x.data_ptr<at::BFloat16>()), rows, wp, n, k, op);
  return out;
}
