// The int8_activations kernel's pieces that decoder_layers.cpp's phases use: an input rounded to 8-bit blocks once,
// then units of weight rows multiplied by it.
#pragma once

#include <cstdint>
#include <vector>

#include "weight_rows.h"

// Input rows as 8-bit blocks: values [rows, K], and per block its scale and scale * sum of its values.
struct Int8Rows {
  std::vector<int8_t> values;
  std::vector<float> scales, scaled_sums;
};

// out = x [rows, k] float32, each 32-value block rounded to int8 over its scale (max |x| / 127), nearest even;
// out's vectors are reused.
void quantize_rows(const float* x, int64_t rows, int64_t k, Int8Rows& out);

// out[m * out_stride + n - first] = xq[m] . W[n] for the weight's rows first <= n < last: a chunk of
// quantized_linear_int8, or one unit of decoder_layers.cpp's phases. The weight has one scale per 32 values.
void quantized_int8_unit(const Int8Rows& xq, int64_t rows, const weight_rows::BlockWeight& weight, int64_t first,
                         int64_t last, float* out, int64_t out_stride);
