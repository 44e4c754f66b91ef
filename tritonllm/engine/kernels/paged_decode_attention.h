// Decode attention over the paged KV cache, a span of query heads at a time, for callers that hand out the heads to
// threads themselves (paged_decode_attention() below, decoder_layers.cpp's phases).
#pragma once

#include <torch/extension.h>

#include <algorithm>
#include <cstdint>
#include <vector>

// q: [batch, q_heads, dim] float32; the cache [num_blocks, block_size, Hkv, dim] float32, bfloat16 or int8 (with
// float32 scales [num_blocks, block_size, Hkv]); block_tables [batch, max_blocks], context_lens [batch] int64.
// Holds pointers into them: they must outlive it.
struct DecodeAttention {
  DecodeAttention(const float* q, int64_t batch, int64_t q_heads, int64_t dim, const torch::Tensor& k_cache,
                  const torch::Tensor& v_cache, const torch::Tensor& block_tables, const torch::Tensor& context_lens,
                  double scale, int64_t window, double softcap, const torch::Tensor& k_scales,
                  const torch::Tensor& v_scales);

  // result[h * dim : (h + 1) * dim] for each query head h in [first, last) of the heads counted row after row
  // (row h / q_heads, head h % q_heads) attending over its row's context, the heads that share a KV head together;
  // each written once, at the end of its group. scratch: any vector, reused across calls.
  void heads(int64_t first, int64_t last, std::vector<float>& scratch, float* result) const {
    const int64_t group = q_heads / kv_heads;
    for (int64_t h = first; h < last;) {
      const int64_t row = h / q_heads, head = h % q_heads;
      const int64_t end = std::min(last, row * q_heads + (head / group + 1) * group);
      attend_(*this, row, head, end - h, scratch, result + h * dim);
      h = end;
    }
  }
  // Query heads a work item should take: the heads that share a KV head when there are enough groups for the
  // threads, else one.
  int64_t heads_per_item(int64_t threads) const;

  const float* q;
  int64_t batch, q_heads, dim, kv_heads, block_size, max_blocks, window;
  const int64_t* tables;
  const int64_t* lens;
  const void* k;
  const void* v;
  const float* k_scales = nullptr;
  const float* v_scales = nullptr;
  float scale, softcap;

 private:
  void (*attend_)(const DecodeAttention&, int64_t, int64_t, int64_t, std::vector<float>&, float*);
};

torch::Tensor paged_decode_attention(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache,
                                     torch::Tensor block_tables, torch::Tensor context_lens, double scale,
                                     int64_t window, double softcap, torch::Tensor k_scales, torch::Tensor v_scales);
