// A weight in a GGUF file's own blocks (gguf_blocks.h), as gguf_linear.cpp's kernels and the decoder stack read it.
#pragma once

#include <torch/extension.h>

#include <cstdint>

// Values and bytes of one block of ggml type `type`; 0 for a type without a kernel here.
int64_t gguf_block_values(int64_t type);
int64_t gguf_block_bytes(int64_t type);

// [N, K] in blocks along K: row n's bytes at data + n * stride. Checked when built (outside parallel regions).
struct GGUFWeight {
  GGUFWeight(const torch::Tensor& raw, int64_t type, int64_t in_features);
  const uint8_t* row(int64_t i) const { return data + i * stride; }

  const uint8_t* data;
  int64_t type, k, n, stride, row_bytes;
};

// out[r * out_stride + j] = x[r] . W[first + j] for rows of x [rows, K] (at most 64), j < last - first.
void gguf_unit(const float* x, int64_t rows, const GGUFWeight& weight, int64_t first, int64_t last, float* out,
               int64_t out_stride);
// Rows [first, first + count) of the weight as float32, [count, K] at out.
void gguf_widen_rows(const GGUFWeight& weight, int64_t first, int64_t count, float* out);

torch::Tensor gguf_linear(torch::Tensor x, torch::Tensor raw, int64_t type, torch::Tensor bias, int64_t gemm_rows);
torch::Tensor gguf_dequantize(torch::Tensor raw, int64_t type, int64_t in_features);
