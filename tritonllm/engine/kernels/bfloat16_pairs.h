// A bfloat16 weight packed in value pairs (pack_bfloat16_pairs, bfloat16_linear.cpp): [panels, ceil(K / 2),
// kPairPanel, 2], panel p holding rows p * kPairPanel ..., value pair i of its row j at [p, i, j], rows past N and
// an odd K's last pair zeros. vdpbf16ps multiplies a broadcast input pair by 16 rows' pairs a vector; an AMX tile
// (bfloat16_tiles.cpp) reads 16 pairs of 16 rows as one of its B tiles, 4 * kPairPanel bytes a tile row apart.
#pragma once

#include <torch/extension.h>

#include <cstdint>

constexpr int64_t kPairPanel = 48;

// Refuses `packed` unless it is pack_bfloat16_pairs of an [n, k] weight.
void check_bfloat16_pairs(const torch::Tensor& packed, int64_t n, int64_t k);

bool bfloat16_dot_available();  // vdpbf16ps (AVX512_BF16)
bool bfloat16_tiles_available();  // AMX-BF16's tiles, compiled in and granted by the kernel to this process

// Whether the tiles multiply x rows of `pairs` value pairs: granted here, and pairs a multiple of a tile's 16.
bool bfloat16_tiles_serve(int64_t pairs);

// out [rows, n] = x @ w^T for x [rows, 2 * pairs] in bfloat16 (an odd K padded with a zero) and w packed in pairs,
// where bfloat16_dot_available(): through AMX's tiles where `tiles` and bfloat16_tiles_serve(pairs), else
// vdpbf16ps.
void bfloat16_pair_products(const uint16_t* x, int64_t rows, const uint16_t* packed, int64_t n, int64_t pairs,
                            float* out, bool tiles);

// The same through AMX's tiles, where bfloat16_tiles_serve(pairs).
void bfloat16_tile_products(const uint16_t* x, int64_t rows, const uint16_t* packed, int64_t n, int64_t pairs,
                            float* out);
