// GGUF's weight types read in place, in the file's own blocks: every row of a [N, K] weight is K / values blocks of
// `bytes` bytes each, as ggml lays them out (ggml-common.h's block_q4_0 ... block_iq4_xs). A block of 256 values
// (the K-quants, IQ4_XS) is read as eight chunks of 32, a block of 32 as one chunk.
//
// Each integer type's chunk comes out as 32 signed integers q (one byte each, value i in byte i) and, for each
// half of 16 values, a float scale and min, so that value i = scale * q[i] + min. The scale and min are the
// products gguf-py's dequantize forms (d * sub-scale, dmin * sub-min): each is exact in float32 (at most 17
// significant bits), scale * q is exact too (at most 24), so widening with one fused multiply-add gives gguf-py's
// float32 value to the bit. F16, BF16 and F32 chunks widen to their values directly.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace gguf_blocks {

// ggml's type ids (ggml.h, enum ggml_type), as a GGUF file names its tensors' types.
enum Type : int64_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kIQ4_NL = 20,
  kIQ4_XS = 23,
  kBF16 = 30,
};

constexpr int64_t kChunk = 32;

// 32 values of an integer type: value i = scale[i / 16] * q[i] + min[i / 16].
struct Chunk {
  __m256i q;
  float scale[2], min[2];
};

inline float half_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

inline uint32_t u32_at(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

inline __m256i load32(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

// 16 bytes of nibbles in ggml's order (byte j: value j in its low half, value j + 16 in its high half) -> 32 values.
inline __m256i nibbles(const uint8_t* p) {
  const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m128i mask = _mm_set1_epi8(0x0F);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(bytes, 4), mask), _mm_and_si128(bytes, mask));
}

// Byte i all ones where bit i of `bits` is set, else zero.
inline __m256i bit_bytes(uint32_t bits) {
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(static_cast<int>(bits)),
      _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
  const __m256i select = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ULL));
  return _mm256_cmpeq_epi8(_mm256_and_si256(spread, select), select);
}

// Bits [2 * g, 2 * g + 2) of each of 32 bytes.
inline __m256i crumbs(__m256i bytes, int g) {
  return _mm256_and_si256(_mm256_srl_epi16(bytes, _mm_cvtsi32_si128(2 * g)), _mm256_set1_epi8(3));
}

// IQ4_NL's and IQ4_XS's 16 values (ggml's kvalues_iq4nl), looked up by each byte's low 4 bits.
inline __m256i iq4_values(__m256i indices) {
  const __m256i table = _mm256_setr_epi8(-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
                                         -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113);
  return _mm256_shuffle_epi8(table, indices);
}

inline Chunk uniform(__m256i q, float scale, float min = 0.f) { return Chunk{q, {scale, scale}, {min, min}}; }

// The 6-bit scale and min j of a K-quant's 12 packed bytes (ggml's get_scale_min_k4).
inline void scale_min_k4(const uint8_t* s, int j, int* scale, int* min) {
  if (j < 4) {
    *scale = s[j] & 63;
    *min = s[j + 4] & 63;
  } else {
    *scale = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
    *min = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// Q3_K's sub-block scale j (0..15) from its 12 packed bytes: 4 low bits and 2 high bits, less 32.
inline int q3_k_scale(const uint8_t* s, int j) {
  const int low = (s[j % 8] >> (4 * (j / 8))) & 0xF, high = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
  return (low | (high << 4)) - 32;
}

template <Type T>
struct Format;

template <>
struct Format<kQ8_0> {  // d, 32 int8
  static constexpr int64_t kValues = 32, kBytes = 34;
  static Chunk chunk(const uint8_t* b, int) { return uniform(load32(b + 2), half_at(b)); }
};
template <>
struct Format<kQ4_0> {  // d, 16 bytes of nibbles; q - 8
  static constexpr int64_t kValues = 32, kBytes = 18;
  static Chunk chunk(const uint8_t* b, int) {
    return uniform(_mm256_sub_epi8(nibbles(b + 2), _mm256_set1_epi8(8)), half_at(b));
  }
};
template <>
struct Format<kQ4_1> {  // d, m, 16 bytes of nibbles
  static constexpr int64_t kValues = 32, kBytes = 20;
  static Chunk chunk(const uint8_t* b, int) { return uniform(nibbles(b + 4), half_at(b), half_at(b + 2)); }
};
template <>
struct Format<kQ5_0> {  // d, 32 fifth bits, 16 bytes of nibbles; q - 16
  static constexpr int64_t kValues = 32, kBytes = 22;
  static Chunk chunk(const uint8_t* b, int) {
    const __m256i q = _mm256_or_si256(nibbles(b + 6), _mm256_and_si256(bit_bytes(u32_at(b + 2)), _mm256_set1_epi8(16)));
    return uniform(_mm256_sub_epi8(q, _mm256_set1_epi8(16)), half_at(b));
  }
};
template <>
struct Format<kQ5_1> {  // d, m, 32 fifth bits, 16 bytes of nibbles
  static constexpr int64_t kValues = 32, kBytes = 24;
  static Chunk chunk(const uint8_t* b, int) {
    const __m256i q = _mm256_or_si256(nibbles(b + 8), _mm256_and_si256(bit_bytes(u32_at(b + 4)), _mm256_set1_epi8(16)));
    return uniform(q, half_at(b), half_at(b + 2));
  }
};
template <>
struct Format<kIQ4_NL> {  // d, 16 bytes of nibbles indexing kvalues_iq4nl
  static constexpr int64_t kValues = 32, kBytes = 18;
  static Chunk chunk(const uint8_t* b, int) { return uniform(iq4_values(nibbles(b + 2)), half_at(b)); }
};
template <>
struct Format<kQ2_K> {  // 16 scale|min nibbles, 64 bytes of 2-bit values, d, dmin
  static constexpr int64_t kValues = 256, kBytes = 84;
  static Chunk chunk(const uint8_t* b, int c) {
    const float d = half_at(b + 80), dmin = half_at(b + 82);
    Chunk out{crumbs(load32(b + 16 + 32 * (c / 4)), c % 4), {}, {}};
    for (int h = 0; h < 2; ++h) {
      const uint8_t s = b[2 * c + h];
      out.scale[h] = d * static_cast<float>(s & 0xF);
      out.min[h] = -(dmin * static_cast<float>(s >> 4));
    }
    return out;
  }
};
template <>
struct Format<kQ3_K> {  // 32 bytes of high bits, 64 bytes of 2-bit values, 12 bytes of 6-bit scales, d
  static constexpr int64_t kValues = 256, kBytes = 110;
  static Chunk chunk(const uint8_t* b, int c) {
    const float d = half_at(b + 108);
    const __m256i low = crumbs(load32(b + 32 + 32 * (c / 4)), c % 4);
    const __m256i bit = _mm256_set1_epi8(static_cast<char>(1 << c));
    const __m256i clear = _mm256_cmpeq_epi8(_mm256_and_si256(load32(b), bit), _mm256_setzero_si256());
    Chunk out{_mm256_sub_epi8(low, _mm256_and_si256(clear, _mm256_set1_epi8(4))), {}, {0.f, 0.f}};
    for (int h = 0; h < 2; ++h) out.scale[h] = d * static_cast<float>(q3_k_scale(b + 96, 2 * c + h));
    return out;
  }
};
template <>
struct Format<kQ4_K> {  // d, dmin, 12 bytes of 6-bit scales and mins, 128 bytes of nibbles
  static constexpr int64_t kValues = 256, kBytes = 144;
  static Chunk chunk(const uint8_t* b, int c) {
    int scale, min;
    scale_min_k4(b + 4, c, &scale, &min);
    const __m256i bytes = load32(b + 16 + 32 * (c / 2));
    const __m256i q = _mm256_and_si256(c % 2 ? _mm256_srli_epi16(bytes, 4) : bytes, _mm256_set1_epi8(0x0F));
    return uniform(q, half_at(b) * static_cast<float>(scale), -(half_at(b + 2) * static_cast<float>(min)));
  }
};
template <>
struct Format<kQ5_K> {  // d, dmin, 12 bytes of 6-bit scales and mins, 32 bytes of fifth bits, 128 bytes of nibbles
  static constexpr int64_t kValues = 256, kBytes = 176;
  static Chunk chunk(const uint8_t* b, int c) {
    int scale, min;
    scale_min_k4(b + 4, c, &scale, &min);
    const __m256i bytes = load32(b + 48 + 32 * (c / 2));
    const __m256i low = _mm256_and_si256(c % 2 ? _mm256_srli_epi16(bytes, 4) : bytes, _mm256_set1_epi8(0x0F));
    const __m256i bit = _mm256_set1_epi8(static_cast<char>(1 << c));
    const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(load32(b + 16), bit), bit);
    const __m256i q = _mm256_or_si256(low, _mm256_and_si256(set, _mm256_set1_epi8(16)));
    return uniform(q, half_at(b) * static_cast<float>(scale), -(half_at(b + 2) * static_cast<float>(min)));
  }
};
template <>
struct Format<kQ6_K> {  // 128 bytes of low nibbles, 64 bytes of high 2 bits, 16 int8 scales, d; q - 32
  static constexpr int64_t kValues = 256, kBytes = 210;
  static Chunk chunk(const uint8_t* b, int c) {
    const int half = c / 4, g = c % 4;
    const __m256i bytes = load32(b + 64 * half + 32 * (g & 1));
    const __m256i low = _mm256_and_si256(g >= 2 ? _mm256_srli_epi16(bytes, 4) : bytes, _mm256_set1_epi8(0x0F));
    const __m256i high = _mm256_slli_epi16(crumbs(load32(b + 128 + 32 * half), g), 4);
    const __m256i q = _mm256_sub_epi8(_mm256_or_si256(low, high), _mm256_set1_epi8(32));
    const float d = half_at(b + 208);
    const int8_t* scales = reinterpret_cast<const int8_t*>(b + 192 + 8 * half + 2 * g);
    return Chunk{q, {d * static_cast<float>(scales[0]), d * static_cast<float>(scales[1])}, {0.f, 0.f}};
  }
};
template <>
struct Format<kIQ4_XS> {  // d, 16 high scale bits, 4 bytes of low scale nibbles, 128 bytes of nibbles
  static constexpr int64_t kValues = 256, kBytes = 136;
  static Chunk chunk(const uint8_t* b, int c) {
    uint16_t high;
    std::memcpy(&high, b + 2, 2);
    const int ls = ((b[4 + c / 2] >> (4 * (c % 2))) & 0xF) | (((high >> (2 * c)) & 3) << 4);
    return uniform(iq4_values(nibbles(b + 8 + 16 * c)), half_at(b) * static_cast<float>(ls - 32));
  }
};
// The float types, as blocks of 32 values: their chunks widen without a Chunk (gguf_linear.cpp's widen).
template <>
struct Format<kF16> {
  static constexpr int64_t kValues = 32, kBytes = 64;
};
template <>
struct Format<kBF16> {
  static constexpr int64_t kValues = 32, kBytes = 64;
};
template <>
struct Format<kF32> {
  static constexpr int64_t kValues = 32, kBytes = 128;
};

// Calls f(Format<T>{}-typed constant) for the runtime type id; false when the id is not one read here.
template <typename F>
inline bool with_type(int64_t type, const F& f) {
  switch (type) {
#define GGUF_BLOCKS_CASE(T) \
  case T:                   \
    f(std::integral_constant<Type, T>{}); \
    return true;
    GGUF_BLOCKS_CASE(kF32)
    GGUF_BLOCKS_CASE(kF16)
    GGUF_BLOCKS_CASE(kBF16)
    GGUF_BLOCKS_CASE(kQ4_0)
    GGUF_BLOCKS_CASE(kQ4_1)
    GGUF_BLOCKS_CASE(kQ5_0)
    GGUF_BLOCKS_CASE(kQ5_1)
    GGUF_BLOCKS_CASE(kQ8_0)
    GGUF_BLOCKS_CASE(kQ2_K)
    GGUF_BLOCKS_CASE(kQ3_K)
    GGUF_BLOCKS_CASE(kQ4_K)
    GGUF_BLOCKS_CASE(kQ5_K)
    GGUF_BLOCKS_CASE(kQ6_K)
    GGUF_BLOCKS_CASE(kIQ4_NL)
    GGUF_BLOCKS_CASE(kIQ4_XS)
#undef GGUF_BLOCKS_CASE
    default:
      return false;
  }
}

}  // namespace gguf_blocks
