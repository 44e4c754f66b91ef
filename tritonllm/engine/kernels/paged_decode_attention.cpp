// Decode attention straight from the paged KV cache: one query token per sequence, keys and values read in
// place through the block table, so no gathered copy of the context is ever made.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

// A dot product the compiler can vectorize: eight independent partial sums instead of one serial chain.
static inline float dot(const float* a, const float* b, int64_t n) {
  float part[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) part[j] += a[i + j] * b[i + j];
  float sum = ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
  for (; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

// q: [B, Hq, D]; k_cache, v_cache: [num_blocks, block_size, Hkv, D]; block_tables: [B, max_blocks] int64;
// context_lens: [B] int64. Returns [B, Hq, D]. All float32, contiguous.
torch::Tensor paged_decode_attention(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache,
                                     torch::Tensor block_tables, torch::Tensor context_lens, double scale) {
  TORCH_CHECK(q.scalar_type() == torch::kFloat32 && k_cache.scalar_type() == torch::kFloat32, "float32 only");
  TORCH_CHECK(q.is_contiguous() && k_cache.is_contiguous() && v_cache.is_contiguous(), "contiguous inputs only");
  const int64_t batch = q.size(0), q_heads = q.size(1), dim = q.size(2);
  const int64_t block_size = k_cache.size(1), kv_heads = k_cache.size(2);
  const int64_t max_blocks = block_tables.size(1), group = q_heads / kv_heads;
  auto out = torch::empty_like(q);
  const float* qp = q.data_ptr<float>();
  const float* kp = k_cache.data_ptr<float>();
  const float* vp = v_cache.data_ptr<float>();
  const int64_t* tables = block_tables.data_ptr<int64_t>();
  const int64_t* lens = context_lens.data_ptr<int64_t>();
  float* op = out.data_ptr<float>();
  const float fscale = static_cast<float>(scale);

  // One task per sequence, walking its context position by position with every head at once: the cache holds
  // all heads of a position side by side, so each block is read front to back exactly once.
  at::parallel_for(0, batch, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores;
    for (int64_t b = begin; b < end; ++b) {
      const int64_t len = lens[b];
      const float* query = qp + b * q_heads * dim;
      const int64_t* table = tables + b * max_blocks;
      scores.assign(q_heads * len, 0.f);
      for (int64_t pos = 0; pos < len; ++pos) {
        const float* keys = kp + (table[pos / block_size] * block_size + pos % block_size) * kv_heads * dim;
        for (int64_t h = 0; h < q_heads; ++h) {
          scores[h * len + pos] = dot(query + h * dim, keys + (h / group) * dim, dim) * fscale;
        }
      }
      for (int64_t h = 0; h < q_heads; ++h) {
        float* row = scores.data() + h * len;
        float best = -std::numeric_limits<float>::infinity();
        for (int64_t pos = 0; pos < len; ++pos) best = std::max(best, row[pos]);
        float total = 0.f;
        for (int64_t pos = 0; pos < len; ++pos) {
          // Below e^-80 a weight is lost next to the largest (1) anyway; making it exactly 0 keeps denormals, which
          // cost a hundred cycles each, out of the exponentials and of the sums.
          const float shifted = row[pos] - best;
          row[pos] = shifted < -80.f ? 0.f : std::exp(shifted);
          total += row[pos];
        }
        for (int64_t pos = 0; pos < len; ++pos) row[pos] /= total;
      }
      float* result = op + b * q_heads * dim;
      for (int64_t i = 0; i < q_heads * dim; ++i) result[i] = 0.f;
      for (int64_t pos = 0; pos < len; ++pos) {
        const float* values = vp + (table[pos / block_size] * block_size + pos % block_size) * kv_heads * dim;
        for (int64_t h = 0; h < q_heads; ++h) {
          const float* value = values + (h / group) * dim;
          const float weight = scores[h * len + pos];
          if (weight == 0.f) continue;
          float* rh = result + h * dim;
          for (int64_t d = 0; d < dim; ++d) rh[d] += weight * value[d];
        }
      }
    }
  });
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  // The GIL is released, as ATen's own ops do, so the server's response threads run while the kernel does.
  m.def("paged_decode_attention", &paged_decode_attention, "Decode attention over a paged KV cache (CPU)",
        py::call_guard<py::gil_scoped_release>());
}
