// Linear layers over GGUF blocks (quantized_linear.cpp's layout) with the input rounded to 8 bits too, as
// llama.cpp computes them: each 32-value block of an input row becomes 32 int8 values q' and a scale d'
// (max |x| / 127, rounded to nearest), and a block's product is one of integers:
//   x_b . w_b = d' * scale * (q' . q) + d' * sum(q') * min
// AVX2 multiplies 32 byte pairs per instruction (maddubs), where float32 takes four multiply-adds and a widening
// of every weight. Faster, and not exact: the input's rounding changes the logits by more than float32's, so
// greedy output can differ from transformers'. Served only when asked for (the engine setting int8_activations).
#include <torch/extension.h>
#include <ATen/Parallel.h>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

#include <cmath>
#include <cstdint>
#include <vector>

#include "quantized_linear_int8.h"
#include "weight_rows.h"

namespace {

#if defined(__AVX2__) && defined(__FMA__)
using weight_rows::partial_dot;
using weight_rows::sum_lanes;
#endif

using weight_rows::kBlock;

// One block of 32 floats to int8 (round to nearest even); returns the sum of the values, sets the scale.
inline int32_t quantize_block(const float* x, int8_t* q, float* scale) {
#if defined(__AVX2__) && defined(__FMA__)
  const __m256 sign = _mm256_set1_ps(-0.f);
  __m256 v[4], amax = _mm256_setzero_ps();
  for (int i = 0; i < 4; ++i) {
    v[i] = _mm256_loadu_ps(x + 8 * i);
    amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[i]));
  }
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  const float d = _mm_cvtss_f32(m) / 127.f;
  *scale = d;
  const __m256 inverse = _mm256_set1_ps(d != 0.f ? 1.f / d : 0.f);
  __m256i n[4];
  constexpr int kNearest = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  for (int i = 0; i < 4; ++i) n[i] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v[i], inverse), kNearest));
  const __m256i sum32 = _mm256_add_epi32(_mm256_add_epi32(n[0], n[1]), _mm256_add_epi32(n[2], n[3]));
  // pack 32 int32 to 32 int8; the packs work within 128-bit lanes, the permute puts the values back in order
  const __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(n[0], n[1]), _mm256_packs_epi32(n[2], n[3]));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q),
                      _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(sum32), _mm256_extracti128_si256(sum32, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
#else
  float amax = 0.f;
  for (int64_t i = 0; i < kBlock; ++i) amax = std::max(amax, std::fabs(x[i]));
  const float d = amax / 127.f, inverse = d != 0.f ? 1.f / d : 0.f;
  *scale = d;
  int32_t sum = 0;
  for (int64_t i = 0; i < kBlock; ++i) {
    q[i] = static_cast<int8_t>(std::nearbyint(x[i] * inverse));
    sum += q[i];
  }
  return sum;
#endif
}

#if defined(__AVX2__) && defined(__FMA__)

// acc[r] += the products of input rows first_row + r with block b of a weight row.
template <int ROWS>
inline void add_block(const Int8Rows& x, int64_t first_row, int64_t blocks, const uint8_t* row, const float* scales,
                      int64_t bits, int64_t b, __m256* acc) {
  __m256i w, signs;
  if (bits == 4) {
    const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + b * kBlock / 2));
    const __m128i low = _mm_set1_epi8(0x0F);
    w = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(packed, 4), low), _mm_and_si128(packed, low));
  } else {
    signs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + b * kBlock));
    w = _mm256_sign_epi8(signs, signs);
  }
  const float scale = scales[b];
  for (int r = 0; r < ROWS; ++r) {
    const int64_t block = (first_row + r) * blocks + b;
    __m256i xq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.values.data() + block * kBlock));
    if (bits == 8) xq = _mm256_sign_epi8(xq, signs);
    const __m256i dot = _mm256_madd_epi16(_mm256_maddubs_epi16(w, xq), _mm256_set1_epi16(1));
    acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_set1_ps(scale * x.scales[block]), acc[r]);
  }
}

// out[m, n] for ROWS input rows and one weight row. A block's weights are laid out once as 32 bytes: 4 bits as
// unsigned values (GGUF's byte j holds values j and j + 16), 8 bits as their magnitudes, the signs moved onto
// the input's bytes, since maddubs multiplies unsigned by signed bytes. Under 4 rows, even and odd blocks sum
// apart, so that one block's multiply-add does not wait for the last one's.
template <int ROWS>
void rows_times_weight_row(const Int8Rows& x, int64_t first_row, int64_t blocks, const uint8_t* row,
                           const float* scales, const float* mins, int64_t bits, float* out, int64_t out_stride) {
  constexpr int kSplit = ROWS < 4 ? 2 : 1;  // from 4 rows up, the rows' sums are independent enough
  __m256 acc[kSplit][ROWS];
  for (int j = 0; j < kSplit; ++j)
    for (int r = 0; r < ROWS; ++r) acc[j][r] = _mm256_setzero_ps();
  int64_t b = 0;
  for (; b + kSplit <= blocks; b += kSplit)
    for (int j = 0; j < kSplit; ++j) add_block<ROWS>(x, first_row, blocks, row, scales, bits, b + j, acc[j]);
  if (b < blocks) add_block<ROWS>(x, first_row, blocks, row, scales, bits, b, acc[0]);
  for (int r = 0; r < ROWS; ++r) {
    __m256 total = kSplit > 1 ? _mm256_add_ps(acc[0][r], acc[kSplit - 1][r]) : acc[0][r];
    if (mins) total = _mm256_add_ps(total, partial_dot(mins, x.scaled_sums.data() + (first_row + r) * blocks, blocks));
    out[r * out_stride] = sum_lanes(total);
  }
}

// The first input row against COLS weight rows ns[0..COLS) (weight_rows::for_each_row_group: COLS streams from
// memory at once), each output summed exactly as rows_times_weight_row<1> sums it.
constexpr int kStreams = 4;
template <int COLS>
void row_times_weight_rows(const Int8Rows& x, int64_t blocks, const weight_rows::BlockWeight& weight, const int64_t* ns,
                           float* out, int64_t out_first) {
  __m256 acc[2][COLS];
  weight_rows::BlockWeight::Row rows[COLS];
  for (int c = 0; c < COLS; ++c) {
    acc[0][c] = acc[1][c] = _mm256_setzero_ps();
    rows[c] = weight.row(ns[c]);
  }
  int64_t b = 0;
  for (; b + 2 <= blocks; b += 2)
    for (int j = 0; j < 2; ++j)
      for (int c = 0; c < COLS; ++c)
        add_block<1>(x, 0, blocks, rows[c].bytes, rows[c].scales, weight.bits, b + j, &acc[j][c]);
  if (b < blocks)
    for (int c = 0; c < COLS; ++c)
      add_block<1>(x, 0, blocks, rows[c].bytes, rows[c].scales, weight.bits, b, &acc[0][c]);
  for (int c = 0; c < COLS; ++c) {
    __m256 total = _mm256_add_ps(acc[0][c], acc[1][c]);
    if (rows[c].mins) total = _mm256_add_ps(total, partial_dot(rows[c].mins, x.scaled_sums.data(), blocks));
    out[ns[c] - out_first] = sum_lanes(total);
  }
}
#define ROW_STREAMS

#else

template <int ROWS>
void rows_times_weight_row(const Int8Rows& x, int64_t first_row, int64_t blocks, const uint8_t* row,
                           const float* scales, const float* mins, int64_t bits, float* out, int64_t out_stride) {
  for (int r = 0; r < ROWS; ++r) {
    float total = 0.f;
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t block = (first_row + r) * blocks + b;
      const int8_t* xq = x.values.data() + block * kBlock;
      int32_t dot = 0;
      if (bits == 4) {
        const uint8_t* q = row + b * kBlock / 2;
        for (int64_t i = 0; i < kBlock / 2; ++i) dot += (q[i] & 0x0F) * xq[i] + (q[i] >> 4) * xq[i + kBlock / 2];
      } else {
        const int8_t* q = reinterpret_cast<const int8_t*>(row) + b * kBlock;
        for (int64_t i = 0; i < kBlock; ++i) dot += q[i] * xq[i];
      }
      total += scales[b] * x.scales[block] * static_cast<float>(dot);
      if (mins) total += mins[b] * x.scaled_sums[block];
    }
    out[r * out_stride] = total;
  }
}

#endif

}  // namespace

void quantize_rows(const float* x, int64_t rows, int64_t k, Int8Rows& out) {
  const int64_t blocks = rows * (k / kBlock);
  out.values.resize(rows * k);
  out.scales.resize(blocks);
  out.scaled_sums.resize(blocks);
  at::parallel_for(0, blocks, 256, [&](int64_t first, int64_t last) {
    for (int64_t i = first; i < last; ++i) {
      const int32_t sum = quantize_block(x + i * kBlock, out.values.data() + i * kBlock, &out.scales[i]);
      out.scaled_sums[i] = out.scales[i] * static_cast<float>(sum);
    }
  });
}

void quantized_int8_unit(const Int8Rows& xq, int64_t rows, const weight_rows::BlockWeight& weight, int64_t first,
                         int64_t last, float* out, int64_t out_stride) {
  const int64_t blocks = weight.blocks, bits = weight.bits;
#ifdef ROW_STREAMS
  if (rows == 1) {  // one sequence's decode: kStreams weight rows at once, from as many parts of the chunk
    weight_rows::row_groups<kStreams>(first, last, [&](auto cols, const int64_t* ns) {
      row_times_weight_rows<cols()>(xq, blocks, weight, ns, out, first);
    });
    return;
  }
#endif
  for (int64_t n = first; n < last; ++n) {
    const weight_rows::BlockWeight::Row w = weight.row(n);
    float* column = out + n - first;
    int64_t m = 0;
    for (; m + 8 <= rows; m += 8)
      rows_times_weight_row<8>(xq, m, blocks, w.bytes, w.scales, w.mins, bits, column + m * out_stride, out_stride);
    for (; m + 4 <= rows; m += 4)
      rows_times_weight_row<4>(xq, m, blocks, w.bytes, w.scales, w.mins, bits, column + m * out_stride, out_stride);
    for (; m < rows; ++m)
      rows_times_weight_row<1>(xq, m, blocks, w.bytes, w.scales, w.mins, bits, column + m * out_stride, out_stride);
  }
}

// x: [M, K] float32, contiguous; the weight as quantized_linear takes it. Returns x @ W^T, [M, N], the input
// rounded to 8 bits per 32-value block first.
torch::Tensor quantized_linear_int8(torch::Tensor x, torch::Tensor qweight, torch::Tensor scales, torch::Tensor mins,
                                    int64_t bits) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat32 && x.is_contiguous(), "x: contiguous [M, K] float32");
  const int64_t rows = x.size(0), in_features = x.size(1);
  const weight_rows::BlockWeight weight(qweight, scales, mins, bits, in_features);
  TORCH_CHECK(weight.scales_per_block == 1, "8-bit inputs take weights with one scale per 32 values");
  Int8Rows xq;
  quantize_rows(x.data_ptr<float>(), rows, in_features, xq);
  auto out = torch::empty({rows, weight.out_features}, x.options());
  float* op = out.data_ptr<float>();
  weight_rows::for_each_chunk(weight, [&](int64_t first, int64_t last) {
    quantized_int8_unit(xq, rows, weight, first, last, op + first, weight.out_features);
  });
  return out;
}
