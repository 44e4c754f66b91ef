// Linear layers over a GGUF file's weights in its own blocks (gguf_blocks.h), read where the file is mapped: no
// copy of the weight is made, in float32 or in any other layout. Each 32-value chunk of a weight row is widened to
// float32 in registers, exactly as gguf-py dequantizes it, and multiplied by every input row of the tile before
// the next chunk is read, so a decode step reads each weight byte once; the outputs equal x @ dequantize(W)^T up
// to the order of float32 summation.
//   one input row:   several weight rows at once (kColumns), each its own stream from memory
//   up to 11 rows:   tiles of up to 8 input rows against one weight row
//   12 to 64 rows:   16 weight rows widened to float32 at a time, through dense_linear.cpp's tiles
//   more rows:       panel_gemm.cpp's GEMM, each panel of weight rows widened into its scratch as it is taken
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "float_vec.h"
#include "gguf_blocks.h"
#include "gguf_linear.h"
#include "linear_checks.h"
#include "panel_gemm.h"
#include "weight_rows.h"

void dense_rows_times_weight_rows(const float* x, int64_t rows, const float* w, int64_t n, int64_t k, float* out,
                                  int64_t out_stride);

namespace {

// From this many input rows up, weight rows are widened once and go through the float32 tiles, whose register
// blocking does more per cycle than one weight row against 8 input rows (bench/gguf_paths.py; near 9 rows neither
// leads).
constexpr int64_t kWidenRows = 12;

using float_vec::Vec;
using gguf_blocks::Format;
using gguf_blocks::kChunk;
using gguf_blocks::kFloat;
using gguf_blocks::Table;
using gguf_blocks::Type;

constexpr int kVecs = kChunk / float_vec::kLanes;  // vectors a chunk widens into

#if defined(__AVX512F__)
constexpr int kColumns = 8;  // weight rows a one-row step reads side by side
// 32 integers q as two vectors of 16 floats, s[h] * q + m[h] for each half h.
inline void widen_ints(__m256i q, const float* s, const float* m, Vec w[kVecs]) {
  w[0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(q))), _mm512_set1_ps(s[0]),
                         _mm512_set1_ps(m[0]));
  w[1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(q, 1))),
                         _mm512_set1_ps(s[1]), _mm512_set1_ps(m[1]));
}
// A 4-bit type's 32 values looked up in a table of the 16 each half can hold (scale * i + min, or scale times
// IQ4_NL's values: the same single rounding as widening each), by each nibble: vpermps reads an index's low 4 bits,
// so a byte's low nibble needs no mask and its high one a shift. One lookup a vector instead of a conversion and a
// fused multiply-add, and the table costs one step a half.
// (Every tabled type has one scale and min for its 32 values: the table serves both halves.)
template <Type T>
inline __m512 table_of(float s, float m) {
  if constexpr (Format<T>::kTable == Table::kAffine)
    return _mm512_fmadd_ps(_mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), _mm512_set1_ps(s),
                           _mm512_set1_ps(m));
  return _mm512_mul_ps(_mm512_loadu_ps(gguf_blocks::kIQ4Values), _mm512_set1_ps(s));
}
inline __m512i nibble_indices(const uint8_t* p) {
  return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
template <Type T>
inline void look_up(const uint8_t* block, int c, const float* s, const float* m, Vec w[kVecs]) {
  const __m512 table = table_of<T>(s[0], m[0]);
  const __m512i index = nibble_indices(Format<T>::nibble_bytes(block, c));
  w[0] = _mm512_permutexvar_ps(index, table);
  w[1] = _mm512_permutexvar_ps(_mm512_srli_epi32(index, 4), table);
}
// Q4_K's chunks 2j and 2j + 1 at once: the low and the high nibbles of the same 32 bytes, each byte widened once.
inline void look_up_run(const uint8_t* block, int j, const float* s, const float* m, Vec w[4]) {
  const uint8_t* run = block + 16 + 32 * j;
  const __m512i low = nibble_indices(run), high = nibble_indices(run + 16);
  const __m512 even = table_of<gguf_blocks::kQ4_K>(s[4 * j], m[4 * j]);
  const __m512 odd = table_of<gguf_blocks::kQ4_K>(s[4 * j + 2], m[4 * j + 2]);
  w[0] = _mm512_permutexvar_ps(low, even);
  w[1] = _mm512_permutexvar_ps(high, even);
  w[2] = _mm512_permutexvar_ps(_mm512_srli_epi32(low, 4), odd);
  w[3] = _mm512_permutexvar_ps(_mm512_srli_epi32(high, 4), odd);
}
constexpr bool kLooksUp = true;
inline Vec half_floats(const uint8_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
inline Vec brain_floats(const uint8_t* p) {
  const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}
#else
constexpr int kColumns = 2;  // AVX2's 16 registers: two rows' 8 widened vectors beside their sums
inline void widen_ints(__m256i q, const float* s, const float* m, Vec w[kVecs]) {
  const __m128i halves[2] = {_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1)};
  for (int i = 0; i < kVecs; ++i) {
    const __m128i part = i % 2 ? _mm_srli_si128(halves[i / 2], 8) : halves[i / 2];
    w[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(part)), _mm256_set1_ps(s[i / 2]),
                           _mm256_set1_ps(m[i / 2]));
  }
}
template <Type T>
inline void look_up(const uint8_t*, int, const float*, const float*, Vec*) {}  // AVX2 has no 16-float permute
inline void look_up_run(const uint8_t*, int, const float*, const float*, Vec*) {}
constexpr bool kLooksUp = false;
inline Vec half_floats(const uint8_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
inline Vec brain_floats(const uint8_t* p) {
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}
#endif

// Types whose integers are unpacked a whole block at a time, wider than a chunk's steps allow (Q6_K's 6 bits
// from two places: 512-bit steps over 64 values halve the work of 256-bit ones over 32).
#if defined(__AVX512BW__)
template <Type T>
constexpr bool kUnpacksBlock = T == gguf_blocks::kQ6_K;
#else
template <Type T>
constexpr bool kUnpacksBlock = false;
#endif

// A block's scales and mins, one of each for every 16 values (none for the float types), and its integers where
// they are unpacked a block at a time.
template <Type T>
struct BlockScales {
  static constexpr int kHalves = Format<T>::kValues / 16;
  float s[kHalves], m[kHalves];
  alignas(64) int8_t q[kUnpacksBlock<T> ? Format<T>::kValues : 1];
  void read(const uint8_t* block) {
    if constexpr (!kFloat<T>) Format<T>::scales(block, s, m);
    if constexpr (kUnpacksBlock<T>) Format<T>::unpack(block, q);
  }
};

// The values a kernel widens at a time: a chunk, or Q4_K's two chunks of one run of bytes where it looks them up.
template <Type T>
constexpr int kStep = kLooksUp && T == gguf_blocks::kQ4_K ? 2 * kChunk : kChunk;
template <Type T>
constexpr int kStepVecs = kStep<T> / float_vec::kLanes;

// Step c of the block at `block`, as float32 vectors (`scales`: the block's).
template <Type T>
inline void widen(const uint8_t* block, int c, const BlockScales<T>& scales, Vec w[kStepVecs<T>]) {
  if constexpr (kStep<T> != kChunk) {
    look_up_run(block, c, scales.s, scales.m, w);
  } else if constexpr (T == gguf_blocks::kF32) {
    for (int i = 0; i < kVecs; ++i) w[i] = float_vec::load(reinterpret_cast<const float*>(block) + i * float_vec::kLanes);
  } else if constexpr (T == gguf_blocks::kF16) {
    for (int i = 0; i < kVecs; ++i) w[i] = half_floats(block + 2 * i * float_vec::kLanes);
  } else if constexpr (T == gguf_blocks::kBF16) {
    for (int i = 0; i < kVecs; ++i) w[i] = brain_floats(block + 2 * i * float_vec::kLanes);
  } else if constexpr (kUnpacksBlock<T>) {
    widen_ints(_mm256_load_si256(reinterpret_cast<const __m256i*>(scales.q + kChunk * c)), scales.s + 2 * c,
               scales.m + 2 * c, w);
  } else if constexpr (kLooksUp && Format<T>::kTable != Table::kNone) {
    look_up<T>(block, c, scales.s + 2 * c, scales.m + 2 * c, w);
  } else {
    widen_ints(Format<T>::ints(block, c), scales.s + 2 * c, scales.m + 2 * c, w);
  }
}

template <Type T>
constexpr int kSteps = Format<T>::kValues / kStep<T>;

// How far ahead a one-row tile asks for its weight rows' bytes: some 1 KB a row.
template <Type T>
constexpr int64_t kPrefetchBlocks = (1024 + Format<T>::kBytes - 1) / Format<T>::kBytes;

// out[r * out_stride + ns[c] - first] = x[r] . W[ns[c]] for ROWS input rows and COLS weight rows.
template <Type T, int ROWS, int COLS>
void tile(const float* x, int64_t x_stride, const GGUFWeight& weight, const int64_t* ns, int64_t first, float* out,
          int64_t out_stride) {
  Vec acc[ROWS][COLS];
  const uint8_t* rows[COLS];
  for (int c = 0; c < COLS; ++c) rows[c] = weight.row(ns[c]);
  for (int r = 0; r < ROWS; ++r)
    for (int c = 0; c < COLS; ++c) acc[r][c] = float_vec::zero();
  const int64_t blocks = weight.k / Format<T>::kValues;
  BlockScales<T> scales[COLS];
  for (int64_t b = 0; b < blocks; ++b) {
    for (int c = 0; c < COLS; ++c) scales[c].read(rows[c] + b * Format<T>::kBytes);
    if constexpr (ROWS == 1)
      for (int c = 0; c < COLS; ++c)
        for (int64_t line = 0; line < Format<T>::kBytes; line += 64)
          _mm_prefetch(reinterpret_cast<const char*>(rows[c] + (b + kPrefetchBlocks<T>) * Format<T>::kBytes + line),
                       _MM_HINT_T0);
    for (int step = 0; step < kSteps<T>; ++step) {
      Vec w[COLS][kStepVecs<T>];
      for (int c = 0; c < COLS; ++c) widen<T>(rows[c] + b * Format<T>::kBytes, step, scales[c], w[c]);
      const int64_t at = b * Format<T>::kValues + step * kStep<T>;
      for (int r = 0; r < ROWS; ++r)
        for (int i = 0; i < kStepVecs<T>; ++i) {
          const Vec xv = float_vec::load(x + r * x_stride + at + i * float_vec::kLanes);
          for (int c = 0; c < COLS; ++c) acc[r][c] = float_vec::fma(w[c][i], xv, acc[r][c]);
        }
    }
  }
  for (int r = 0; r < ROWS; ++r)
    for (int c = 0; c < COLS; ++c) out[r * out_stride + ns[c] - first] = float_vec::sum_lanes(acc[r][c]);
}

template <Type T>
void widen_rows(const GGUFWeight& weight, int64_t first, int64_t count, float* out) {
  const int64_t blocks = weight.k / Format<T>::kValues;
  BlockScales<T> scales;
  for (int64_t j = 0; j < count; ++j) {
    const uint8_t* row = weight.row(first + j);
    float* o = out + j * weight.k;
    for (int64_t b = 0; b < blocks; ++b) {
      scales.read(row + b * Format<T>::kBytes);
      for (int step = 0; step < kSteps<T>; ++step) {
        Vec w[kStepVecs<T>];
        widen<T>(row + b * Format<T>::kBytes, step, scales, w);
        for (int i = 0; i < kStepVecs<T>; ++i)
          float_vec::store(o + b * Format<T>::kValues + step * kStep<T> + i * float_vec::kLanes, w[i]);
      }
    }
  }
}

template <Type T>
void unit(const float* x, int64_t rows, const GGUFWeight& weight, int64_t first, int64_t last, float* out,
          int64_t out_stride) {
  if (rows == 1) {
    // kColumns weight rows at once, each from its own part of the range: as many streams from memory, which a
    // decode step's weights come from (one stream of neighbouring rows leaves the cores waiting on it)
    weight_rows::row_groups<kColumns>(first, last, [&](auto cols, const int64_t* ns) {
      tile<T, 1, decltype(cols)::value>(x, weight.k, weight, ns, first, out, out_stride);
    });
    return;
  }
  if (rows >= kWidenRows) {
    // kWidened weight rows widened once, then every input row through dense_linear.cpp's float32 tiles, which do
    // more per cycle than widening each chunk again for every 8 input rows
    constexpr int64_t kWidened = 16;  // they stay in the cache for every input row
    thread_local std::vector<float> widened;
    widened.resize(kWidened * weight.k);
    for (int64_t begin = first; begin < last; begin += kWidened) {
      const int64_t end = std::min(last, begin + kWidened);
      widen_rows<T>(weight, begin, end - begin, widened.data());
      dense_rows_times_weight_rows(x, rows, widened.data(), end - begin, weight.k, out + begin - first, out_stride);
    }
    return;
  }
  for (int64_t n = first; n < last; ++n)
    float_vec::even_tiles<8>(rows, [&](auto tile_rows, int64_t m) {
      tile<T, decltype(tile_rows)::value, 1>(x + m * weight.k, weight.k, weight, &n, first, out + m * out_stride,
                                             out_stride);
    });
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
