// What the block-quantized kernels (quantized_linear.cpp, quantized_linear_int8.cpp) share: the weight's rows, the
// loop that hands them to threads, and the AVX2 reductions.
#pragma once

#include <torch/extension.h>
#include <ATen/Parallel.h>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <type_traits>

namespace weight_rows {

constexpr int64_t kBlock = 32;  // values per block along the input

// A weight in blocks of `bits` (quantized_linear.cpp's layout) for inputs of in_features values, checked, as
// pointers to each row's bytes, scales and mins (null for 8 bits). 8-bit blocks may have a scale per 16 values
// (scales_per_block 2, Q6_K's sub-blocks) instead of one per block.
struct BlockWeight {
  struct Row {
    const uint8_t* bytes;
    const float* scales;
    const float* mins;
  };

  const uint8_t* bytes;
  const float* scales;
  const float* mins;
  int64_t out_features, in_features, blocks, row_bytes, bits, scales_per_block;

  BlockWeight(const torch::Tensor& qweight, const torch::Tensor& scale, const torch::Tensor& min, int64_t bits,
              int64_t in_features)
      : out_features(qweight.size(0)), in_features(in_features), blocks(in_features / kBlock), bits(bits) {
    TORCH_CHECK(bits == 8 || bits == 4, "bits must be 8 or 4");
    TORCH_CHECK(in_features % kBlock == 0, "the input size must be a multiple of 32");
    TORCH_CHECK(qweight.is_contiguous() && qweight.element_size() == 1, "qweight: contiguous bytes");
    TORCH_CHECK(qweight.size(1) == in_features * bits / 8, "qweight does not match the input size");
    TORCH_CHECK(scale.scalar_type() == torch::kFloat32 && scale.is_contiguous(), "scales: contiguous float32");
    TORCH_CHECK(scale.size(0) == qweight.size(0) &&
                    (scale.size(1) == blocks || (bits == 8 && scale.size(1) == 2 * blocks)),
                "scales: [N, K / 32] (8 bits: or [N, K / 16])");
    scales_per_block = blocks ? scale.size(1) / blocks : 1;
    TORCH_CHECK(bits == 8 || (min.sizes() == scale.sizes() && min.scalar_type() == torch::kFloat32 &&
                              min.is_contiguous()),
                "4 bits need mins shaped like scales");
    bytes = static_cast<const uint8_t*>(qweight.data_ptr());
    scales = scale.data_ptr<float>();
    mins = bits == 4 ? min.data_ptr<float>() : nullptr;
    row_bytes = qweight.size(1);
  }

  Row row(int64_t n) const {
    return {bytes + n * row_bytes, scales + n * blocks * scales_per_block, mins ? mins + n * blocks : nullptr};
  }
};

// Block b's scales: its values 0..15 are scaled by `low`, 16..31 by `high` (the same scale unless the 8-bit blocks
// have one per 16 values). `scales` is the row's.
struct BlockScale {
  float low, high;
};
inline BlockScale block_scale(const float* scales, int64_t per_block, int64_t b) {
  return {scales[b * per_block], scales[b * per_block + per_block - 1]};
}

// Calls f(first, last) on every thread for chunks of rows [0, count) that cover them all. Threads take chunks from
// a shared counter, so one that the OS preempts does not hold up the rest. The chunks start large, what is left
// over the threads, and shrink to `smallest` rows (OpenMP's guided schedule): each thread reads long runs of
// consecutive rows, which the memory prefetchers follow, and the last chunks are small enough to even out the
// threads' finish; the first chunk is the whole share, what is left over the threads, as smaller first chunks
// cost more in scheduling than they gained in balance (bench/results/log.md). `largest` bounds a chunk for
// callers that buffer one.
template <typename F>
void guided_chunks(int64_t count, int64_t smallest, int64_t largest, const F& f) {
  const int64_t threads = at::get_num_threads();
  std::atomic<int64_t> next{0};
  at::parallel_for(0, threads, 1, [&](int64_t, int64_t) {
    int64_t first = next.load(std::memory_order_relaxed);
    while (first < count) {
      int64_t size = std::clamp((count - first) / threads, smallest, largest);
      size = (size + smallest - 1) / smallest * smallest;
      if (next.compare_exchange_weak(first, first + size, std::memory_order_relaxed)) {
        f(first, std::min(count, first + size));
        first = next.load(std::memory_order_relaxed);
      }
    }
  });
}

// The weight's rows in guided chunks of at least 16 (at most `largest`).
constexpr int64_t kSmallestChunk = 16;

template <typename F>
void for_each_chunk(const BlockWeight& weight, const F& f, int64_t largest = INT64_MAX) {
  guided_chunks(weight.out_features, kSmallestChunk, std::max(largest, kSmallestChunk), f);
}

// Calls f(n, row n) for every row of the weight, chunk by chunk as for_each_chunk hands them out.
template <typename F>
void for_each_row(const BlockWeight& weight, const F& f) {
  for_each_chunk(weight, [&](int64_t first, int64_t last) {
    for (int64_t n = first; n < last; ++n) f(n, weight.row(n));
  });
}

// Calls f(cols, ns) for rows [first, last): with cols = COLS and COLS row indices ns, one from each of COLS equal
// parts of the range, then with cols = 1 for the rows left over (for_each_row_group's chunks, one phase's unit).
template <int COLS, typename F>
void row_groups(int64_t first, int64_t last, const F& f) {
  const int64_t part = (last - first) / COLS;
  int64_t ns[COLS];
  for (int64_t i = 0; i < part; ++i) {
    for (int c = 0; c < COLS; ++c) ns[c] = first + c * part + i;
    f(std::integral_constant<int, COLS>{}, ns);
  }
  for (int64_t n = first + COLS * part; n < last; ++n) f(std::integral_constant<int, 1>{}, &n);
}

// Calls f(cols, ns) over rows [0, count) in guided chunks of at least `smallest`: with cols = COLS (an
// std::integral_constant, for the kernel's template argument) and COLS row indices ns, one from each of COLS equal
// parts of a chunk, and with cols = 1 and one index for the rows left over. A kernel that reads the COLS rows side
// by side reads COLS streams from memory at once: a decode step's weights come from DRAM, and one stream of
// consecutive rows (a row at a time, or a few neighbours) leaves the cores waiting on it.
template <int COLS, typename F>
void for_each_row_group(int64_t count, int64_t smallest, const F& f) {
  guided_chunks(count, smallest, INT64_MAX, [&](int64_t first, int64_t last) { row_groups<COLS>(first, last, f); });
}

#if defined(__AVX2__) && defined(__FMA__)

inline float sum_lanes(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// The vector partial sums of a . b over n floats, the last n % 8 added into lane 0: a short dot product (a
// weight row's mins against an input row's block sums) without a chain of dependent scalar additions.
inline __m256 partial_dot(const float* a, const float* b, int64_t n) {
  __m256 sum = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) sum = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), sum);
  float rest = 0.f;
  for (; i < n; ++i) rest += a[i] * b[i];
  return _mm256_add_ps(sum, _mm256_setr_ps(rest, 0, 0, 0, 0, 0, 0, 0));
}

#endif

}  // namespace weight_rows
