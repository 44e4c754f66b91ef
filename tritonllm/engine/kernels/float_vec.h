// The float32 vector operations that the dense kernels share: AVX-512 where the machine has it, AVX2 with FMA
// otherwise. One definition of how an output is summed, so that two kernels that sum a dot product the same way
// give the same bits (the greedy screen's candidates get dense_linear's logits exactly).
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <type_traits>

namespace float_vec {

#if defined(__AVX512F__)
using Vec = __m512;
constexpr int64_t kLanes = 16;
inline Vec load(const float* p) { return _mm512_loadu_ps(p); }
inline Vec zero() { return _mm512_setzero_ps(); }
inline Vec fma(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
inline float sum_lanes(Vec v) { return _mm512_reduce_add_ps(v); }
inline Vec set1(float v) { return _mm512_set1_ps(v); }
inline void store(float* p, Vec v) { _mm512_storeu_ps(p, v); }
inline Vec add(Vec a, Vec b) { return _mm512_add_ps(a, b); }
inline Vec sub(Vec a, Vec b) { return _mm512_sub_ps(a, b); }
inline Vec max(Vec a, Vec b) { return _mm512_max_ps(a, b); }
inline float max_lanes(Vec v) { return _mm512_reduce_max_ps(v); }
// Bit j set where lane j of a >= lane j of b.
inline uint32_t at_least(Vec a, Vec b) { return _mm512_cmp_ps_mask(a, b, _CMP_GE_OQ); }
// The sums of 4 vectors into out[0..4), each added in exactly _mm512_reduce_add_ps's tree (lane j with j + 8,
// then with j + 4, j + 2, j + 1), so every output has the bits sum_lanes gives it, with a third of the shuffles.
inline void store_sums_of_4(const Vec* v, float* out) {
  const Vec s01 = _mm512_add_ps(_mm512_shuffle_f32x4(v[0], v[1], _MM_SHUFFLE(1, 0, 1, 0)),
                                _mm512_shuffle_f32x4(v[0], v[1], _MM_SHUFFLE(3, 2, 3, 2)));
  const Vec s23 = _mm512_add_ps(_mm512_shuffle_f32x4(v[2], v[3], _MM_SHUFFLE(1, 0, 1, 0)),
                                _mm512_shuffle_f32x4(v[2], v[3], _MM_SHUFFLE(3, 2, 3, 2)));
  Vec z = _mm512_add_ps(_mm512_shuffle_f32x4(s01, s23, _MM_SHUFFLE(2, 0, 2, 0)),
                        _mm512_shuffle_f32x4(s01, s23, _MM_SHUFFLE(3, 1, 3, 1)));
  z = _mm512_add_ps(z, _mm512_permute_ps(z, _MM_SHUFFLE(1, 0, 3, 2)));
  z = _mm512_add_ps(z, _mm512_permute_ps(z, _MM_SHUFFLE(0, 1, 0, 1)));
  const __m512i firsts = _mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 12, 8, 4, 0);
  _mm_storeu_ps(out, _mm512_castps512_ps128(_mm512_permutexvar_ps(firsts, z)));
}
#else
using Vec = __m256;
constexpr int64_t kLanes = 8;
inline Vec load(const float* p) { return _mm256_loadu_ps(p); }
inline Vec zero() { return _mm256_setzero_ps(); }
inline Vec fma(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
inline float sum_lanes(Vec v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
inline Vec set1(float v) { return _mm256_set1_ps(v); }
inline void store(float* p, Vec v) { _mm256_storeu_ps(p, v); }
inline Vec add(Vec a, Vec b) { return _mm256_add_ps(a, b); }
inline Vec sub(Vec a, Vec b) { return _mm256_sub_ps(a, b); }
inline Vec max(Vec a, Vec b) { return _mm256_max_ps(a, b); }
inline float max_lanes(Vec v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}
inline uint32_t at_least(Vec a, Vec b) { return _mm256_movemask_ps(_mm256_cmp_ps(a, b, _CMP_GE_OQ)); }
#endif

// x . w over k floats summed as dense_linear sums every output: lane by lane over the whole vectors, then
// sum_lanes, then the rest one value at a time.
inline float dot(const float* x, const float* w, int64_t k) {
  Vec acc = zero();
  int64_t i = 0;
  for (; i + kLanes <= k; i += kLanes) acc = fma(load(w + i), load(x + i), acc);
  float s = sum_lanes(acc);
  for (; i < k; ++i) s += x[i] * w[i];
  return s;
}

// Calls f(std::integral_constant<int, rows>{}) for 1 <= rows <= MAX: a tile's rows as a template argument.
template <int MAX, typename F>
inline void with_rows(int64_t rows, const F& f) {
  if constexpr (MAX > 0) {
    if (rows == MAX) return f(std::integral_constant<int, MAX>{});
    with_rows<MAX - 1>(rows, f);
  }
}

// Calls f(rows, first) (rows an std::integral_constant) for tiles that cover input rows [0, count): as few as hold
// at most MAX rows each, their sizes differing by one at most: 32 rows by 6 as 6, 6, 5, 5, 5, 5 rather than five
// tiles of 6 and one of 2, whose 8 sums per 6 loads ran at half the others' speed (on an AMD EPYC Zen 4, a
// 32-sequence step spent 13% of its float32 tiles' time in the 2-row one).
template <int MAX, typename F>
inline void even_tiles(int64_t count, const F& f) {
  if (count <= 0) return;
  const int64_t tiles = (count + MAX - 1) / MAX, smaller = count / tiles, larger = count - tiles * smaller;
  for (int64_t t = 0, first = 0; t < tiles; ++t) {
    const int64_t rows = t < larger ? smaller + 1 : smaller;
    with_rows<MAX>(rows, [&](auto r) { f(r, first); });
    first += rows;
  }
}

}  // namespace float_vec
