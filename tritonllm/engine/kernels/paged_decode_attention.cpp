// Decode attention straight from the paged KV cache: one query token per sequence, keys and values read in
// place through the block table, so no gathered copy of the context is ever made.
//
// The cache holds float32, bfloat16 or int8 (kv_cache_dtype): a bfloat16 value is read as the float32 with its
// bits in the upper half, an int8 one as its float32 times its vector's scale (one per position and KV head), so
// the arithmetic is float32's, on the values the cache stands for, whatever it holds.
//
// Built for the machine it runs on (-march=native): ATen's Vectorized<float> then uses the widest vector unit
// the compiler targets (AVX-512, AVX2, or plain C++), and its exp is SLEEF's, accurate to 1 ulp.
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__) && defined(__AVX512VL__)
#define CPU_CAPABILITY_AVX512
#elif defined(__AVX2__) && defined(__FMA__)
#define CPU_CAPABILITY_AVX2
#endif

#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <atomic>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "paged_decode_attention.h"

using Vec = at::vec::Vectorized<float>;
using BF16 = at::BFloat16;

namespace {

inline float to_float(float x) { return x; }
inline float to_float(BF16 x) { return static_cast<float>(x); }
inline float to_float(int8_t x) { return static_cast<float>(x); }

inline Vec load_vec(const float* p) { return Vec::loadu(p); }
inline Vec load_vec(const BF16* p) {
#if defined(CPU_CAPABILITY_AVX512)
  const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return Vec(_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16)));
#elif defined(CPU_CAPABILITY_AVX2)
  const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return Vec(_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16)));
#else
  float widened[Vec::size()];
  for (int64_t i = 0; i < Vec::size(); ++i) widened[i] = static_cast<float>(p[i]);
  return Vec::loadu(widened);
#endif
}
inline Vec load_vec(const int8_t* p) {
#if defined(CPU_CAPABILITY_AVX512)
  return Vec(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)))));
#elif defined(CPU_CAPABILITY_AVX2)
  return Vec(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)))));
#else
  float widened[Vec::size()];
  for (int64_t i = 0; i < Vec::size(); ++i) widened[i] = static_cast<float>(p[i]);
  return Vec::loadu(widened);
#endif
}

// The keys (or values) of consecutive positions of one KV head: position p's vector at data + p * stride. An
// int8 vector is multiplied by its scale, scales[p * scale_stride], as it is read.
template <typename KV>
struct Rows {
  const KV* data;
  int64_t stride;
  const float* scales;
  int64_t scale_stride;

  Rows from(int64_t p) const {
    return {data + p * stride, stride, scales ? scales + p * scale_stride : nullptr, scale_stride};
  }
  Vec load(int64_t p, int64_t c) const {
    const Vec v = load_vec(data + p * stride + c);
    return std::is_same_v<KV, int8_t> ? v * Vec(scales[p * scale_stride]) : v;
  }
  float value(int64_t p, int64_t c) const {
    const float v = to_float(data[p * stride + c]);
    return std::is_same_v<KV, int8_t> ? v * scales[p * scale_stride] : v;
  }
};

float sum_lanes(const Vec& v) {
  return at::vec::vec_reduce_all<float>([](const Vec& x, const Vec& y) { return x + y; }, v);
}

template <typename KV>
float dot(const float* a, const Rows<KV>& rows, int64_t p, int64_t n) {
  Vec sum(0.f);
  int64_t i = 0;
  for (; i + Vec::size() <= n; i += Vec::size()) sum = at::vec::fmadd(Vec::loadu(a + i), rows.load(p, i), sum);
  float total = sum_lanes(sum);
  // std::fma, not a * b + c: the compiler fused that in some instantiations and not in others (AMD EPYC Zen 4, GCC
  // -march=native), so a bfloat16 or int8 cache was not read exactly as the float32 values it stands for
  for (; i < n; ++i) total = std::fma(a[i], rows.value(p, i), total);
  return total;
}

// out[p] = query . keys[p * stride : p * stride + dim] for p < count: the keys of consecutive positions in one
// block. A run of kPositions positions is scored together, each key's products summed in its own register and the
// registers then summed across in one transposing tree (a fraction of the shuffles of a sum per score).
#if defined(__AVX512F__)
constexpr int64_t kPositions = 16;
inline __m512 pair_sums(__m512 a, __m512 b) { return _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b)); }
inline __m512 quad_sums(__m512 a, __m512 b) {
  const __m512d x = _mm512_castps_pd(a), y = _mm512_castps_pd(b);
  return _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)), _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
}
inline __m512 lane_sums(__m512 a, __m512 b) {
  return _mm512_add_ps(_mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(3, 1, 3, 1)));
}
template <typename KV>
void run_scores(const float* query, const Rows<KV>& keys, int64_t dim, float* out) {
  __m512 acc[16];
  for (int p = 0; p < 16; ++p) acc[p] = _mm512_setzero_ps();
  for (int64_t c = 0; c < dim; c += 16) {
    const __m512 q = _mm512_loadu_ps(query + c);
    for (int p = 0; p < 16; ++p) acc[p] = _mm512_fmadd_ps(q, keys.load(p, c), acc[p]);
  }
  __m512 pairs[8], quads[4];
  for (int i = 0; i < 8; ++i) pairs[i] = pair_sums(acc[2 * i], acc[2 * i + 1]);
  for (int i = 0; i < 4; ++i) quads[i] = quad_sums(pairs[2 * i], pairs[2 * i + 1]);
  _mm512_storeu_ps(out, lane_sums(lane_sums(quads[0], quads[1]), lane_sums(quads[2], quads[3])));
}
#elif defined(__AVX2__) && defined(__FMA__)
constexpr int64_t kPositions = 8;
template <typename KV>
void run_scores(const float* query, const Rows<KV>& keys, int64_t dim, float* out) {
  __m256 acc[8];
  for (int p = 0; p < 8; ++p) acc[p] = _mm256_setzero_ps();
  for (int64_t c = 0; c < dim; c += 8) {
    const __m256 q = _mm256_loadu_ps(query + c);
    for (int p = 0; p < 8; ++p) acc[p] = _mm256_fmadd_ps(q, keys.load(p, c), acc[p]);
  }
  __m256 pairs[4], quads[2];
  for (int i = 0; i < 4; ++i)
    pairs[i] = _mm256_add_ps(_mm256_unpacklo_ps(acc[2 * i], acc[2 * i + 1]),
                             _mm256_unpackhi_ps(acc[2 * i], acc[2 * i + 1]));
  for (int i = 0; i < 2; ++i) {
    const __m256d a = _mm256_castps_pd(pairs[2 * i]), b = _mm256_castps_pd(pairs[2 * i + 1]);
    quads[i] = _mm256_add_ps(_mm256_castpd_ps(_mm256_unpacklo_pd(a, b)), _mm256_castpd_ps(_mm256_unpackhi_pd(a, b)));
  }
  _mm256_storeu_ps(out, _mm256_add_ps(_mm256_permute2f128_ps(quads[0], quads[1], 0x20),
                                      _mm256_permute2f128_ps(quads[0], quads[1], 0x31)));
}
#else
constexpr int64_t kPositions = 0;
template <typename KV>
void run_scores(const float*, const Rows<KV>&, int64_t, float*) {}
#endif

template <typename KV>
void block_scores(const float* query, const Rows<KV>& keys, int64_t count, int64_t dim, float* out) {
  int64_t p = 0;
  if (kPositions && dim % kPositions == 0)
    for (; p + kPositions <= count; p += kPositions) run_scores(query, keys.from(p), dim, out + p);
  for (; p < count; ++p) out[p] = dot(query, keys, p, dim);
}

// out[0:n] += sum over rows r < count of weights[r] * rows r, summed in registers: updating `out` row by row
// would make every row wait for the previous row's store. kChains vectors of `out` at a time, so that as many
// independent sums advance together instead of each waiting out the one FMA before it (a head of 64 values: 4
// AVX-512 vectors, each one chain of `count` FMAs before); each value is still summed row after row, front to back.
template <typename KV>
void accumulate(float* out, const float* weights, const Rows<KV>& rows, int64_t count, int64_t n) {
  constexpr int64_t kChains = 4;
  int64_t i = 0;
  for (; i + kChains * Vec::size() <= n; i += kChains * Vec::size()) {
    Vec sum[kChains];
    for (int64_t c = 0; c < kChains; ++c) sum[c] = Vec::loadu(out + i + c * Vec::size());
    for (int64_t r = 0; r < count; ++r) {
      const Vec weight(weights[r]);
      for (int64_t c = 0; c < kChains; ++c) sum[c] = at::vec::fmadd(weight, rows.load(r, i + c * Vec::size()), sum[c]);
    }
    for (int64_t c = 0; c < kChains; ++c) sum[c].store(out + i + c * Vec::size());
  }
  for (; i + Vec::size() <= n; i += Vec::size()) {
    Vec sum = Vec::loadu(out + i);
    for (int64_t r = 0; r < count; ++r) sum = at::vec::fmadd(Vec(weights[r]), rows.load(r, i), sum);
    sum.store(out + i);
  }
  for (; i < n; ++i)
    for (int64_t r = 0; r < count; ++r) out[i] = std::fma(weights[r], rows.value(r, i), out[i]);  // as dot's tail
}

// row[0:n] = exp(row - max(row)), with weights below e^-80 made exactly 0: they are lost next to the largest
// (1) anyway, and denormals would cost a hundred cycles each in the sums. Returns the sum of the weights.
float exp_shifted(float* row, int64_t n) {
  float best = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < n; ++i) best = std::max(best, row[i]);
  const Vec shift(best), floor(-80.f), zero(0.f);
  Vec sum(0.f);
  int64_t i = 0;
  for (; i + Vec::size() <= n; i += Vec::size()) {
    const Vec shifted = Vec::loadu(row + i) - shift;
    const Vec weight = Vec::blendv(shifted.exp(), zero, shifted < floor);
    weight.store(row + i);
    sum = sum + weight;
  }
  float total = sum_lanes(sum);
  for (; i < n; ++i) {
    const float shifted = row[i] - best;
    row[i] = shifted < -80.f ? 0.f : std::exp(shifted);
    total += row[i];
  }
  return total;
}

constexpr int64_t kPrefetchLines = 2048;  // 128 KB: a group's keys and values of 256 positions, in a core's L2

// Query heads h .. h + count - 1 of sequence b, which share a KV head: each head's scores over the context,
// their softmax, then the values' weighted sum, the keys and values read block by block front to back, every
// head of the group in turn on a block while it is in the core's L1 (one head after another over the whole
// context read each block from L2 again). Each head's arithmetic is the same as alone. result[j * dim ..] is
// written once, at the end (decoder_layers.cpp's phases rely on it: a value another thread may read is never an
// intermediate one).
template <typename KV>
void attend_heads(const DecodeAttention& a, int64_t b, int64_t h, int64_t count, std::vector<float>& scratch,
                  float* result) {
  const int64_t len = a.lens[b], group = a.q_heads / a.kv_heads, kv_head = h / group;
  const int64_t first = a.window > 0 ? std::max<int64_t>(0, len - a.window) : 0, seen = len - first;
  const float* query = a.q + (b * a.q_heads + h) * a.dim;
  const int64_t* table = a.tables + b * a.max_blocks;
  const int64_t head_offset = kv_head * a.dim, position_stride = a.kv_heads * a.dim;
  const KV* kp = static_cast<const KV*>(a.k);
  const KV* vp = static_cast<const KV*>(a.v);
  scratch.resize(count * (seen + a.dim + 1));
  float* const scores = scratch.data();             // [count][seen]
  float* const sums = scores + count * seen;        // [count][dim]: the values' weighted sums, before the division
  float* const totals = sums + count * a.dim;       // [count]: the softmax's denominators
  // Runs of positions that lie in one block, as f(the run's first position in the cache, its first in the
  // context seen, its length); the first may start mid-block when a window cuts the context.
  auto for_each_run = [&](const auto& f) {
    for (int64_t start = first; start < len;) {
      const int64_t offset = start % a.block_size, run = std::min(a.block_size - offset, len - start);
      f(table[start / a.block_size] * a.block_size + offset, start - first, run);
      start += run;
    }
  };
  auto rows = [&](const KV* cache, const float* scales, int64_t position) {
    return Rows<KV>{cache + position * position_stride + head_offset, position_stride,
                    scales ? scales + position * a.kv_heads + kv_head : nullptr, a.kv_heads};
  };
  // The group's keys and values (up to kPrefetchLines cache lines of them) asked of memory all at once, before the
  // first is needed: a step's cache comes from DRAM (each layer's weights evict the last one's from L3), one run
  // of a block table's scattered blocks at a time, and read one by one the cores would wait on each in turn.
  int64_t lines = kPrefetchLines;
  for_each_run([&](int64_t position, int64_t, int64_t run) {
    for (int64_t p = position; p < position + run && lines > 0; ++p)
      for (const KV* cache : {kp, vp}) {
        const char* vector = reinterpret_cast<const char*>(cache + p * position_stride + head_offset);
        for (int64_t byte = 0; byte < a.dim * static_cast<int64_t>(sizeof(KV)); byte += 64, --lines)
          _mm_prefetch(vector + byte, _MM_HINT_T1);
      }
  });
  for_each_run([&](int64_t position, int64_t at, int64_t run) {
    const Rows<KV> keys = rows(kp, a.k_scales, position);
    for (int64_t j = 0; j < count; ++j) block_scores(query + j * a.dim, keys, run, a.dim, scores + j * seen + at);
  });
  for (int64_t j = 0; j < count; ++j) {
    float* row = scores + j * seen;
    for (int64_t i = 0; i < seen; ++i) {
      row[i] *= a.scale;
      if (a.softcap > 0.f) row[i] = a.softcap * std::tanh(row[i] / a.softcap);
    }
    totals[j] = exp_shifted(row, seen);
  }
  std::fill(sums, sums + count * a.dim, 0.f);
  for_each_run([&](int64_t position, int64_t at, int64_t run) {
    const Rows<KV> values = rows(vp, a.v_scales, position);
    for (int64_t j = 0; j < count; ++j) accumulate(sums + j * a.dim, scores + j * seen + at, values, run, a.dim);
  });
  for (int64_t j = 0; j < count; ++j) {
    const float inverse = 1.f / totals[j];
    for (int64_t d = 0; d < a.dim; ++d) result[j * a.dim + d] = sums[j * a.dim + d] * inverse;
  }
}

}  // namespace

DecodeAttention::DecodeAttention(const float* q, int64_t batch, int64_t q_heads, int64_t dim,
                                 const torch::Tensor& k_cache, const torch::Tensor& v_cache,
                                 const torch::Tensor& block_tables, const torch::Tensor& context_lens, double scale,
                                 int64_t window, double softcap, const torch::Tensor& k_scales,
                                 const torch::Tensor& v_scales)
    : q(q), batch(batch), q_heads(q_heads), dim(dim), kv_heads(k_cache.size(2)), block_size(k_cache.size(1)),
      max_blocks(block_tables.size(1)), window(window), tables(block_tables.data_ptr<int64_t>()),
      lens(context_lens.data_ptr<int64_t>()), k(k_cache.data_ptr()), v(v_cache.data_ptr()),
      scale(static_cast<float>(scale)), softcap(static_cast<float>(softcap)) {
  const auto kv = k_cache.scalar_type();
  TORCH_CHECK((kv == torch::kFloat32 || kv == torch::kBFloat16 || kv == torch::kChar) && v_cache.scalar_type() == kv,
              "the KV cache: float32, bfloat16 or int8, keys and values alike");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(), "contiguous inputs only");
  TORCH_CHECK(block_tables.scalar_type() == torch::kLong && context_lens.scalar_type() == torch::kLong &&
                  block_tables.is_contiguous() && context_lens.is_contiguous(),
              "block_tables, context_lens: contiguous int64");
  if (kv == torch::kChar) {
    TORCH_CHECK(k_scales.scalar_type() == torch::kFloat32 && k_scales.is_contiguous() && v_scales.is_contiguous() &&
                    k_scales.numel() * k_cache.size(3) == k_cache.numel() && v_scales.sizes() == k_scales.sizes(),
                "an int8 cache: float32 scales [num_blocks, block_size, Hkv] for keys and values");
    this->k_scales = k_scales.data_ptr<float>();
    this->v_scales = v_scales.data_ptr<float>();
    attend_ = &attend_heads<int8_t>;
  } else {
    attend_ = kv == torch::kBFloat16 ? &attend_heads<BF16> : &attend_heads<float>;
  }
}

int64_t DecodeAttention::heads_per_item(int64_t threads) const {
  // An item is the query heads that share a KV head, so that one core reads those keys and values from memory and
  // the group's other heads find them in its cache (split over cores, each core's cache would fetch them again);
  // with too few groups to keep every thread busy (one sequence alone) an item is one query head.
  return batch * kv_heads >= 4 * threads ? q_heads / kv_heads : 1;
}

// q: [B, Hq, D]; k_cache, v_cache: [num_blocks, block_size, Hkv, D]; block_tables: [B, max_blocks] int64;
// context_lens: [B] int64. Returns [B, Hq, D]. q float32, the cache float32 or bfloat16, all contiguous.
// window > 0: the query sees only the last `window` positions (transformers' sliding window: q - k < window).
// softcap > 0: scores become softcap * tanh(score / softcap) after scaling, as Gemma 2's attention does.
// k_scales, v_scales: [num_blocks, block_size, Hkv] float32 for an int8 cache; empty otherwise.
torch::Tensor paged_decode_attention(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache,
                                     torch::Tensor block_tables, torch::Tensor context_lens, double scale,
                                     int64_t window, double softcap, torch::Tensor k_scales, torch::Tensor v_scales) {
  TORCH_CHECK(q.scalar_type() == torch::kFloat32 && q.is_contiguous() && q.dim() == 3, "q: contiguous [B, Hq, D] float32");
  auto out = torch::empty_like(q);
  const DecodeAttention attention(q.data_ptr<float>(), q.size(0), q.size(1), q.size(2), k_cache, v_cache,
                                  block_tables, context_lens, scale, window, softcap, k_scales, v_scales);
  float* op = out.data_ptr<float>();
  // Work items are taken one at a time from a shared counter rather than split in fixed halves: when another
  // process preempts one thread, the others take over its share instead of waiting for it.
  const int64_t threads = at::get_num_threads();
  const int64_t heads_per_item = attention.heads_per_item(threads);
  const int64_t items = attention.batch * attention.q_heads / heads_per_item;
  std::atomic<int64_t> next{0};
  at::parallel_for(0, threads, 1, [&](int64_t, int64_t) {
    std::vector<float> scratch;  // reused across this thread's heads
    for (int64_t item = next++; item < items; item = next++)
      attention.heads(item * heads_per_item, (item + 1) * heads_per_item, scratch, op);
  });
  return out;
}
