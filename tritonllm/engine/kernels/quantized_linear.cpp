// Linear layers whose weights stay in GGUF's block formats: each row of the weight is cut into blocks of 32
// values along the input, and each block holds small integers with a float scale (and, for 4 bits, an offset):
//   8 bits (Q8_0): w = scale * q, q an int8;        stored [N, K] int8; a scale per 16 values instead (Q6_K's
//                  sub-blocks) where the scales are [N, K / 16]
//   4 bits (Q4_1): w = scale * q + min, q in 0..15; stored [N, K / 2] uint8, GGUF's nibble order (byte j of a
//                  block holds value j in its low half and value j + 16 in its high half); Q4_0 is the case
//                  min = -8 * scale
// Scales and mins are float32 [N, K / 32]. A decode step streams every weight from memory once, so a quarter
// (8 bits) or an eighth (4 bits) of float32's bytes is what makes it faster; each block is widened to float32
// in registers (scale * q + min, as gguf-py dequantizes) and multiplied by up to 8 input rows before the next
// block is read. Under 4 input rows (one sequence's decode) the widened integers meet the input unscaled and each
// block's sum is scaled once (AVX2: SmolLM2's Q4_1 layers 1.3x faster for one row than scaling every value).
// One input row reads several weight rows from separate parts of the weight at once (for_each_row_group): a
// decode step's weights come from DRAM, and one stream of rows left the cores waiting on memory.
// From 20 rows (AVX2), a chunk of weight rows is widened to float32 once and goes through dense_linear.cpp's tiles.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

#include <cstdint>
#include <type_traits>
#include <vector>

#include "linear_checks.h"
#include "panel_gemm.h"
#include "weight_rows.h"

namespace {

using weight_rows::BlockScale;
using weight_rows::block_scale;
using weight_rows::kBlock;

// The 32 values of block `b` of a weight row, widened and scaled, into out[0:32].
inline void dequantize_block(const uint8_t* row, int64_t bits, int64_t b, BlockScale scale, float min, float* out) {
  if (bits == 8) {
    const int8_t* q = reinterpret_cast<const int8_t*>(row) + b * kBlock;
    for (int64_t i = 0; i < kBlock; ++i) out[i] = (i < kBlock / 2 ? scale.low : scale.high) * q[i];
  } else {
    const uint8_t* q = row + b * kBlock / 2;
    for (int64_t i = 0; i < kBlock / 2; ++i) {
      out[i] = scale.low * (q[i] & 0x0F) + min;
      out[i + kBlock / 2] = scale.high * (q[i] >> 4) + min;
    }
  }
}

#if defined(__AVX512F__)
constexpr bool kTakesInputSums = false;  // the mins go into each widened block

// A block is two vectors of 16 floats: scale * q + min in one fused step (min is 0 for 8 bits). 4 bits take
// their values from a table of the 16 a block can hold, scale * i + min for i = 0..15 (the same fused step, so the
// same bits), looked up by each nibble (vpermps reads an index's low 4 bits): one fused step a block instead of
// one a value, and no integers converted to floats: one sequence's Q4_1 decode waits on this arithmetic, not on
// memory.
inline void load_block(const uint8_t* row, int64_t bits, int64_t b, BlockScale scale, float min, __m512 w[2]) {
  if (bits == 8) {
    const __m512 low = _mm512_set1_ps(scale.low), high = _mm512_set1_ps(scale.high), zero = _mm512_setzero_ps();
    const __m128i* q = reinterpret_cast<const __m128i*>(row + b * kBlock);
    w[0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(q))), low, zero);
    w[1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(q + 1))), high, zero);
  } else {
    const __m512 values = _mm512_fmadd_ps(_mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                          _mm512_set1_ps(scale.low), _mm512_set1_ps(min));
    const __m512i bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + b * kBlock / 2)));
    w[0] = _mm512_permutexvar_ps(bytes, values);
    w[1] = _mm512_permutexvar_ps(_mm512_srli_epi32(bytes, 4), values);
  }
}

// out[m, n] for ROWS input rows and one weight row: the block is widened once and used by every input row.
// Under 4 rows, each row sums into 2 accumulators, one per half block, so that consecutive FMAs do not all
// wait for each other's results; from 4 rows up the rows themselves are independent enough.
template <int ROWS>
void rows_times_weight_row(const float* x, int64_t x_stride, const uint8_t* row, const float* scales,
                           int64_t per_block, const float* mins, int64_t bits, int64_t blocks, float* out,
                           int64_t out_stride) {
  constexpr int kSplit = ROWS >= 4 ? 1 : 2;
  __m512 acc[ROWS][kSplit];
  for (int r = 0; r < ROWS; ++r)
    for (int j = 0; j < kSplit; ++j) acc[r][j] = _mm512_setzero_ps();
  __m512 w[2];
  for (int64_t b = 0; b < blocks; ++b) {
    load_block(row, bits, b, block_scale(scales, per_block, b), mins ? mins[b] : 0.f, w);
    for (int r = 0; r < ROWS; ++r) {
      const float* xb = x + r * x_stride + b * kBlock;
      acc[r][0] = _mm512_fmadd_ps(w[0], _mm512_loadu_ps(xb), acc[r][0]);
      acc[r][1 % kSplit] = _mm512_fmadd_ps(w[1], _mm512_loadu_ps(xb + 16), acc[r][1 % kSplit]);
    }
  }
  for (int r = 0; r < ROWS; ++r) {
    if (kSplit > 1) acc[r][0] = _mm512_add_ps(acc[r][0], acc[r][kSplit - 1]);
    out[r * out_stride] = _mm512_reduce_add_ps(acc[r][0]);
  }
}

// Few rows take the same path as many here (without the input's block sums).
template <int ROWS>
void few_rows_times_weight_row(const float* x, int64_t x_stride, const float*, const uint8_t* row,
                               const float* scales, int64_t per_block, const float* mins, int64_t bits, int64_t blocks,
                               float* out, int64_t out_stride) {
  rows_times_weight_row<ROWS>(x, x_stride, row, scales, per_block, mins, bits, blocks, out, out_stride);
}

// One input row against COLS weight rows ns[0..COLS) (weight_rows::for_each_row_group's), each output summed exactly
// as rows_times_weight_row<1> sums it. 4-bit rows 4 at a time: their blocks come with 3 streams each (values,
// scales, mins), and more than 12 streams at once outrun what the prefetchers follow.
constexpr int kStreams = 8;
constexpr int kStreams4Bit = 4;
template <int BITS, int COLS>
void row_times_weight_rows(const float* x, const float*, const weight_rows::BlockWeight& weight, const int64_t* ns,
                           float* out, int64_t out_first) {
  __m512 acc[COLS][2];
  weight_rows::BlockWeight::Row rows[COLS];
  for (int c = 0; c < COLS; ++c) {
    acc[c][0] = acc[c][1] = _mm512_setzero_ps();
    rows[c] = weight.row(ns[c]);
  }
  const int64_t per_block = BITS == 4 ? 1 : weight.scales_per_block;  // 4-bit blocks: one scale and one min
  for (int64_t b = 0; b < weight.blocks; ++b) {
    const __m512 low = _mm512_loadu_ps(x + b * kBlock), high = _mm512_loadu_ps(x + b * kBlock + 16);
    for (int c = 0; c < COLS; ++c) {
      __m512 w[2];
      load_block(rows[c].bytes, BITS, b, block_scale(rows[c].scales, per_block, b), BITS == 4 ? rows[c].mins[b] : 0.f,
                 w);
      acc[c][0] = _mm512_fmadd_ps(w[0], low, acc[c][0]);
      acc[c][1] = _mm512_fmadd_ps(w[1], high, acc[c][1]);
    }
  }
  for (int c = 0; c < COLS; ++c) out[ns[c] - out_first] = _mm512_reduce_add_ps(_mm512_add_ps(acc[c][0], acc[c][1]));
}

// A whole weight row widened to float32 [blocks * 32].
inline void widen_row(const uint8_t* row, int64_t bits, int64_t blocks, const float* scales, int64_t per_block,
                      const float* mins, float* out) {
  __m512 w[2];
  for (int64_t b = 0; b < blocks; ++b) {
    load_block(row, bits, b, block_scale(scales, per_block, b), mins ? mins[b] : 0.f, w);
    _mm512_storeu_ps(out + b * kBlock, w[0]);
    _mm512_storeu_ps(out + b * kBlock + 16, w[1]);
  }
}

#elif defined(__AVX2__) && defined(__FMA__)
constexpr bool kTakesInputSums = true;  // 4-bit rows' mins against the input's block sums

using weight_rows::partial_dot;
using weight_rows::sum_lanes;

// Block b's 32 integers as floats, values 8i .. 8i + 7 in q[i], unscaled. The widening loads read the bytes
// straight from memory, and a 4-bit byte's high half needs only a shift once it sits alone in 32 bits.
inline void block_integers(const uint8_t* row, int64_t bits, int64_t b, __m256 q[4]) {
  if (bits == 8) {
    const uint8_t* p = row + b * kBlock;
    for (int i = 0; i < 4; ++i)
      q[i] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 8 * i))));
  } else {
    const uint8_t* p = row + b * kBlock / 2;
    const __m256i first = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    const __m256i second = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 8)));
    const __m256i low = _mm256_set1_epi32(0x0F);
    q[0] = _mm256_cvtepi32_ps(_mm256_and_si256(first, low));
    q[1] = _mm256_cvtepi32_ps(_mm256_and_si256(second, low));
    q[2] = _mm256_cvtepi32_ps(_mm256_srli_epi32(first, 4));
    q[3] = _mm256_cvtepi32_ps(_mm256_srli_epi32(second, 4));
  }
}

// Block b of a row as four vectors of 8 floats, values 8i .. 8i + 7 in w[i]: scale * q (+ min for 4 bits, in
// one fused step).
inline void load_block(const uint8_t* row, int64_t bits, int64_t b, BlockScale scale, float min, __m256 w[4]) {
  block_integers(row, bits, b, w);
  const __m256 m = _mm256_set1_ps(min);
  for (int i = 0; i < 4; ++i) {
    const __m256 s = _mm256_set1_ps(i < 2 ? scale.low : scale.high);
    w[i] = bits == 8 ? _mm256_mul_ps(w[i], s) : _mm256_fmadd_ps(w[i], s, m);
  }
}

// out[m, n] for ROWS input rows and one weight row, ROWS >= 4: the block is widened and scaled once and used by
// every input row.
template <int ROWS>
void rows_times_weight_row(const float* x, int64_t x_stride, const uint8_t* row, const float* scales,
                           int64_t per_block, const float* mins, int64_t bits, int64_t blocks, float* out,
                           int64_t out_stride) {
  __m256 acc[ROWS];
  for (int r = 0; r < ROWS; ++r) acc[r] = _mm256_setzero_ps();
  __m256 w[4];
  for (int64_t b = 0; b < blocks; ++b) {
    load_block(row, bits, b, block_scale(scales, per_block, b), mins ? mins[b] : 0.f, w);
    for (int r = 0; r < ROWS; ++r) {
      const float* xb = x + r * x_stride + b * kBlock;
      for (int i = 0; i < 4; ++i) acc[r] = _mm256_fmadd_ps(w[i], _mm256_loadu_ps(xb + 8 * i), acc[r]);
    }
  }
  for (int r = 0; r < ROWS; ++r) out[r * out_stride] = sum_lanes(acc[r]);
}

// acc + scale * (x_b . q_b): block b's unscaled integers q against its 32 input values xb, in two short chains
// rather than one long one, so that more blocks are in flight; with a scale per 16 values, each half's products
// scaled apart.
inline __m256 add_scaled_block(const __m256 q[4], const float* xb, BlockScale scale, bool halves, __m256 acc) {
  if (halves) {
    const __m256 first = _mm256_fmadd_ps(q[1], _mm256_loadu_ps(xb + 8), _mm256_mul_ps(q[0], _mm256_loadu_ps(xb)));
    const __m256 second =
        _mm256_fmadd_ps(q[3], _mm256_loadu_ps(xb + 24), _mm256_mul_ps(q[2], _mm256_loadu_ps(xb + 16)));
    return _mm256_fmadd_ps(_mm256_set1_ps(scale.high), second, _mm256_fmadd_ps(_mm256_set1_ps(scale.low), first, acc));
  }
  __m256 even = _mm256_mul_ps(q[0], _mm256_loadu_ps(xb));
  __m256 odd = _mm256_mul_ps(q[1], _mm256_loadu_ps(xb + 8));
  even = _mm256_fmadd_ps(q[2], _mm256_loadu_ps(xb + 16), even);
  odd = _mm256_fmadd_ps(q[3], _mm256_loadu_ps(xb + 24), odd);
  return _mm256_fmadd_ps(_mm256_set1_ps(scale.low), _mm256_add_ps(even, odd), acc);
}

// out[m, n] for ROWS < 4 input rows and one weight row, the scale and min taken out of each block's sum:
// x . w = sum over blocks of scale * (x_b . q_b) + min * sum(x_b). With few input rows the widening is not shared
// enough to pay for scaling every value; this way a block costs one multiply-add per row for its scale, and the
// mins one short dot product with the input's block sums (x_sums [ROWS, blocks]) at the end. The terms are
// summed in another order than dequantize-then-multiply, as any kernel's are: the difference is float32 rounding.
// (Taking several weight rows at once was no faster: more streams from memory for the prefetcher to follow.)
template <int ROWS>
void few_rows_times_weight_row(const float* x, int64_t x_stride, const float* x_sums, const uint8_t* row,
                               const float* scales, int64_t per_block, const float* mins, int64_t bits, int64_t blocks,
                               float* out, int64_t out_stride) {
  __m256 acc[ROWS];
  for (int r = 0; r < ROWS; ++r) acc[r] = _mm256_setzero_ps();
  __m256 q[4];
  for (int64_t b = 0; b < blocks; ++b) {
    block_integers(row, bits, b, q);
    const BlockScale scale = block_scale(scales, per_block, b);
    for (int r = 0; r < ROWS; ++r)
      acc[r] = add_scaled_block(q, x + r * x_stride + b * kBlock, scale, per_block > 1, acc[r]);
  }
  for (int r = 0; r < ROWS; ++r) {
    const __m256 total = mins ? _mm256_add_ps(acc[r], partial_dot(mins, x_sums + r * blocks, blocks)) : acc[r];
    out[r * out_stride] = sum_lanes(total);
  }
}

// One input row against COLS weight rows ns[0..COLS) (for_each_row_group's), each output summed exactly as
// few_rows_times_weight_row<1> sums it (x_sums: the input's block sums).
constexpr int kStreams = 4;  // AVX2's 16 registers hold 4 rows' sums beside a block's integers and the input
constexpr int kStreams4Bit = kStreams;
template <int BITS, int COLS>
void row_times_weight_rows(const float* x, const float* x_sums, const weight_rows::BlockWeight& weight,
                           const int64_t* ns, float* out, int64_t out_first) {
  __m256 acc[COLS];
  weight_rows::BlockWeight::Row rows[COLS];
  for (int c = 0; c < COLS; ++c) {
    acc[c] = _mm256_setzero_ps();
    rows[c] = weight.row(ns[c]);
  }
  const int64_t per_block = BITS == 4 ? 1 : weight.scales_per_block;  // 4-bit blocks: one scale and one min
  __m256 q[4];
  for (int64_t b = 0; b < weight.blocks; ++b) {
    const float* xb = x + b * kBlock;
    for (int c = 0; c < COLS; ++c) {
      block_integers(rows[c].bytes, BITS, b, q);
      const BlockScale scale = block_scale(rows[c].scales, per_block, b);
      acc[c] = add_scaled_block(q, xb, scale, per_block > 1, acc[c]);
    }
  }
  for (int c = 0; c < COLS; ++c) {
    const __m256 total = BITS == 4 ? _mm256_add_ps(acc[c], partial_dot(rows[c].mins, x_sums, weight.blocks)) : acc[c];
    out[ns[c] - out_first] = sum_lanes(total);
  }
}

// A whole weight row widened to float32 [blocks * 32].
inline void widen_row(const uint8_t* row, int64_t bits, int64_t blocks, const float* scales, int64_t per_block,
                      const float* mins, float* out) {
  __m256 w[4];
  for (int64_t b = 0; b < blocks; ++b) {
    load_block(row, bits, b, block_scale(scales, per_block, b), mins ? mins[b] : 0.f, w);
    for (int i = 0; i < 4; ++i) _mm256_storeu_ps(out + b * kBlock + 8 * i, w[i]);
  }
}

#else
constexpr bool kTakesInputSums = false;  // the mins go into each dequantized block

template <int ROWS>
void rows_times_weight_row(const float* x, int64_t x_stride, const uint8_t* row, const float* scales,
                           int64_t per_block, const float* mins, int64_t bits, int64_t blocks, float* out,
                           int64_t out_stride) {
  float w[kBlock];
  float acc[ROWS] = {};
  for (int64_t b = 0; b < blocks; ++b) {
    dequantize_block(row, bits, b, block_scale(scales, per_block, b), mins ? mins[b] : 0.f, w);
    for (int r = 0; r < ROWS; ++r)
      for (int64_t i = 0; i < kBlock; ++i) acc[r] += w[i] * x[r * x_stride + b * kBlock + i];
  }
  for (int r = 0; r < ROWS; ++r) out[r * out_stride] = acc[r];
}

// Few rows take the same path as many here (without the input's block sums).
template <int ROWS>
void few_rows_times_weight_row(const float* x, int64_t x_stride, const float*, const uint8_t* row,
                               const float* scales, int64_t per_block, const float* mins, int64_t bits, int64_t blocks,
                               float* out, int64_t out_stride) {
  rows_times_weight_row<ROWS>(x, x_stride, row, scales, per_block, mins, bits, blocks, out, out_stride);
}

#endif

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#define ROW_STREAMS  // one input row reads kStreams weight rows at once (row_times_weight_rows)
// From this many input rows up, a chunk of weight rows is widened to float32 once and multiplied by every input
// row in the float32 tiles (dense_linear.cpp), which do more per cycle than widening block by block per 8 rows;
// the two paths tie at about 16 rows on AVX-512 (bench/results/log.md).
#define WIDEN_CHUNKS
constexpr int64_t kWidenRows = 20;
#endif

}  // namespace

void dense_rows_times_weight_rows(const float* x, int64_t rows, const float* w, int64_t n, int64_t k, float* out,
                                  int64_t out_stride);

// out[m * out_stride + n - first] = x[m] . W[n] for m < rows and the weight's rows first <= n < last: a chunk of
// quantized_linear, or one unit of decoder_layers.cpp's phases. Every output is summed the same way whatever the
// chunk it falls in.
void quantized_unit(const float* x, int64_t rows, const weight_rows::BlockWeight& weight, int64_t first, int64_t last,
                    float* out, int64_t out_stride) {
  const int64_t blocks = weight.blocks, in_features = weight.in_features, per_block = weight.scales_per_block;
  const int64_t bits = weight.bits;
#ifdef WIDEN_CHUNKS
  if (rows >= kWidenRows) {
    constexpr int64_t kWidened = 16;  // weight rows widened at a time: they stay in the cache for every input row
    thread_local std::vector<float> widened;
    widened.resize(kWidened * in_features);
    for (int64_t begin = first; begin < last; begin += kWidened) {
      const int64_t end = std::min(last, begin + kWidened);
      for (int64_t n = begin; n < end; ++n) {
        const weight_rows::BlockWeight::Row w = weight.row(n);
        widen_row(w.bytes, bits, blocks, w.scales, per_block, w.mins, widened.data() + (n - begin) * in_features);
      }
      dense_rows_times_weight_rows(x, rows, widened.data(), end - begin, in_features, out + begin - first, out_stride);
    }
    return;
  }
#endif
  // The few-row path takes the last rows % 4 input rows; their block sums serve its mins for every weight row.
  const int64_t few_first = rows - rows % 4;
  thread_local std::vector<float> few_sums;
  few_sums.resize(bits == 4 && kTakesInputSums ? (rows - few_first) * blocks : 0);
  const float* few_x = x + few_first * in_features;
  for (size_t i = 0; i < few_sums.size(); ++i) {
    float sum = 0.f;
    for (int64_t j = 0; j < kBlock; ++j) sum += few_x[i * kBlock + j];
    few_sums[i] = sum;
  }
#ifdef ROW_STREAMS
  if (rows == 1) {  // one sequence's decode: kStreams weight rows at once, from as many parts of the chunk
    // bits as a template argument: nothing about the format is decided per block
    const auto rows_of = [&](auto bits_constant) {
      constexpr int kBits = decltype(bits_constant)::value;
      weight_rows::row_groups<kBits == 4 ? kStreams4Bit : kStreams>(first, last, [&](auto cols, const int64_t* ns) {
        row_times_weight_rows<kBits, cols()>(x, few_sums.data(), weight, ns, out, first);
      });
    };
    if (bits == 4)
      rows_of(std::integral_constant<int, 4>{});
    else
      rows_of(std::integral_constant<int, 8>{});
    return;
  }
#endif
  for (int64_t n = first; n < last; ++n) {
    const weight_rows::BlockWeight::Row w = weight.row(n);
    float* column = out + n - first;
    int64_t m = 0;
    for (; m + 8 <= rows; m += 8)
      rows_times_weight_row<8>(x + m * in_features, in_features, w.bytes, w.scales, per_block, w.mins, bits, blocks,
                               column + m * out_stride, out_stride);
    for (; m + 4 <= rows; m += 4)
      rows_times_weight_row<4>(x + m * in_features, in_features, w.bytes, w.scales, per_block, w.mins, bits, blocks,
                               column + m * out_stride, out_stride);
    float* few_out = column + few_first * out_stride;
    if (rows - m == 3)
      few_rows_times_weight_row<3>(few_x, in_features, few_sums.data(), w.bytes, w.scales, per_block, w.mins, bits,
                                   blocks, few_out, out_stride);
    else if (rows - m == 2)
      few_rows_times_weight_row<2>(few_x, in_features, few_sums.data(), w.bytes, w.scales, per_block, w.mins, bits,
                                   blocks, few_out, out_stride);
    else if (rows - m == 1)
      few_rows_times_weight_row<1>(few_x, in_features, few_sums.data(), w.bytes, w.scales, per_block, w.mins, bits,
                                   blocks, few_out, out_stride);
  }
}

// x: [M, K] float32, contiguous. Returns x @ W^T, [M, N].
torch::Tensor quantized_linear(torch::Tensor x, torch::Tensor qweight, torch::Tensor scales, torch::Tensor mins,
                               int64_t bits) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat32 && x.is_contiguous(), "x: contiguous [M, K] float32");
  const int64_t rows = x.size(0), out_features = qweight.size(0);
  const weight_rows::BlockWeight weight(qweight, scales, mins, bits, x.size(1));
  auto out = torch::empty({rows, out_features}, x.options());
  const float* xp = x.data_ptr<float>();
  float* op = out.data_ptr<float>();
  weight_rows::for_each_chunk(weight, [&](int64_t first, int64_t last) {
    quantized_unit(xp, rows, weight, first, last, op + first, out_features);
  });
  return out;
}

// x @ W^T + bias for prompt-sized inputs: panel_gemm.cpp's GEMM, each panel's weight rows widened as it takes
// them, so no float32 copy of the whole weight is written (it was, every prompt step, before this).
torch::Tensor quantized_panel_linear(torch::Tensor x, torch::Tensor qweight, torch::Tensor scales, torch::Tensor mins,
                                     int64_t bits, torch::Tensor bias) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat32 && x.is_contiguous(), "x: contiguous [M, K] float32");
  const int64_t rows = x.size(0), k = x.size(1), n = qweight.size(0);
  const weight_rows::BlockWeight weight(qweight, scales, mins, bits, k);
  check_bias(bias, n);
  auto out = torch::empty({rows, n}, x.options());
  panel_gemm(x.data_ptr<float>(), rows, k, n, bias.numel() ? bias.data_ptr<float>() : nullptr, out.data_ptr<float>(),
             [&](int64_t first, int64_t count, float* scratch) {
               for (int64_t j = 0; j < count; ++j) {
                 const weight_rows::BlockWeight::Row w = weight.row(first + j);
#ifdef WIDEN_CHUNKS
                 widen_row(w.bytes, bits, weight.blocks, w.scales, weight.scales_per_block, w.mins, scratch + j * k);
#else
                 for (int64_t b = 0; b < weight.blocks; ++b)
                   dequantize_block(w.bytes, bits, b, block_scale(w.scales, weight.scales_per_block, b),
                                    w.mins ? w.mins[b] : 0.f, scratch + j * k + b * kBlock);
#endif
               }
               return scratch;
             });
  return out;
}

// The weight as float32 [N, K].
torch::Tensor dequantize(torch::Tensor qweight, torch::Tensor scales, torch::Tensor mins, int64_t bits) {
  const weight_rows::BlockWeight weight(qweight, scales, mins, bits, qweight.size(1) * 8 / bits);
  const int64_t in_features = weight.in_features;
  auto out = torch::empty({weight.out_features, in_features}, scales.options());
  float* op = out.data_ptr<float>();
  weight_rows::for_each_row(weight, [&](int64_t n, const weight_rows::BlockWeight::Row& w) {
    for (int64_t b = 0; b < weight.blocks; ++b)
      dequantize_block(w.bytes, bits, b, block_scale(w.scales, weight.scales_per_block, b), w.mins ? w.mins[b] : 0.f,
                       op + n * in_features + b * kBlock);
  });
  return out;
}
