// x @ W^T for many rows of x (a prompt's chunk) and a float32 weight W [N, K]: there each weight value is used by
// hundreds of rows, so arithmetic bounds the work, not memory (dense_linear.cpp's decode tiles are the other case).
//
// Built as BLIS builds its GEMM: a thread copies a panel of P = kPanelVecs * kLanes weight rows transposed into a
// buffer of its own ([K][P], which stays in its L2), then runs an outer-product tile over each group of kTileRows
// input rows: per input value one broadcast and kPanelVecs FMAs into kTileRows x kPanelVecs accumulators, no
// horizontal sums. The copy is made inside the call, so there is no second copy of the weights; in a 2048-token
// prefill it took 3% of the kernel's time (perf). On SmolLM2's matrices one after another (2-core AMD EPYC Zen 4)
// MKL's SGEMM, which takes its AVX2 code path there whatever the CPU offers, reached 107-115 GFLOPS at 96-128 rows
// and 167-188 at 512-2048; this kernel 171-180 and 208-209, of the 234 that the cores' FMAs allow.
//
// Each output is summed the same way wherever it falls (runs of kSumRun products in one FMA chain each, the runs
// added in order, then the bias): its bits do not depend on the number of rows, the tile, the thread or what else
// is in the batch.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "linear_checks.h"
#include "panel_gemm.h"
#include "weight_rows.h"

#pragma GCC push_options
#pragma GCC target("tune=generic")  // as dense_linear.cpp's tiles (its comment says why)
#include "float_vec.h"
namespace {

using float_vec::fma;
using float_vec::kLanes;
using float_vec::load;
using float_vec::Vec;
using float_vec::zero;
#if defined(__AVX512F__)
constexpr int kTileRows = 8, kPanelVecs = 3;  // 24 accumulators, 3 weight vectors and a broadcast of 32 registers
#else
constexpr int kTileRows = 6, kPanelVecs = 2;  // 12 + 2 + 1 of AVX2's 16 (BLIS's Haswell kernel)
#endif
constexpr int64_t kPanel = kPanelVecs * kLanes;
constexpr int64_t kLeastRowsPerItem = 256;  // fewer, and copying the panel costs more than a few percent
constexpr int64_t kMostRowsPerItem = 512;
constexpr int64_t kSumRun = 128;  // 64: 4% slower; 128 costs 1-3% against one chain over k

// out[r, 0:kPanel) = x[r] . panel[:, 0:kPanel) + bias for r < ROWS: panel [k][kPanel], x rows k apart. The
// products are summed in runs of kSumRun in the registers, each run's sums then added to the output's: one chain
// over all of k erred 2-4x more than MKL's SGEMM (float64 reference, k = 576-4096); in runs, a little less.
template <int ROWS>
inline void tile(const float* x, int64_t k, const float* panel, const float* bias, float* out, int64_t out_stride) {
  int64_t start = 0;
  do {  // once at least: with k = 0 the output is the bias
    const int64_t end = std::min(k, start + kSumRun);
    Vec acc[ROWS][kPanelVecs];
    for (int r = 0; r < ROWS; ++r)
      for (int c = 0; c < kPanelVecs; ++c) acc[r][c] = zero();
    for (int64_t i = start; i < end; ++i) {
      Vec w[kPanelVecs];
      for (int c = 0; c < kPanelVecs; ++c) w[c] = load(panel + i * kPanel + c * kLanes);
      for (int r = 0; r < ROWS; ++r) {
        const Vec xv = float_vec::set1(x[r * k + i]);
        for (int c = 0; c < kPanelVecs; ++c) acc[r][c] = fma(w[c], xv, acc[r][c]);
      }
    }
    for (int r = 0; r < ROWS; ++r)
      for (int c = 0; c < kPanelVecs; ++c) {
        float* o = out + r * out_stride + c * kLanes;
        Vec sum = start ? float_vec::add(load(o), acc[r][c]) : acc[r][c];
        if (end == k) sum = float_vec::add(sum, load(bias + c * kLanes));
        float_vec::store(o, sum);
      }
    start = end;
  } while (start < k);
}

// panel[i][j] = w[j][i] for j < cols (the panel's weight rows), 0 for cols <= j < kPanel; bias likewise.
void copy_panel(const float* w, int64_t cols, int64_t k, const float* bias, float* panel, float* panel_bias) {
  int64_t j = 0;
  for (; j + 8 <= cols; j += 8) {  // 8 x 8 blocks transposed in registers
    int64_t i = 0;
    for (; i + 8 <= k; i += 8) {
      __m256 r[8], t[8];
      for (int a = 0; a < 8; ++a) r[a] = _mm256_loadu_ps(w + (j + a) * k + i);
      for (int a = 0; a < 8; a += 2) {
        t[a] = _mm256_unpacklo_ps(r[a], r[a + 1]);
        t[a + 1] = _mm256_unpackhi_ps(r[a], r[a + 1]);
      }
      for (int a = 0; a < 8; a += 4)
        for (int b = 0; b < 2; ++b) {
          r[a + b] = _mm256_shuffle_ps(t[a + b], t[a + b + 2], _MM_SHUFFLE(1, 0, 1, 0));
          r[a + b + 2] = _mm256_shuffle_ps(t[a + b], t[a + b + 2], _MM_SHUFFLE(3, 2, 3, 2));
        }
      // r[0], r[2], r[1], r[3] hold columns 0-3 of rows 0-3 (low halves) and columns 4-7 (high halves);
      // r[4..7] the same of rows 4-7: each column of the block is two such halves.
      const int order[8] = {0, 2, 1, 3};
      for (int c = 0; c < 4; ++c) {
        const __m256 lo = r[order[c]], hi = r[order[c] + 4];
        _mm256_storeu_ps(panel + (i + c) * kPanel + j, _mm256_permute2f128_ps(lo, hi, 0x20));
        _mm256_storeu_ps(panel + (i + c + 4) * kPanel + j, _mm256_permute2f128_ps(lo, hi, 0x31));
      }
    }
    for (; i < k; ++i)
      for (int a = 0; a < 8; ++a) panel[i * kPanel + j + a] = w[(j + a) * k + i];
  }
  for (; j < kPanel; ++j)
    for (int64_t i = 0; i < k; ++i) panel[i * kPanel + j] = j < cols ? w[j * k + i] : 0.f;
  for (j = 0; j < kPanel; ++j) panel_bias[j] = bias && j < cols ? bias[j] : 0.f;
}

}  // namespace
#pragma GCC pop_options

void panel_gemm(const float* x, int64_t rows, int64_t k, int64_t n, const float* bias, float* out,
                const WeightRows& weight_rows) {
  // Work items: a block of rows by a panel, the panels of a block in turn, so that the block's rows (a few MB at
  // most) stay in the cache while the threads go over the panels; each item copies its panel. Row blocks of
  // kMostRowsPerItem at most (2048 rows in one block: 170 GFLOPS, in blocks of 512: 177, in the same bench on Zen 4),
  // and more blocks, down to kLeastRowsPerItem rows, where there are too few panels to keep the threads busy.
  const int64_t panels = (n + kPanel - 1) / kPanel, threads = at::get_num_threads();
  const int64_t blocks = std::max({int64_t{1}, (rows + kMostRowsPerItem - 1) / kMostRowsPerItem,
                                   std::min((4 * threads + panels - 1) / panels, rows / kLeastRowsPerItem)});
  const int64_t block_rows = (rows + blocks - 1) / blocks;
  weight_rows::guided_chunks(panels * blocks, 1, INT64_MAX, [&](int64_t first, int64_t last) {
    // The panel on a cache line's start (a vector load across two lines costs two), then its bias; then room for
    // weight_rows to widen a panel's rows into.
    constexpr int64_t kLine = 64 / sizeof(float);
    thread_local std::vector<float> copy;
    copy.resize(2 * k * kPanel + kPanel + kLine);
    float* panel = copy.data() + (-reinterpret_cast<uintptr_t>(copy.data()) / sizeof(float) & (kLine - 1));
    float* panel_bias = panel + k * kPanel;
    float* scratch = panel_bias + kPanel;
    alignas(64) float partial[kTileRows * kPanel];  // the last panel's tiles, where fewer than kPanel columns are left
    for (int64_t item = first; item < last; ++item) {
      const int64_t n0 = item % panels * kPanel, cols = std::min(kPanel, n - n0);
      copy_panel(weight_rows(n0, cols, scratch), cols, k, bias ? bias + n0 : nullptr, panel, panel_bias);
      const int64_t r0 = item / panels * block_rows, r1 = std::min(rows, r0 + block_rows);
      for (int64_t m = r0; m < r1; m += kTileRows) {
        float_vec::with_rows<kTileRows>(std::min<int64_t>(kTileRows, r1 - m), [&](auto tile_rows) {
          if (cols == kPanel) return tile<tile_rows()>(x + m * k, k, panel, panel_bias, out + m * n + n0, n);
          tile<tile_rows()>(x + m * k, k, panel, panel_bias, partial, kPanel);
          for (int r = 0; r < tile_rows(); ++r) std::copy_n(partial + r * kPanel, cols, out + (m + r) * n + n0);
        });
      }
    }
  });
}

// x: [M, K] float32, contiguous; weight: [N, K] float32, contiguous; bias: [N] or empty. Returns [M, N].
torch::Tensor panel_linear(torch::Tensor x, torch::Tensor weight, torch::Tensor bias) {
  check_float_linear(x, weight, bias);
  const int64_t rows = x.size(0), k = x.size(1), n = weight.size(0);
  auto out = torch::empty({rows, n}, x.options());
  const float* wp = weight.data_ptr<float>();
  panel_gemm(x.data_ptr<float>(), rows, k, n, bias.numel() ? bias.data_ptr<float>() : nullptr, out.data_ptr<float>(),
             [&](int64_t first, int64_t, float*) { return wp + first * k; });
  return out;
}
