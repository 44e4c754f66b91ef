// The argument checks that the linear kernels share, each failure naming the argument.
#pragma once

#include <torch/extension.h>

#include <cstdint>

// Refuses a bias that is neither empty nor [n] float32.
inline void check_bias(const torch::Tensor& bias, int64_t n) {
  TORCH_CHECK(bias.numel() == 0 || (bias.numel() == n && bias.scalar_type() == torch::kFloat32 && bias.is_contiguous()),
              "bias: [N] float32");
}

// x: [M, K] float32, contiguous; weight: [N, K] float32, contiguous; bias: [N] or empty.
inline void check_float_linear(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat32 && x.is_contiguous(), "x: contiguous [M, K] float32");
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == torch::kFloat32 && weight.is_contiguous(),
              "weight: contiguous [N, K] float32");
  TORCH_CHECK(weight.size(1) == x.size(1), "x and weight differ in K");
  check_bias(bias, weight.size(0));
}
