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
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <optional>
#include <vector>

#include "gguf_linear.h"
#include "paged_decode_attention.h"
#include "phase_board.h"
#include "quantized_linear_int8.h"
#include "weight_rows.h"

torch::Tensor dense_linear(torch::Tensor x, torch::Tensor weight, torch::Tensor bias);
torch::Tensor panel_linear(torch::Tensor x, torch::Tensor weight, torch::Tensor bias);
torch::Tensor quantized_linear(torch::Tensor x, torch::Tensor qweight, torch::Tensor scales, torch::Tensor mins,
                               int64_t bits);
torch::Tensor quantized_linear_int8(torch::Tensor x, torch::Tensor qweight, torch::Tensor scales, torch::Tensor mins,
                                    int64_t bits);
torch::Tensor quantized_panel_linear(torch::Tensor x, torch::Tensor qweight, torch::Tensor scales, torch::Tensor mins,
                                     int64_t bits, torch::Tensor bias);
void dense_unit(const float* x, int64_t rows, const float* w, int64_t n, int64_t k, float* out, int64_t out_stride);
void quantized_unit(const float* x, int64_t rows, const weight_rows::BlockWeight& weight, int64_t first, int64_t last,
                    float* out, int64_t out_stride);

namespace {

using Vec = at::vec::Vectorized<float>;

constexpr int64_t kRowsPerTask = 16;  // rows of the element-wise work a thread takes at a time (a prefill's many)
constexpr int64_t kMlpRows = 512;     // rows the MLP takes at once (DecoderStack::row_chunks)

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

// out = weight * (in / sqrt(mean(in^2) + eps)) for one row of n values.
void rms_norm_row(const float* in, const float* w, float eps, int64_t n, float* o) {
  const float squares =
      at::vec::map_reduce_all<float>([](Vec v) { return v * v; }, [](Vec a, Vec b) { return a + b; }, in, n);
  const float inverse = 1.f / std::sqrt(squares / n + eps);
  for (int64_t i = 0; i < n; ++i) o[i] = w[i] * (in[i] * inverse);
}

void rms_norm(const torch::Tensor& x, const torch::Tensor& weight, float eps, torch::Tensor& out) {
  const int64_t n = x.size(1);
  at::parallel_for(0, x.size(0), kRowsPerTask, [&](int64_t first, int64_t last) {
    for (int64_t r = first; r < last; ++r)
      rms_norm_row(x.data_ptr<float>() + r * n, weight.data_ptr<float>(), eps, n, out.data_ptr<float>() + r * n);
  });
}

// x * cos + rotate_half(x) * sin for each head of one token, rotate_half(x) = (-x[half:], x[:half]). Not inlined:
// the compiler may fuse a * cos + -b * sin into one step or not, and both of the stack's paths get the same bits.
__attribute__((noinline)) void rotate(float* x, const float* cos, const float* sin, int64_t heads, int64_t dim) {
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

// out[0:n] = silu(gate[0:n]) * up[0:n], silu(g) = g / (1 + exp(-g)): each value on its own, wherever a span starts.
void silu_times(const float* gate, const float* up, int64_t n, float* out) {
  at::vec::map2([](Vec g, Vec u) { return g / (Vec(1.f) + g.neg().exp()) * u; }, out, gate, up, n);
}

// out[r] = silu(gate[r * stride : + n]) * up[r * stride : + n], n = out's width.
void silu_and_mul(const float* gate, const float* up, int64_t stride, torch::Tensor& out) {
  const int64_t n = out.size(1);
  at::parallel_for(0, out.size(0), kRowsPerTask, [&](int64_t first, int64_t last) {
    for (int64_t r = first; r < last; ++r)
      silu_times(gate + r * stride, up + r * stride, n, out.data_ptr<float>() + r * n);
  });
}

}  // namespace

// How many rows a projection takes before a GEMM built for many rows (panel_gemm.cpp) does better than the decode
// kernels (native_linear.py's NATIVE_ROWS for float32, quantized_linear.py's GEMM_ROWS for blocks, which are widened
// to float32 for it).
struct GemmRows {
  int64_t dense = 64, quantized = 65;
};

// One linear layer: float32 weights [N, K] (bits 0), GGUF blocks of 8 or 4 bits as quantized_linear.cpp
// reads them (with int8: the input rounded to 8 bits, quantized_linear_int8.cpp), or a GGUF file's rows in their
// own type (gguf_type, a ggml type id: gguf_linear.cpp; weight the raw rows). An empty bias stands for none.
struct Projection {
  torch::Tensor weight, scales, mins, bias;
  int64_t bits = 0;
  bool int8 = false;
  int64_t gguf_type = -1;

  int64_t in_features() const {
    if (gguf_type >= 0) return weight.size(1) / gguf_block_bytes(gguf_type) * gguf_block_values(gguf_type);
    return bits ? weight.size(1) * 8 / bits : weight.size(1);
  }

  torch::Tensor operator()(const torch::Tensor& x, const GemmRows& gemm) const {
    const int64_t rows = x.size(0);
    if (gguf_type >= 0) return gguf_linear(x, weight, gguf_type, bias, gemm.quantized);
    if (bits == 0) return rows > gemm.dense ? panel_linear(x, weight, bias) : dense_linear(x, weight, bias);
    if (rows >= gemm.quantized) return quantized_panel_linear(x, weight, scales, mins, bits, bias);
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

// out = SiLU(gate) * up of x's rows: [gate | up] from one fused projection, or gate and up each from its own,
// multiplied where they lie (no copy of the two side by side).
void gated(const std::vector<Projection>& parts, const torch::Tensor& x, torch::Tensor& out, const GemmRows& gemm) {
  const int64_t n = out.size(1);
  if (parts.size() == 1) {
    const torch::Tensor gate_up = parts[0](x, gemm);
    return silu_and_mul(gate_up.data_ptr<float>(), gate_up.data_ptr<float>() + n, 2 * n, out);
  }
  const torch::Tensor gate = parts[0](x, gemm), up = parts[1](x, gemm);
  silu_and_mul(gate.data_ptr<float>(), up.data_ptr<float>(), n, out);
}

// A projection as the phases read it: float32 rows or GGUF blocks, checked when built (outside the parallel region,
// where nothing may throw).
struct UnitWeight {
  explicit UnitWeight(const Projection& p)
      : dense(p.bits || p.gguf_type >= 0 ? nullptr : p.weight.data_ptr<float>()),
        bias(p.bias.numel() ? p.bias.data_ptr<float>() : nullptr),
        int8(p.int8),
        n(p.weight.size(0)),
        k(p.in_features()) {
    if (p.gguf_type >= 0) file_rows.emplace(p.weight, p.gguf_type, k);
    if (p.bits) blocks.emplace(p.weight, p.scales, p.mins, p.bits, k);
    TORCH_CHECK(!int8 || (blocks && blocks->scales_per_block == 1),
                "8-bit inputs take weights with one scale per 32 values");
    row_bytes = file_rows ? file_rows->row_bytes : p.bits ? p.weight.size(1) + (k / weight_rows::kBlock) * 8 : k * 4;
  }

  // out[r * (last - first) + j] = x[r] . W[first + j] + bias, as the projection's own kernel sums it (with int8:
  // xq, x rounded to 8-bit blocks).
  void columns(const float* x, const Int8Rows* xq, int64_t rows, int64_t first, int64_t last, float* out) const {
    const int64_t count = last - first;
    if (dense)
      dense_unit(x, rows, dense + first * k, count, k, out, count);
    else if (file_rows)
      gguf_unit(x, rows, *file_rows, first, last, out, count);
    else if (int8)
      quantized_int8_unit(*xq, rows, *blocks, first, last, out, count);
    else
      quantized_unit(x, rows, *blocks, first, last, out, count);
    if (bias)
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t j = 0; j < count; ++j) out[r * count + j] += bias[first + j];
  }

  const float* dense;
  std::optional<weight_rows::BlockWeight> blocks;
  std::optional<GGUFWeight> file_rows;
  const float* bias;
  bool int8;
  int64_t n, k, row_bytes;
};

std::vector<UnitWeight> unit_weights(const std::vector<Projection>& parts) {
  return std::vector<UnitWeight>(parts.begin(), parts.end());
}

// Output columns [first, last) of projections whose outputs lie side by side, each written once: out[r * (last -
// first) + j]. The columns lie within one projection.
void project_columns(const std::vector<UnitWeight>& parts, const float* x, const Int8Rows* xq, int64_t rows,
                     int64_t first, int64_t last, float* out) {
  int64_t column = 0;
  for (const UnitWeight& part : parts) {
    if (first < column + part.n) return part.columns(x, xq, rows, first - column, last - column, out);
    column += part.n;
  }
}

// The phases' units of a projection group: column ranges of at most kUnitBytes of weights each (fewer columns the
// more rows share them, so that a unit stays a few tens of microseconds), and at least 4 a thread, so that the
// threads finish a phase close together; within one projection each, at most phase_board::kMaxUnits. `upto`: only
// the columns before it (a gate's, whose up columns a unit computes beside). A unit costs its bookkeeping (the
// board's states, two clock reads) whatever its size, so a unit must be large against that: at 256 KB a 32-row
// step's units were 8 columns, ~3 us each; at 1 MB they are 56.
std::vector<std::pair<int64_t, int64_t>> column_units(const std::vector<UnitWeight>& parts, int64_t rows,
                                                      int64_t threads, int64_t upto = INT64_MAX) {
  constexpr int64_t kUnitBytes = 1 << 20;
  auto eights = [](int64_t n) { return std::max<int64_t>(8, (n + 7) / 8 * 8); };
  int64_t total = 0;
  for (const UnitWeight& part : parts) total += part.n;
  total = std::min(total, upto);
  const int64_t fewest = eights((total + phase_board::kMaxUnits / 2 - 1) / (phase_board::kMaxUnits / 2));
  std::vector<std::pair<int64_t, int64_t>> units;
  int64_t column = 0;
  for (const UnitWeight& part : parts) {
    const int64_t n = std::min(part.n, total - column);
    if (n <= 0) break;
    const int64_t by_bytes = kUnitBytes / (part.row_bytes * std::max<int64_t>(1, rows / 4)) / 8 * 8;
    const int64_t size = std::max(fewest, std::min(eights(by_bytes), eights((n + 4 * threads - 1) / (4 * threads))));
    for (int64_t first = 0; first < n; first += size)
      units.emplace_back(column + first, column + std::min(n, first + size));
    column += n;
  }
  return units;
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
  // Steps the phased forward serves (phased_serves) go through it; false: the parallel region per operation
  // as for every other step (for comparing the two).
  bool phased = true;
  // Fault injection for tests (phase_board::Seat::hold_every): a thread holds every hold_every-th unit of a phase
  // until another thread has computed it. 0: never.
  int64_t hold_every = 0;
  // Units recomputed by a thread that found them taken past the grace period, over this object's life.
  mutable std::atomic<int64_t> recomputed{0};
  mutable torch::Tensor workspace;  // the phased forward's buffers, kept from step to step

  // hidden: [B, H], B fed tokens; cos, sin: [B, dim]; slots: [B] cache slot of each token; block_tables
  // [B, max_blocks] (each row its sequence's table) and context_lens [B] (each row's position + 1) as
  // paged_decode_attention takes them. Returns the last layer's output [B, H] (before the model's final norm).
  torch::Tensor forward(torch::Tensor hidden, torch::Tensor cos, torch::Tensor sin, torch::Tensor slots,
                        torch::Tensor block_tables, torch::Tensor context_lens) const {
    TORCH_CHECK(hidden.dim() == 2 && hidden.scalar_type() == torch::kFloat32, "hidden: [B, H] float32");
    TORCH_CHECK(cos.is_contiguous() && sin.is_contiguous() && cos.size(1) == dim, "cos, sin: contiguous [B, dim]");
    TORCH_CHECK(slots.scalar_type() == torch::kLong && slots.numel() == hidden.size(0), "slots: [B] int64");
    if (phased_serves(hidden.size(0)))
      return forward_phased(hidden.contiguous(), cos, sin, slots, block_tables.contiguous(), context_lens.contiguous());
    const int64_t batch = hidden.size(0), q_size = heads * dim, kv_size = kv_heads * dim;
    const int64_t intermediate = down[0].in_features();
    torch::Tensor x = hidden.contiguous().clone();  // the residual stream
    torch::Tensor normed = torch::empty_like(x);
    const auto mlp_chunks = row_chunks(batch);
    torch::Tensor activated = torch::empty({mlp_chunks[0].second, intermediate}, x.options());
    const int64_t* slot = slots.data_ptr<int64_t>();
    for (size_t l = 0; l < qkv.size(); ++l) {
      rms_norm(x, input_norm[l], static_cast<float>(eps), normed);
      torch::Tensor projected = project(qkv[l], normed, gemm);  // [B, q | k | v]
      float* p = projected.data_ptr<float>();
      // Every row's key and value go into the cache before any row attends: a prompt chunk's later rows see its
      // earlier ones there.
      at::parallel_for(0, batch, kRowsPerTask, [&](int64_t first, int64_t last) {
        for (int64_t b = first; b < last; ++b) {
          float* row = p + b * (q_size + 2 * kv_size);
          rotate(row, cos.data_ptr<float>() + b * dim, sin.data_ptr<float>() + b * dim, heads, dim);
          rotate(row + q_size, cos.data_ptr<float>() + b * dim, sin.data_ptr<float>() + b * dim, kv_heads, dim);
          store_kv(l, slot[b], row + q_size, row + q_size + kv_size);
        }
      });
      torch::Tensor q = projected.narrow(1, 0, q_size).contiguous().view({batch, heads, dim});
      torch::Tensor attended =
          paged_decode_attention(q, k_cache[l], v_cache[l], block_tables, context_lens, scale, 0, 0.0,
                                 k_scales[l], v_scales[l]);
      x.add_(o[l](attended.view({batch, q_size}), gemm));
      rms_norm(x, post_norm[l], static_cast<float>(eps), normed);
      for (const auto& [first, count] : mlp_chunks) {
        torch::Tensor part = activated.narrow(0, 0, count);
        gated(gate_up[l], normed.narrow(0, first, count), part, gemm);
        x.narrow(0, first, count).add_(down[l](part, gemm));
      }
    }
    return x;
  }

  // A step's rows in near-equal chunks of at most kMlpRows for the MLP, whose activations (gate, up and their
  // product: three times the rows x the intermediate width) would otherwise be the largest buffers of a long
  // prompt's step, kept afterwards by the allocator. Every chunk past one has more than half of kMlpRows rows, so
  // it takes the prompt GEMM as the whole step would.
  static std::vector<std::pair<int64_t, int64_t>> row_chunks(int64_t rows) {
    const int64_t chunks = std::max<int64_t>(1, (rows + kMlpRows - 1) / kMlpRows);
    std::vector<std::pair<int64_t, int64_t>> out;
    for (int64_t c = 0, first = 0; c < chunks; ++c) {
      const int64_t count = rows / chunks + (c < rows % chunks ? 1 : 0);
      out.emplace_back(first, count);
      first += count;
    }
    return out;
  }

  // One token's keys and values (kv_heads * dim each, rotated keys) into layer l's cache at `slot`, each value
  // written once: a bfloat16 cache takes them rounded to nearest even, as torch's .to() rounds; an int8 cache as
  // quantize_head rounds them, with their scales.
  void store_kv(size_t l, int64_t slot, const float* key, const float* value) const {
    const int64_t kv_size = kv_heads * dim;
    const auto kv = k_cache[l].scalar_type();
    if (kv == torch::kChar) {
      for (int64_t h = 0; h < kv_heads; ++h) {
        const int64_t cell = slot * kv_heads + h;
        quantize_head(key + h * dim, dim, k_cache[l].data_ptr<int8_t>() + cell * dim,
                      k_scales[l].data_ptr<float>() + cell);
        quantize_head(value + h * dim, dim, v_cache[l].data_ptr<int8_t>() + cell * dim,
                      v_scales[l].data_ptr<float>() + cell);
      }
    } else if (kv == torch::kBFloat16) {
      std::copy(key, key + kv_size, k_cache[l].data_ptr<at::BFloat16>() + slot * kv_size);
      std::copy(value, value + kv_size, v_cache[l].data_ptr<at::BFloat16>() + slot * kv_size);
    } else {
      std::copy(key, key + kv_size, k_cache[l].data_ptr<float>() + slot * kv_size);
      std::copy(value, value + kv_size, v_cache[l].data_ptr<float>() + slot * kv_size);
    }
  }

  // Decode-sized steps: up to gemm.dense rows, where float32 projections stay in dense_linear's tiles and blocks in
  // the block kernels.
  bool phased_serves(int64_t rows) const { return phased && rows <= gemm.dense && rows < gemm.quantized; }

  // forward() as one parallel region of phase_board phases, six a layer, each writing buffers of its own (a ring
  // of kRing layers' buffers):
  // (1) q/k/v, each thread normalizing the layer's input for itself; (2) rotary embedding, q to a buffer and k, v
  // into the cache; (3) attention; (4) the output projection plus the residual; (5) gate and up with SiLU(gate) *
  // up, each thread normalizing for itself; (6) the down projection plus the residual. The same arithmetic as
  // forward()'s, so the same bits.
  torch::Tensor forward_phased(const torch::Tensor& hidden, const torch::Tensor& cos, const torch::Tensor& sin,
                               const torch::Tensor& slots, const torch::Tensor& block_tables,
                               const torch::Tensor& context_lens) const {
    const int64_t batch = hidden.size(0), width = hidden.size(1), layers = static_cast<int64_t>(qkv.size());
    const int64_t q_size = heads * dim, kv_size = kv_heads * dim, qkv_size = q_size + 2 * kv_size;
    std::vector<std::vector<UnitWeight>> qkv_w, o_w, gate_up_w, down_w;  // per layer
    for (int64_t l = 0; l < layers; ++l) {
      qkv_w.push_back(unit_weights(qkv[l]));
      o_w.push_back(unit_weights({o[l]}));
      gate_up_w.push_back(unit_weights(gate_up[l]));
      down_w.push_back(unit_weights({down[l]}));
    }
    const int64_t intermediate = gate_up_w[0].size() == 1 ? gate_up_w[0][0].n / 2 : gate_up_w[0][0].n;
    const int64_t threads = at::get_num_threads();
    const auto qkv_units = column_units(qkv_w[0], batch, threads), o_units = column_units(o_w[0], batch, threads);
    const auto gate_units = column_units(gate_up_w[0], batch, threads, intermediate);
    const auto down_units = column_units(down_w[0], batch, threads);
    int64_t widest = 0;
    for (const auto* units : {&qkv_units, &o_units, &gate_units, &down_units})
      for (const auto& [first, last] : *units) widest = std::max(widest, last - first);
    // Per layer: q/k/v, rotated q, attention, the residual after attention, the activation, the layer's output.
    const int64_t per_layer = batch * (qkv_size + 2 * q_size + 2 * width + intermediate);
    // Per thread: the normalized input, a unit's columns (gate and up: twice), a rotated head's scratch.
    const int64_t per_thread = batch * width + 2 * batch * widest + std::max(q_size, kv_size);
    // Layer l writes the buffers of layer l - kRing once every thread has left that layer: a thread held up for
    // kRing layers' time is waited for (C1: some 2 ms).
    constexpr int64_t kRing = 4;
    const int64_t ring = std::min(layers, kRing);
    const int64_t needed = ring * per_layer + threads * per_thread;
    if (!workspace.defined() || workspace.numel() < needed) workspace = torch::empty({needed}, hidden.options());
    float* const base = workspace.data_ptr<float>();
    auto layer_buffer = [&](int64_t l, int64_t offset) { return base + (l % ring) * per_layer + batch * offset; };
    const int64_t at_q = qkv_size, at_attn = at_q + q_size, at_mid = at_attn + q_size, at_act = at_mid + width,
                  at_out = at_act + intermediate;
    const float* input = hidden.data_ptr<float>();
    const float* cos_p = cos.data_ptr<float>();
    const float* sin_p = sin.data_ptr<float>();
    const int64_t* slot = slots.data_ptr<int64_t>();
    const float eps_f = static_cast<float>(eps);
    constexpr int64_t kPhases = 6;
    phase_board::Board board(layers * kPhases, threads);
    std::vector<DecodeAttention> attention;  // built here: nothing in the parallel region may throw
    for (int64_t l = 0; l < layers; ++l)
      attention.emplace_back(layer_buffer(l, at_q), batch, heads, dim, k_cache[l], v_cache[l], block_tables,
                             context_lens, scale, 0, 0.0, k_scales[l], v_scales[l]);
    // A unit: the query heads that share a KV head, or one head (DecodeAttention::heads_per_item), or as many
    // of those as keep the units within the board's.
    const int64_t per_item = attention[0].heads_per_item(threads), items = batch * heads / per_item;
    const int64_t heads_per_unit = per_item * ((items + phase_board::kMaxUnits - 1) / phase_board::kMaxUnits);
    const int64_t attention_units = (batch * heads + heads_per_unit - 1) / heads_per_unit;

    auto seat_run = [&](int64_t thread, int64_t team) {
      phase_board::Seat seat{&board, thread, team};
      seat.hold_every = hold_every;
      float* const own = base + ring * per_layer + thread * per_thread;
      float* const normed = own;
      float* const columns = normed + batch * width;
      float* const head = columns + 2 * batch * widest;
      std::vector<float> scores;
      auto normalize = [&](const float* x, const torch::Tensor& weight) {
        for (int64_t b = 0; b < batch; ++b)
          rms_norm_row(x + b * width, weight.data_ptr<float>(), eps_f, width, normed + b * width);
      };
      // The phase's input rounded to 8-bit blocks by this thread, where its projections take them
      // (int8_activations): `rounded`, else null.
      Int8Rows int8_input;
      const Int8Rows* rounded = nullptr;
      auto round_for = [&](const std::vector<UnitWeight>& parts, const float* input) {
        rounded = nullptr;
        for (const UnitWeight& part : parts)
          if (part.int8) {
            quantize_rows(input, batch, part.k, int8_input);
            rounded = &int8_input;
            return;
          }
      };
      // out[b, first:last] = columns (+ residual[b, first:last]), each value stored once.
      auto store = [&](float* out, int64_t out_width, const float* residual, int64_t first, int64_t last) {
        const int64_t count = last - first;
        for (int64_t b = 0; b < batch; ++b)
          for (int64_t j = 0; j < count; ++j) {
            const float v = columns[b * count + j];
            out[b * out_width + first + j] = residual ? residual[b * out_width + first + j] + v : v;
          }
      };
      for (int64_t l = 0; l < layers; ++l) {
        const float* x = l ? layer_buffer(l - 1, at_out) : input;
        float* const projected = layer_buffer(l, 0);
        float* const q = layer_buffer(l, at_q);
        float* const attended = layer_buffer(l, at_attn);
        float* const mid = layer_buffer(l, at_mid);
        float* const act = layer_buffer(l, at_act);
        float* const out = layer_buffer(l, at_out);
        if (l >= ring) phase_board::wait_for_all(seat, (l - ring + 1) * kPhases);
        normalize(x, input_norm[l]);
        round_for(qkv_w[l], normed);
        phase_board::run(seat, qkv_units.size(), [&](int64_t u) {
          const auto [first, last] = qkv_units[u];
          project_columns(qkv_w[l], normed, rounded, batch, first, last, columns);
          store(projected, qkv_size, nullptr, first, last);
        });
        phase_board::run(seat, batch, [&](int64_t b) {
          const float* row = projected + b * qkv_size;
          const float* c = cos_p + b * dim;
          const float* s = sin_p + b * dim;
          std::copy(row, row + q_size, head);
          rotate(head, c, s, heads, dim);
          std::copy(head, head + q_size, q + b * q_size);
          std::copy(row + q_size, row + q_size + kv_size, head);
          rotate(head, c, s, kv_heads, dim);
          store_kv(l, slot[b], head, row + q_size + kv_size);
        });
        phase_board::run(seat, attention_units, [&](int64_t u) {
          attention[l].heads(u * heads_per_unit, std::min(batch * heads, (u + 1) * heads_per_unit), scores, attended);
        });
        round_for(o_w[l], attended);
        phase_board::run(seat, o_units.size(), [&](int64_t u) {
          const auto [first, last] = o_units[u];
          project_columns(o_w[l], attended, rounded, batch, first, last, columns);
          store(mid, width, x, first, last);
        });
        normalize(mid, post_norm[l]);
        round_for(gate_up_w[l], normed);
        phase_board::run(seat, gate_units.size(), [&](int64_t u) {
          const auto [first, last] = gate_units[u];
          const int64_t count = last - first;
          float* const up = columns + batch * count;
          project_columns(gate_up_w[l], normed, rounded, batch, intermediate + first, intermediate + last, up);
          project_columns(gate_up_w[l], normed, rounded, batch, first, last, columns);
          for (int64_t b = 0; b < batch; ++b)
            silu_times(columns + b * count, up + b * count, count, act + b * intermediate + first);
        });
        round_for(down_w[l], act);
        phase_board::run(seat, down_units.size(), [&](int64_t u) {
          const auto [first, last] = down_units[u];
          project_columns(down_w[l], act, rounded, batch, first, last, columns);
          store(out, width, mid, first, last);
        });
      }
      recomputed += seat.recomputed;
    };
    // OpenMP's own team, not at::parallel_for, which may give one thread two seats: the seats must all run at once.
#pragma omp parallel num_threads(threads)
    seat_run(omp_get_thread_num(), omp_get_num_threads());
    return torch::from_blob(layer_buffer(layers - 1, at_out), {batch, width}, hidden.options()).clone();
  }
};

void bind_decoder_layers(pybind11::module& m) {
  namespace py = pybind11;
  py::class_<Projection>(m, "Projection",
                         "A linear layer for DecoderLayers: float32, GGUF blocks of 8 or 4 bits, or a GGUF file's rows")
      .def(py::init([](torch::Tensor weight, torch::Tensor scales, torch::Tensor mins, torch::Tensor bias,
                       int64_t bits, bool int8, int64_t gguf_type) {
             return Projection{weight, scales, mins, bias, bits, int8, gguf_type};
           }),
           py::arg("weight"), py::arg("scales"), py::arg("mins"), py::arg("bias"), py::arg("bits"), py::arg("int8"),
           py::arg("gguf_type") = -1);
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
      .def_readwrite("phased", &DecoderLayers::phased)
      .def_readwrite("hold_every", &DecoderLayers::hold_every)
      .def_property_readonly("recomputed", [](const DecoderLayers& d) { return d.recomputed.load(); })
      .def("forward", &DecoderLayers::forward, py::call_guard<py::gil_scoped_release>());
}
