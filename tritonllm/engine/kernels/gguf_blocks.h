// GGUF's weight types read in place, in the file's own blocks: every row of a [N, K] weight is K / values blocks of
// `bytes` bytes each, as ggml lays them out (ggml-common.h's block_q4_0 ... block_iq4_xs). A block of 256 values
// (the K-quants, IQ4_XS) is read as eight chunks of 32, a block of 32 as one chunk.
//
// Each integer type's block is read in two parts: its scales, once a block (`scales`: a float scale and min for
// every 16 values), and each 32-value chunk's integers (`ints`: 32 signed bytes, value i in byte i), so that value i
// of half h = s[h] * q[i] + m[h]. The scales and mins are the products gguf-py's dequantize forms (d * sub-scale,
// dmin * sub-min, or a type's constant offset times d): each is exact in float32 (at most 17 significant bits), and
// so is s * q (at most 24), so widening with one fused multiply-add gives gguf-py's float32 value to the bit. The
// 4-bit types whose 32-value chunks lie in 16 bytes (values 0..15 in their low nibbles, 16..31 in their high ones)
// also name those bytes (`nibble_bytes`), for kernels that look their 16 possible values up in a table instead of
// converting each (kTable). F16, BF16 and F32 widen to their values directly.
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

// How a type's 16 possible 4-bit values are tabled: none (its values are converted), scale * i + min, or scale times
// IQ4_NL's 16 values (ggml's kvalues_iq4nl).
enum class Table { kNone, kAffine, kIQ4 };
constexpr float kIQ4Values[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

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

// The low (odd = false) or high 4 bits of each of 32 bytes.
inline __m256i nibble_run(const uint8_t* p, bool odd) {
  const __m256i bytes = load32(p);
  return _mm256_and_si256(odd ? _mm256_srli_epi16(bytes, 4) : bytes, _mm256_set1_epi8(0x0F));
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

// Byte i all ones where bit `bit` of byte i of `bytes` is set, else zero.
inline __m256i bit_set(__m256i bytes, int bit) {
  const __m256i select = _mm256_set1_epi8(static_cast<char>(1 << bit));
  return _mm256_cmpeq_epi8(_mm256_and_si256(bytes, select), select);
}

// Byte i is 16 where bit `bit` of byte i of `bytes` is set, else 0.
inline __m256i fifth_bits(__m256i bytes, int bit) { return _mm256_and_si256(bit_set(bytes, bit), _mm256_set1_epi8(16)); }

// IQ4_NL's and IQ4_XS's values, looked up by each byte's low 4 bits.
inline __m256i iq4_values(__m256i indices) {
  const __m256i table = _mm256_setr_epi8(-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
                                         -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113);
  return _mm256_shuffle_epi8(table, indices);
}

// A 32-value block's one scale and min, for both halves.
inline void uniform(float* s, float* m, float scale, float min) {
  s[0] = s[1] = scale;
  m[0] = m[1] = min;
}

// Q4_K's and Q5_K's scales: d * scale and -(dmin * min) of each 32-value sub-block, for both its halves. The 12
// bytes unpacked into 8 scales and 8 mins as llama.cpp's dot products unpack them (get_scale_min_k4 for all 8 at
// once), each widened, multiplied and duplicated for the two halves 8 at a time.
inline void k4_scales(const uint8_t* b, float* s, float* m) {
  uint32_t packed[3], scales[2], mins[2];
  std::memcpy(packed, b + 4, 12);
  scales[0] = packed[0] & 0x3f3f3f3f;
  scales[1] = (packed[2] & 0x0f0f0f0f) | (((packed[0] >> 6) & 0x03030303) << 4);
  mins[0] = packed[1] & 0x3f3f3f3f;
  mins[1] = ((packed[2] >> 4) & 0x0f0f0f0f) | (((packed[1] >> 6) & 0x03030303) << 4);
  const auto eight = [](const uint32_t* bytes) {
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(bytes))));
  };
  const __m256 scale = _mm256_mul_ps(_mm256_set1_ps(half_at(b)), eight(scales));
  const __m256 min = _mm256_sub_ps(_mm256_setzero_ps(), _mm256_mul_ps(_mm256_set1_ps(half_at(b + 2)), eight(mins)));
  const __m256i first = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3), second = _mm256_setr_epi32(4, 4, 5, 5, 6, 6, 7, 7);
  _mm256_storeu_ps(s, _mm256_permutevar8x32_ps(scale, first));
  _mm256_storeu_ps(s + 8, _mm256_permutevar8x32_ps(scale, second));
  _mm256_storeu_ps(m, _mm256_permutevar8x32_ps(min, first));
  _mm256_storeu_ps(m + 8, _mm256_permutevar8x32_ps(min, second));
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
  static constexpr Table kTable = Table::kNone;
  static void scales(const uint8_t* b, float* s, float* m) { uniform(s, m, half_at(b), 0.f); }
  static __m256i ints(const uint8_t* b, int) { return load32(b + 2); }
};
template <>
struct Format<kQ4_0> {  // d, 16 bytes of nibbles; d * (q - 8)
  static constexpr int64_t kValues = 32, kBytes = 18;
  static constexpr Table kTable = Table::kAffine;
  static void scales(const uint8_t* b, float* s, float* m) { uniform(s, m, half_at(b), -8.f * half_at(b)); }
  static __m256i ints(const uint8_t* b, int) { return nibbles(b + 2); }
  static const uint8_t* nibble_bytes(const uint8_t* b, int) { return b + 2; }
};
template <>
struct Format<kQ4_1> {  // d, m, 16 bytes of nibbles
  static constexpr int64_t kValues = 32, kBytes = 20;
  static constexpr Table kTable = Table::kAffine;
  static void scales(const uint8_t* b, float* s, float* m) { uniform(s, m, half_at(b), half_at(b + 2)); }
  static __m256i ints(const uint8_t* b, int) { return nibbles(b + 4); }
  static const uint8_t* nibble_bytes(const uint8_t* b, int) { return b + 4; }
};
template <>
struct Format<kIQ4_NL> {  // d, 16 bytes of nibbles indexing kvalues_iq4nl
  static constexpr int64_t kValues = 32, kBytes = 18;
  static constexpr Table kTable = Table::kIQ4;
  static void scales(const uint8_t* b, float* s, float* m) { uniform(s, m, half_at(b), 0.f); }
  static __m256i ints(const uint8_t* b, int) { return iq4_values(nibbles(b + 2)); }
  static const uint8_t* nibble_bytes(const uint8_t* b, int) { return b + 2; }
};
template <>
struct Format<kQ5_0> {  // d, 32 fifth bits, 16 bytes of nibbles; d * (q - 16)
  static constexpr int64_t kValues = 32, kBytes = 22;
  static constexpr Table kTable = Table::kNone;
  static void scales(const uint8_t* b, float* s, float* m) { uniform(s, m, half_at(b), -16.f * half_at(b)); }
  static __m256i ints(const uint8_t* b, int) {
    return _mm256_or_si256(nibbles(b + 6), _mm256_and_si256(bit_bytes(u32_at(b + 2)), _mm256_set1_epi8(16)));
  }
};
template <>
struct Format<kQ5_1> {  // d, m, 32 fifth bits, 16 bytes of nibbles
  static constexpr int64_t kValues = 32, kBytes = 24;
  static constexpr Table kTable = Table::kNone;
  static void scales(const uint8_t* b, float* s, float* m) { uniform(s, m, half_at(b), half_at(b + 2)); }
  static __m256i ints(const uint8_t* b, int) {
    return _mm256_or_si256(nibbles(b + 8), _mm256_and_si256(bit_bytes(u32_at(b + 4)), _mm256_set1_epi8(16)));
  }
};
template <>
struct Format<kQ2_K> {  // 16 scale|min nibbles, 64 bytes of 2-bit values, d, dmin
  static constexpr int64_t kValues = 256, kBytes = 84;
  static constexpr Table kTable = Table::kNone;
  static void scales(const uint8_t* b, float* s, float* m) {
    const float d = half_at(b + 80), dmin = half_at(b + 82);
    for (int h = 0; h < 16; ++h) {
      s[h] = d * static_cast<float>(b[h] & 0xF);
      m[h] = -(dmin * static_cast<float>(b[h] >> 4));
    }
  }
  static __m256i ints(const uint8_t* b, int c) { return crumbs(load32(b + 16 + 32 * (c / 4)), c % 4); }
};
template <>
struct Format<kQ3_K> {  // 32 bytes of high bits, 64 bytes of 2-bit values, 12 bytes of 6-bit scales, d
  static constexpr int64_t kValues = 256, kBytes = 110;
  static constexpr Table kTable = Table::kNone;
  static void scales(const uint8_t* b, float* s, float* m) {
    const float d = half_at(b + 108);
    for (int h = 0; h < 16; ++h) {
      s[h] = d * static_cast<float>(q3_k_scale(b + 96, h));
      m[h] = 0.f;
    }
  }
  static __m256i ints(const uint8_t* b, int c) {  // the 2 low bits, less 4 where the high bit is clear
    const __m256i low = crumbs(load32(b + 32 + 32 * (c / 4)), c % 4);
    return _mm256_sub_epi8(low, _mm256_andnot_si256(bit_set(load32(b), c), _mm256_set1_epi8(4)));
  }
};
template <>
struct Format<kQ4_K> {  // d, dmin, 12 bytes of 6-bit scales and mins, 128 bytes of nibbles
  static constexpr int64_t kValues = 256, kBytes = 144;
  static constexpr Table kTable = Table::kAffine;
  static void scales(const uint8_t* b, float* s, float* m) { k4_scales(b, s, m); }
  static __m256i ints(const uint8_t* b, int c) { return nibble_run(b + 16 + 32 * (c / 2), c % 2); }
};
template <>
struct Format<kQ5_K> {  // d, dmin, 12 bytes of 6-bit scales and mins, 32 bytes of fifth bits, 128 bytes of nibbles
  static constexpr int64_t kValues = 256, kBytes = 176;
  static constexpr Table kTable = Table::kNone;
  static void scales(const uint8_t* b, float* s, float* m) { k4_scales(b, s, m); }
  static __m256i ints(const uint8_t* b, int c) {
    return _mm256_or_si256(nibble_run(b + 48 + 32 * (c / 2), c % 2), fifth_bits(load32(b + 16), c));
  }
};
template <>
struct Format<kQ6_K> {  // 128 bytes of low nibbles, 64 bytes of high 2 bits, 16 int8 scales, d; q - 32
  static constexpr int64_t kValues = 256, kBytes = 210;
  static constexpr Table kTable = Table::kNone;
  static void scales(const uint8_t* b, float* s, float* m) {
    const float d = half_at(b + 208);
    const int8_t* sub = reinterpret_cast<const int8_t*>(b + 192);
    // chunk c = 4 * half + g holds sub-scales 8 * half + 2 * g and the next, in ggml's order
    for (int h = 0; h < 16; ++h) {
      s[h] = d * static_cast<float>(sub[h]);
      m[h] = 0.f;
    }
  }
  static __m256i ints(const uint8_t* b, int c) {
    const int half = c / 4, g = c % 4;
    const __m256i low = nibble_run(b + 64 * half + 32 * (g & 1), g >= 2);
    const __m256i high = _mm256_slli_epi16(crumbs(load32(b + 128 + 32 * half), g), 4);
    return _mm256_sub_epi8(_mm256_or_si256(low, high), _mm256_set1_epi8(32));
  }
#if defined(__AVX512BW__)
  // All 256 integers into q, 64 at a time: chunks g and g + 1 of a half take the low (g = 0) or high (g = 2)
  // nibbles of its 64 bytes, and their high bits from the same 32 bytes shifted by 2g and 2g + 2.
  static void unpack(const uint8_t* b, int8_t* q) {
    const __m512i mask4 = _mm512_set1_epi8(0x0F), mask2 = _mm512_set1_epi8(3), offset = _mm512_set1_epi8(32);
    for (int half = 0; half < 2; ++half) {
      const __m512i low = _mm512_loadu_si512(b + 64 * half);
      const __m512i high = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 128 + 32 * half)));
      for (int g = 0; g < 4; g += 2) {
        const __m512i nibbles = _mm512_and_si512(g ? _mm512_srli_epi16(low, 4) : low, mask4);
        const __m512i shifts = _mm512_inserti64x4(_mm512_set1_epi16(static_cast<int16_t>(2 * g)),
                                                  _mm256_set1_epi16(static_cast<int16_t>(2 * g + 2)), 1);
        const __m512i bits = _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(high, shifts), mask2), 4);
        _mm512_storeu_si512(q + 128 * half + 32 * g, _mm512_sub_epi8(_mm512_or_si512(nibbles, bits), offset));
      }
    }
  }
#endif
};
template <>
struct Format<kIQ4_XS> {  // d, 16 high scale bits, 4 bytes of low scale nibbles, 128 bytes of nibbles
  static constexpr int64_t kValues = 256, kBytes = 136;
  static constexpr Table kTable = Table::kIQ4;
  static void scales(const uint8_t* b, float* s, float* m) {
    const float d = half_at(b);
    uint16_t high;
    std::memcpy(&high, b + 2, 2);
    for (int c = 0; c < 8; ++c) {
      const int ls = ((b[4 + c / 2] >> (4 * (c % 2))) & 0xF) | (((high >> (2 * c)) & 3) << 4);
      s[2 * c] = s[2 * c + 1] = d * static_cast<float>(ls - 32);
      m[2 * c] = m[2 * c + 1] = 0.f;
    }
  }
  static __m256i ints(const uint8_t* b, int c) { return iq4_values(nibbles(b + 8 + 16 * c)); }
  static const uint8_t* nibble_bytes(const uint8_t* b, int c) { return b + 8 + 16 * c; }
};
// The float types, as blocks of 32 values: their chunks widen directly (gguf_linear.cpp's widen).
template <>
struct Format<kF16> {
  static constexpr int64_t kValues = 32, kBytes = 64;
  static constexpr Table kTable = Table::kNone;
};
template <>
struct Format<kBF16> {
  static constexpr int64_t kValues = 32, kBytes = 64;
  static constexpr Table kTable = Table::kNone;
};
template <>
struct Format<kF32> {
  static constexpr int64_t kValues = 32, kBytes = 128;
  static constexpr Table kTable = Table::kNone;
};

template <Type T>
constexpr bool kFloat = T == kF16 || T == kBF16 || T == kF32;

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
