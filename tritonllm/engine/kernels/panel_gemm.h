// The GEMM for prompt-sized inputs (panel_gemm.cpp), for kernels that keep their weights in other forms.
#pragma once

#include <cstdint>
#include <functional>

// weight_rows(first, count, scratch): rows [first, first + count) of the weight as float32 [count, k], either where
// they lie or widened into scratch, which has room for them (count is at most a panel's width).
using WeightRows = std::function<const float*(int64_t first, int64_t count, float* scratch)>;

// out [rows, n] = x [rows, k] @ W^T + bias (null for none), W [n, k] read through weight_rows a panel at a time.
void panel_gemm(const float* x, int64_t rows, int64_t k, int64_t n, const float* bias, float* out,
                const WeightRows& weight_rows);
