// A step's whole decoder stack of a Llama-family model in one native call, every fed token a query row of its own
// (one per sequence in a decode step, a prompt chunk's tokens side by side in a prefill): per layer, RMSNorm, the
// fused q/k/v projection, rotary embedding, the new K/V written into the paged cache, attention read in place
// (each row sees its sequence's cache up to its own position, so a chunk's rows are causal), the output
// projection and residual, RMSNorm, the fused gate/up projection, SiLU(gate) * up, the down projection and
// residual. Each projection is float32 or GGUF blocks, as the model loaded it. It computes what transformers'
// LlamaDecoderLayer computes, op for op, in float32; the Python side (native_decode.py) decides which models and
// steps it serves and checks it against transformers at load. Without it, a step of SmolLM2 makes some 2,000
// small tensor ops and 300 module calls from Python: a third of a one-sequence step, and some 50 ms of any step
// that carries a prompt chunk.
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__) && defined(__AVX512VL__)
#define CPU_CAPABILITY_AVX512
#elif defined(__AVX2__) && defined(__FMA__)
#define CPU_CAPABILITY_AVX2
#endif

#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

torch::Tensor dense_linear(torch::Tensor x, torch::Tensor weight, torch::Tensor bias);
torch::Tensor quantized_linear(torch::Tensor x, torch::Tensor qweight, torch::Tensor scales, torch::Tensor mins,
                               int64_t bits);
torch::Tensor quantized_linear_int8(torch::Tensor x, torch::Tensor qweight, torch::Tensor scales, torch::Tensor mins,
                                    int64_t bits);
torch::Tensor dequantize(torch::Tensor qweight, torch::Tensor scales, torch::Tensor mins, int64_t bits);
torch::Tensor paged_decode_attention(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache,
                                     torch::Tensor block_tables, torch::Tensor context_lens, double scale,
                                     int64_t window, double softcap, torch::Tensor k_scales, torch::Tensor v_scales);

namespace {

using Vec = at::vec::Vectorized<float>;

constexpr int64_t kRowsPerTask = 16;  // rows of the element-wise work a thread takes at a time (a prefill's many)

// out = weight * (x / sqrt(mean(x^2) + eps)), row by row.
// One KV head's vector of `dim` values into an int8 cache: each value over its scale (the largest magnitude / 127),
// rounded to nearest even, as paged_attention.quantize_heads does in PyTorch.
void quantize_head(const float* x, int64_t dim, int8_t* out, float* scale) {
  float largest = 0.f;
  for (int64_t d = 0; d < dim; ++d) largest = std::max(largest, std::fabs(x[d]));
  const float s = largest / 127.f;
  *scale = s;
  for (int64_t d = 0; d < dim; ++d)
    out[d] = s > 0.f ? static_cast<int8_t>(std::clamp(std::nearbyint(x[d] / s), -127.f, 127.f)) : 0;
}

void rms_norm(const torch::Tensor& x, const torch::Tensor& weight, float eps, torch::Tensor& out) {
  const int64_t n = x.size(1);
  const float* w = weight.data_ptr<float>();
  at::parallel_for(0, x.size(0), kRowsPerTask, [&](int64_t first, int64_t last) {
    for (int64_t r = first; r < last; ++r) {
      const float* in = x.data_ptr<float>() + r * n;
      float* o = out.data_ptr<float>() + r * n;
      const float squares = at::vec::map_reduce_all<float>([](Vec v) { return v * v; },
                                                            [](Vec a, Vec b) { return a + b; }, in, n);
      const float inverse = 1.f / std::sqrt(squares / n + eps);
      for (int64_t i = 0; i < n; ++i) o[i] = w[i] * (in[i] * inverse);
    }
  });
}

// x * cos + rotate_half(x) * sin for each head of one token, rotate_half(x) = (-x[half:], x[:half]).
void rotate(float* x, const float* cos, const float* sin, int64_t heads, int64_t dim) {
  const int64_t half = dim / 2;
  for (int64_t h = 0; h < heads; ++h) {
    float* v = x + h * dim;
    for (int64_t i = 0; i < half; ++i) {
      const float a = v[i], b = v[i + half];
      v[i] = a * cos[i] + -b * sin[i];
      v[i + half] = b * cos[i + half] + a * sin[i + half];
    }
  }
}

// out[r] = silu(gate_up[r, :n]) * gate_up[r, n:], silu(g) = g / (1 + exp(-g)).
void silu_and_mul(const torch::Tensor& gate_up, torch::Tensor& out) {
  const int64_t n = out.size(1);
  at::parallel_for(0, out.size(0), kRowsPerTask, [&](int64_t first, int64_t last) {
    for (int64_t r = first; r < last; ++r) {
      const float* gate = gate_up.data_ptr<float>() + r * 2 * n;
      const float* up = gate + n;
      float* o = out.data_ptr<float>() + r * n;
      at::vec::map2([](Vec g, Vec u) { return g / (Vec(1.f) + g.neg().exp()) * u; }, o, gate, up, n);
    }
  });
}

}  // namespace

// How many rows a projection takes before the BLAS GEMM does better than the project's kernels (native_linear.py's
// NATIVE_ROWS for float32, quantized_linear.py's GEMM_ROWS for blocks, which are widened to float32 for it).
struct GemmRows {
  int64_t dense = 64, quantized = 512;
};

// One linear layer: float32 weights [N, K] (bits 0), or GGUF blocks of 8 or 4 bits as quantized_linear.cpp
// reads them (with int8: the input rounded to 8 bits, quantized_linear_int8.cpp). An empty bias stands for none.
struct Projection {
  torch::Tensor weight, scales, mins, bias;
  int64_t bits = 0;
  bool int8 = false;

  torch::Tensor operator()(const torch::Tensor& x, const GemmRows& gemm) const {
    const int64_t rows = x.size(0);
    if (bits == 0 && rows > gemm.dense) return bias.numel() ? at::linear(x, weight, bias) : at::linear(x, weight);
    if (bits == 0) return dense_linear(x, weight, bias);
    if (rows >= gemm.quantized) {
      const torch::Tensor widened = dequantize(weight, scales, mins, bits);
      return bias.numel() ? at::linear(x, widened, bias) : at::linear(x, widened);
    }
    torch::Tensor out = (int8 ? quantized_linear_int8 : quantized_linear)(x, weight, scales, mins, bits);
    if (bias.numel()) out.add_(bias);
    return out;
  }
};

// The projections of one input, their outputs side by side: [q | k | v], or [gate | up]. One projection when
// the model's weights were fused (fused_projections.py), else each of its own.
torch::Tensor project(const std::vector<Projection>& parts, const torch::Tensor& x, const GemmRows& gemm) {
  if (parts.size() == 1) return parts[0](x, gemm);
  std::vector<torch::Tensor> outs;
  for (const Projection& part : parts) outs.push_back(part(x, gemm));
  return torch::cat(outs, 1);
}

struct DecoderLayers {
  // Per layer.
  std::vector<torch::Tensor> input_norm, post_norm, k_cache, v_cache;
  std::vector<torch::Tensor> k_scales, v_scales;  // an int8 cache's, per layer; empty tensors otherwise
  std::vector<std::vector<Projection>> qkv, gate_up;
  std::vector<Projection> o, down;
  int64_t heads, kv_heads, dim;
  double eps, scale;
  GemmRows gemm;

  // hidden: [B, H], B fed tokens; cos, sin: [B, dim]; slots: [B] cache slot of each token; block_tables
  // [B, max_blocks] (each row its sequence's table) and context_lens [B] (each row's position + 1) as
  // paged_decode_attention takes them. Returns the last layer's output [B, H] (before the model's final norm).
  torch::Tensor forward(torch::Tensor hidden, torch::Tensor cos, torch::Tensor sin, torch::Tensor slots,
                        torch::Tensor block_tables, torch::Tensor context_lens) const {
    TORCH_CHECK(hidden.dim() == 2 && hidden.scalar_type() == torch::kFloat32, "hidden: [B, H] float32");
    TORCH_CHECK(cos.is_contiguous() && sin.is_contiguous() && cos.size(1) == dim, "cos, sin: contiguous [B, dim]");
    TORCH_CHECK(slots.scalar_type() == torch::kLong && slots.numel() == hidden.size(0), "slots: [B] int64");
    const int64_t batch = hidden.size(0), q_size = heads * dim, kv_size = kv_heads * dim;
    const int64_t intermediate = down[0].bits ? down[0].weight.size(1) * 8 / down[0].bits : down[0].weight.size(1);
    torch::Tensor x = hidden.contiguous().clone();  // the residual stream
    torch::Tensor normed = torch::empty_like(x);
    torch::Tensor activated = torch::empty({batch, intermediate}, x.options());
    const int64_t* slot = slots.data_ptr<int64_t>();
    for (size_t l = 0; l < qkv.size(); ++l) {
      rms_norm(x, input_norm[l], static_cast<float>(eps), normed);
      torch::Tensor projected = project(qkv[l], normed, gemm);  // [B, q | k | v]
      float* p = projected.data_ptr<float>();
      const auto kv = k_cache[l].scalar_type();
      // Every row's key and value go into the cache before any row attends: a prompt chunk's later rows see its
      // earlier ones there. A bfloat16 cache takes them rounded to nearest even, as torch's .to() rounds.
      at::parallel_for(0, batch, kRowsPerTask, [&](int64_t first, int64_t last) {
        for (int64_t b = first; b < last; ++b) {
          float* row = p + b * (q_size + 2 * kv_size);
          rotate(row, cos.data_ptr<float>() + b * dim, sin.data_ptr<float>() + b * dim, heads, dim);
          rotate(row + q_size, cos.data_ptr<float>() + b * dim, sin.data_ptr<float>() + b * dim, kv_heads, dim);
          if (kv == torch::kChar) {
            for (int64_t h = 0; h < kv_heads; ++h) {
              const int64_t cell = slot[b] * kv_heads + h;
              quantize_head(row + q_size + h * dim, dim, k_cache[l].data_ptr<int8_t>() + cell * dim,
                            k_scales[l].data_ptr<float>() + cell);
              quantize_head(row + q_size + kv_size + h * dim, dim, v_cache[l].data_ptr<int8_t>() + cell * dim,
                            v_scales[l].data_ptr<float>() + cell);
            }
          } else if (kv == torch::kBFloat16) {
            std::copy(row + q_size, row + q_size + kv_size, k_cache[l].data_ptr<at::BFloat16>() + slot[b] * kv_size);
            std::copy(row + q_size + kv_size, row + q_size + 2 * kv_size,
                      v_cache[l].data_ptr<at::BFloat16>() + slot[b] * kv_size);
          } else {
            std::copy(row + q_size, row + q_size + kv_size, k_cache[l].data_ptr<float>() + slot[b] * kv_size);
            std::copy(row + q_size + kv_size, row + q_size + 2 * kv_size,
                      v_cache[l].data_ptr<float>() + slot[b] * kv_size);
          }
        }
      });
      torch::Tensor q = projected.narrow(1, 0, q_size).contiguous().view({batch, heads, dim});
      torch::Tensor attended =
          paged_decode_attention(q, k_cache[l], v_cache[l], block_tables, context_lens, scale, 0, 0.0,
                                 k_scales[l], v_scales[l]);
      x.add_(o[l](attended.view({batch, q_size}), gemm));
      rms_norm(x, post_norm[l], static_cast<float>(eps), normed);
      silu_and_mul(project(gate_up[l], normed, gemm), activated);
      x.add_(down[l](activated, gemm));
    }
    return x;
  }
};

void bind_decoder_layers(pybind11::module& m) {
  namespace py = pybind11;
  py::class_<Projection>(m, "Projection", "A linear layer for DecoderLayers: float32, or GGUF blocks of 8 or 4 bits")
      .def(py::init([](torch::Tensor weight, torch::Tensor scales, torch::Tensor mins, torch::Tensor bias,
                       int64_t bits, bool int8) { return Projection{weight, scales, mins, bias, bits, int8}; }),
           py::arg("weight"), py::arg("scales"), py::arg("mins"), py::arg("bias"), py::arg("bits"), py::arg("int8"));
  py::class_<DecoderLayers>(m, "DecoderLayers", "A Llama-family decoder stack for a step's fed tokens (CPU, float32)")
      .def(py::init<>())
      .def_readwrite("input_norm", &DecoderLayers::input_norm)
      .def_readwrite("post_norm", &DecoderLayers::post_norm)
      .def_readwrite("qkv", &DecoderLayers::qkv)
      .def_readwrite("o", &DecoderLayers::o)
      .def_readwrite("gate_up", &DecoderLayers::gate_up)
      .def_readwrite("down", &DecoderLayers::down)
      .def_readwrite("k_cache", &DecoderLayers::k_cache)
      .def_readwrite("v_cache", &DecoderLayers::v_cache)
      .def_readwrite("k_scales", &DecoderLayers::k_scales)
      .def_readwrite("v_scales", &DecoderLayers::v_scales)
      .def_readwrite("heads", &DecoderLayers::heads)
      .def_readwrite("kv_heads", &DecoderLayers::kv_heads)
      .def_readwrite("dim", &DecoderLayers::dim)
      .def_readwrite("eps", &DecoderLayers::eps)
      .def_readwrite("scale", &DecoderLayers::scale)
      .def_property(
          "gemm_rows", [](const DecoderLayers& d) { return std::make_pair(d.gemm.dense, d.gemm.quantized); },
          [](DecoderLayers& d, std::pair<int64_t, int64_t> rows) { d.gemm = {rows.first, rows.second}; })
      .def("forward", &DecoderLayers::forward, py::call_guard<py::gil_scoped_release>());
}
