// Linear layers over a GGUF file's weights in its own blocks (gguf_blocks.h), read where the file is mapped: no
// copy of the weight is made, in float32 or in any other layout. Each 32-value chunk of a weight row is widened to
// float32 in registers, exactly as gguf-py dequantizes it, and multiplied by every input row of the tile before
// the next chunk is read, so a decode step reads each weight byte once; the outputs equal x @ dequantize(W)^T up
// to the order of float32 summation.
//   one input row:   several weight rows at once (kColumns), each its own stream from memory
//   up to 64 rows:   tiles of up to 8 input rows against one weight row
//   more rows:       panel_gemm.cpp's GEMM, each panel of weight rows widened into its scratch as it is taken
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <cstdint>

#include "float_vec.h"
#include "gguf_blocks.h"
#include "gguf_linear.h"
#include "linear_checks.h"
#include "panel_gemm.h"
#include "weight_rows.h"

namespace {

using float_vec::Vec;
using gguf_blocks::Chunk;
using gguf_blocks::Format;
using gguf_blocks::kChunk;
using gguf_blocks::Type;

constexpr int kVecs = kChunk / float_vec::kLanes;  // vectors a chunk widens into

#if defined(__AVX512F__)
constexpr int kColumns = 4;  // weight rows a one-row step reads side by side
inline void widen_chunk(const Chunk& c, Vec w[kVecs]) {
  w[0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(c.q))),
                         _mm512_set1_ps(c.scale[0]), _mm512_set1_ps(c.min[0]));
  w[1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(c.q, 1))),
                         _mm512_set1_ps(c.scale[1]), _mm512_set1_ps(c.min[1]));
}
inline Vec half_floats(const uint8_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
inline Vec brain_floats(const uint8_t* p) {
  const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}
#else
constexpr int kColumns = 2;  // AVX2's 16 registers: two rows' 8 widened vectors beside their sums
inline void widen_chunk(const Chunk& c, Vec w[kVecs]) {
  const __m128i halves[2] = {_mm256_castsi256_si128(c.q), _mm256_extracti128_si256(c.q, 1)};
  for (int i = 0; i < kVecs; ++i) {
    const __m128i part = i % 2 ? _mm_srli_si128(halves[i / 2], 8) : halves[i / 2];
    w[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(part)), _mm256_set1_ps(c.scale[i / 2]),
                           _mm256_set1_ps(c.min[i / 2]));
  }
}
inline Vec half_floats(const uint8_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
inline Vec brain_floats(const uint8_t* p) {
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}
#endif

// Chunk c (of Format<T>::kValues / 32) of the block at `block`, as float32 vectors.
template <Type T>
inline void widen(const uint8_t* block, int c, Vec w[kVecs]) {
  if constexpr (T == gguf_blocks::kF32) {
    for (int i = 0; i < kVecs; ++i) w[i] = float_vec::load(reinterpret_cast<const float*>(block) + i * float_vec::kLanes);
  } else if constexpr (T == gguf_blocks::kF16) {
    for (int i = 0; i < kVecs; ++i) w[i] = half_floats(block + 2 * i * float_vec::kLanes);
  } else if constexpr (T == gguf_blocks::kBF16) {
    for (int i = 0; i < kVecs; ++i) w[i] = brain_floats(block + 2 * i * float_vec::kLanes);
  } else {
    widen_chunk(Format<T>::chunk(block, c), w);
  }
}

template <Type T>
constexpr int kChunks = Format<T>::kValues / kChunk;

// out[r * out_stride + c] = x[r] . W[ns[c]] for ROWS input rows and COLS weight rows.
template <Type T, int ROWS, int COLS>
void tile(const float* x, int64_t x_stride, const GGUFWeight& weight, const int64_t* ns, float* out,
          int64_t out_stride) {
  Vec acc[ROWS][COLS];
  const uint8_t* rows[COLS];
  for (int c = 0; c < COLS; ++c) rows[c] = weight.row(ns[c]);
  for (int r = 0; r < ROWS; ++r)
    for (int c = 0; c < COLS; ++c) acc[r][c] = float_vec::zero();
  const int64_t blocks = weight.k / Format<T>::kValues;
  for (int64_t b = 0; b < blocks; ++b) {
    for (int chunk = 0; chunk < kChunks<T>; ++chunk) {
      Vec w[COLS][kVecs];
      for (int c = 0; c < COLS; ++c) widen<T>(rows[c] + b * Format<T>::kBytes, chunk, w[c]);
      const int64_t at = b * Format<T>::kValues + chunk * kChunk;
      for (int r = 0; r < ROWS; ++r)
        for (int i = 0; i < kVecs; ++i) {
          const Vec xv = float_vec::load(x + r * x_stride + at + i * float_vec::kLanes);
          for (int c = 0; c < COLS; ++c) acc[r][c] = float_vec::fma(w[c][i], xv, acc[r][c]);
        }
    }
  }
  for (int r = 0; r < ROWS; ++r)
    for (int c = 0; c < COLS; ++c) out[r * out_stride + c] = float_vec::sum_lanes(acc[r][c]);
}

template <Type T>
void unit(const float* x, int64_t rows, const GGUFWeight& weight, int64_t first, int64_t last, float* out,
          int64_t out_stride) {
  if (rows == 1) {
    // kColumns weight rows at once, adjacent in memory, their outputs adjacent too
    int64_t n = first;
    int64_t ns[kColumns];
    for (; n + kColumns <= last; n += kColumns) {
      for (int c = 0; c < kColumns; ++c) ns[c] = n + c;
      tile<T, 1, kColumns>(x, weight.k, weight, ns, out + n - first, out_stride);
    }
    for (; n < last; ++n) tile<T, 1, 1>(x, weight.k, weight, &n, out + n - first, out_stride);
    return;
  }
  for (int64_t n = first; n < last; ++n)
    float_vec::even_tiles<8>(rows, [&](auto tile_rows, int64_t m) {
      tile<T, decltype(tile_rows)::value, 1>(x + m * weight.k, weight.k, weight, &n, out + m * out_stride + n - first,
                                             out_stride);
    });
}

template <Type T>
void widen_rows(const GGUFWeight& weight, int64_t first, int64_t count, float* out) {
  const int64_t blocks = weight.k / Format<T>::kValues;
  for (int64_t j = 0; j < count; ++j) {
    const uint8_t* row = weight.row(first + j);
    float* o = out + j * weight.k;
    for (int64_t b = 0; b < blocks; ++b)
      for (int chunk = 0; chunk < kChunks<T>; ++chunk) {
        Vec w[kVecs];
        widen<T>(row + b * Format<T>::kBytes, chunk, w);
        for (int i = 0; i < kVecs; ++i)
          float_vec::store(o + b * Format<T>::kValues + chunk * kChunk + i * float_vec::kLanes, w[i]);
      }
  }
}

}  // namespace

int64_t gguf_block_values(int64_t type) {
  int64_t values = 0;
  gguf_blocks::with_type(type, [&](auto t) { values = Format<decltype(t)::value>::kValues; });
  return values;
}

int64_t gguf_block_bytes(int64_t type) {
  int64_t bytes = 0;
  gguf_blocks::with_type(type, [&](auto t) { bytes = Format<decltype(t)::value>::kBytes; });
  return bytes;
}

GGUFWeight::GGUFWeight(const torch::Tensor& raw, int64_t type, int64_t in_features) : type(type), k(in_features) {
  const int64_t values = gguf_block_values(type);
  TORCH_CHECK(values > 0, "GGUF type ", type, " has no kernel here");
  TORCH_CHECK(k % values == 0 && k % kChunk == 0, "in_features ", k, " is not a whole number of ", values,
              "-value blocks");
  TORCH_CHECK(raw.dim() == 2 && raw.scalar_type() == torch::kUInt8 && raw.stride(1) == 1,
              "raw: [N, bytes per row] uint8, rows contiguous");
  row_bytes = k / values * gguf_block_bytes(type);
  TORCH_CHECK(raw.size(1) == row_bytes, "raw: rows of ", row_bytes, " bytes expected for K = ", k);
  n = raw.size(0);
  stride = raw.stride(0);
  data = raw.data_ptr<uint8_t>();
}

void gguf_unit(const float* x, int64_t rows, const GGUFWeight& weight, int64_t first, int64_t last, float* out,
               int64_t out_stride) {
  gguf_blocks::with_type(weight.type, [&](auto t) {
    unit<decltype(t)::value>(x, rows, weight, first, last, out, out_stride);
  });
}

void gguf_widen_rows(const GGUFWeight& weight, int64_t first, int64_t count, float* out) {
  gguf_blocks::with_type(weight.type, [&](auto t) { widen_rows<decltype(t)::value>(weight, first, count, out); });
}

// x: [M, K] float32, contiguous; raw: the weight's rows as the file holds them. Returns x @ W^T + bias, [M, N].
torch::Tensor gguf_linear(torch::Tensor x, torch::Tensor raw, int64_t type, torch::Tensor bias, int64_t gemm_rows) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat32 && x.is_contiguous(), "x: contiguous [M, K] float32");
  const GGUFWeight weight(raw, type, x.size(1));
  check_bias(bias, weight.n);
  const int64_t rows = x.size(0);
  auto out = torch::empty({rows, weight.n}, x.options());
  const float* xp = x.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const float* b = bias.numel() ? bias.data_ptr<float>() : nullptr;
  if (rows >= gemm_rows) {
    panel_gemm(xp, rows, weight.k, weight.n, b, op, [&](int64_t first, int64_t count, float* scratch) {
      gguf_widen_rows(weight, first, count, scratch);
      return static_cast<const float*>(scratch);
    });
    return out;
  }
  weight_rows::guided_chunks(weight.n, weight_rows::kSmallestChunk, INT64_MAX, [&](int64_t first, int64_t last) {
    gguf_unit(xp, rows, weight, first, last, op + first, weight.n);
  });
  if (b) out.add_(bias);
  return out;
}

// The weight's rows as float32 [N, K], each value as gguf-py's dequantize gives it.
torch::Tensor gguf_dequantize(torch::Tensor raw, int64_t type, int64_t in_features) {
  const GGUFWeight weight(raw, type, in_features);
  auto out = torch::empty({weight.n, weight.k}, torch::dtype(torch::kFloat32));
  float* op = out.data_ptr<float>();
  at::parallel_for(0, weight.n, 16, [&](int64_t first, int64_t last) {
    gguf_widen_rows(weight, first, last - first, op + first * weight.k);
  });
  return out;
}
