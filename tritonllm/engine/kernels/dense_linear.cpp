// x @ W^T for a few rows of x and a float32 weight W [N, K], as a decode step multiplies them: the step streams
// every weight from memory once, so the kernel's one job is to read W at the memory's full speed and use each
// value loaded for every input row. BLAS libraries are tuned for large GEMMs and dispatch by CPU vendor (MKL's
// GEMV for one row reaches half of OpenBLAS's speed on AMD EPYC); this kernel is the same code on every x86
// with AVX2 and FMA (AVX-512 where the machine has it).
//
// A tile is ROWS input rows by COLS weight rows: ROWS * COLS accumulators, each weight vector loaded once and
// used ROWS times, each input vector loaded once and used COLS times. Threads take chunks of weight rows from a
// shared counter, in guided chunks (weight_rows.h), so one that the OS preempts does not hold up the rest.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "linear_checks.h"
#include "weight_rows.h"

// These tiles are tuned for GCC's generic x86-64 target, whatever -march=native picks: GCC 12's znver3 tuning
// schedules the multi-row tiles worse on Zen 3 (bench/results/log.md). The instruction sets stay -march=native's
// (AVX-512 where the machine has it).
#pragma GCC push_options
#pragma GCC target("tune=generic")
#include "float_vec.h"  // here, so that its helpers take this tuning and inline into the tiles
namespace {

using float_vec::fma;
using float_vec::kLanes;
using float_vec::load;
using float_vec::sum_lanes;
using float_vec::Vec;
using float_vec::zero;
#if defined(__AVX512F__)
using float_vec::store_sums_of_4;
constexpr int kTileRows = 6;  // input rows of a multi-row tile beside 4 weight rows (24 of 32 registers)
#else
constexpr int kTileRows = 3;  // 12 of 16 registers
#endif

// out[r, c] = x[r] . w[c] for r < ROWS, c < COLS (strides in floats), with the `lines` cache lines from `prefetch`
// on asked into L2 along the way, a few each step of the loop.
template <int ROWS, int COLS>
inline void tile(const float* x, int64_t x_stride, const float* w, int64_t k, float* out, int64_t out_stride,
                 const char* prefetch, int64_t lines) {
  Vec acc[ROWS][COLS];
  for (int r = 0; r < ROWS; ++r)
    for (int c = 0; c < COLS; ++c) acc[r][c] = zero();
  const int64_t lines_a_step = (lines * kLanes + k - 1) / std::max<int64_t>(k, 1);
  int64_t i = 0;
  for (; i + kLanes <= k; i += kLanes) {
    for (int64_t l = 0; l < lines_a_step && lines > 0; ++l, --lines, prefetch += 64) _mm_prefetch(prefetch, _MM_HINT_T1);
    Vec xv[ROWS];
    for (int r = 0; r < ROWS; ++r) xv[r] = load(x + r * x_stride + i);
    for (int c = 0; c < COLS; ++c) {
      const Vec wv = load(w + c * k + i);
      for (int r = 0; r < ROWS; ++r) acc[r][c] = fma(wv, xv[r], acc[r][c]);
    }
  }
#if defined(__AVX512F__)
  if constexpr (COLS == 4) {
    if (i == k) {
      for (int r = 0; r < ROWS; ++r) store_sums_of_4(acc[r], out + r * out_stride);
      return;
    }
  }
#endif
  for (int r = 0; r < ROWS; ++r)
    for (int c = 0; c < COLS; ++c) {
      float s = sum_lanes(acc[r][c]);
      for (int64_t j = i; j < k; ++j) s += x[r * x_stride + j] * w[c * k + j];
      out[r * out_stride + c] = s;
    }
}

// One input row against COLS weight rows ns[0..COLS) of w [*, k]: out[ns[c]] = x . w[ns[c]], summed as tile<1, COLS>
// sums it.
template <int COLS>
inline void row_times_rows(const float* x, const float* w, int64_t k, const int64_t* ns, float* out) {
  Vec acc[COLS];
  const float* rows[COLS];
  for (int c = 0; c < COLS; ++c) {
    acc[c] = zero();
    rows[c] = w + ns[c] * k;
  }
  int64_t i = 0;
  for (; i + kLanes <= k; i += kLanes) {
    const Vec xv = load(x + i);
    for (int c = 0; c < COLS; ++c) acc[c] = fma(load(rows[c] + i), xv, acc[c]);
  }
  for (int c = 0; c < COLS; ++c) {
    float s = sum_lanes(acc[c]);
    for (int64_t j = i; j < k; ++j) s += x[j] * rows[c][j];
    out[ns[c]] = s;
  }
}

// Every input row against weight rows [n, n + COLS), in tiles of as many rows as the registers hold beside COLS
// weight rows: 6 x 4 accumulators of AVX-512's 32 registers (3 x 4 of AVX2's 16), the rows spread evenly over the
// tiles. Each output is summed the same way whatever tile it falls in.
template <int COLS>
inline void rows_times(const float* x, int64_t rows, const float* w, int64_t k, float* out, int64_t n_total) {
  constexpr int kRows = COLS == 4 ? kTileRows : 8;
  // The next COLS weight rows, into L2 a share during each tile: with many input rows per weight row the
  // hardware's prefetcher falls behind, and each group's first loads would wait on DRAM, compute and memory time
  // adding up instead of overlapping. Spread over the tile's loop, not asked all at once before it: a burst fills
  // the core's line fill buffers and stalls it until they drain (bench/results/log.md).
  // Past the chunk's end they are the next chunk's rows, or beyond the weight: a prefetch never faults.
  const char* next = reinterpret_cast<const char*>(w + COLS * k);
  const int64_t lines = COLS * k * 4 / 64, tiles = (rows + kRows - 1) / kRows;
  const int64_t per_tile = (lines + tiles - 1) / tiles;
  int64_t line = 0;
  float_vec::even_tiles<kRows>(rows, [&](auto tile_rows, int64_t first) {
    const int64_t count = std::min(per_tile, lines - line);
    tile<tile_rows(), COLS>(x + first * k, k, w, k, out + first * n_total, n_total, next + line * 64, count);
    line += count;
  });
}

}  // namespace
#pragma GCC pop_options

// out[m, j] = x[m] . w[j] for m < rows, j < n: the tiles above over n weight rows (w [n, k], out rows out_stride
// apart). The block kernel (quantized_linear.cpp) widens a chunk of 4-bit rows to float32 and hands it here.
void dense_rows_times_weight_rows(const float* x, int64_t rows, const float* w, int64_t n, int64_t k, float* out,
                                  int64_t out_stride) {
  int64_t j = 0;
  for (; j + 4 <= n; j += 4) rows_times<4>(x, rows, w + j * k, k, out + j, out_stride);
  for (; j < n; ++j) rows_times<1>(x, rows, w + j * k, k, out + j, out_stride);
}

// out[m * out_stride + j] = x[m] . w[j] for m < rows, j < n (w [n, k]): a chunk of dense_linear, or one unit of
// decoder_layers.cpp's phases. One row reads 8 weight rows at once, from 8 parts of the n, so that 8 streams come
// from DRAM side by side (weight_rows::for_each_row_group); float32 gains less from it than the blocks, 8
// neighbouring float32 rows already spanning 18 KB. More rows: 4 weight rows a tile, each reused by every input row of the tile.
void dense_unit(const float* x, int64_t rows, const float* w, int64_t n, int64_t k, float* out, int64_t out_stride) {
  if (rows > 1) return dense_rows_times_weight_rows(x, rows, w, n, k, out, out_stride);
  weight_rows::row_groups<8>(0, n, [&](auto cols, const int64_t* ns) { row_times_rows<cols()>(x, w, k, ns, out); });
}

// x: [M, K] float32, contiguous; weight: [N, K] float32, contiguous; bias: [N] or empty. Returns [M, N].
torch::Tensor dense_linear(torch::Tensor x, torch::Tensor weight, torch::Tensor bias) {
  check_float_linear(x, weight, bias);
  const int64_t rows = x.size(0), k = x.size(1), n_total = weight.size(0);
  auto out = torch::empty({rows, n_total}, x.options());
  const float* xp = x.data_ptr<float>();
  const float* wp = weight.data_ptr<float>();
  const float* bp = bias.numel() ? bias.data_ptr<float>() : nullptr;
  float* op = out.data_ptr<float>();
  constexpr int64_t kChunk = 32;  // the fewest weight rows a thread takes at a time
  weight_rows::guided_chunks(n_total, kChunk, INT64_MAX, [&](int64_t first, int64_t end) {
    dense_unit(xp, rows, wp + first * k, end - first, k, op + first, n_total);
    if (bp)
      for (int64_t m = 0; m < rows; ++m)
        for (int64_t j = first; j < end; ++j) op[m * n_total + j] += bp[j];
  });
  return out;
}
