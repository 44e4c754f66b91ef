// The greedy screen (engine/decoding/greedy_screen.py) in one call: the products of a step's rows with the layer's bfloat16
// copy (bfloat16_linear.cpp) or 8-bit block copy (quantized_linear.cpp), then the tokens that can still be each
// row's float32 argmax, with their float32 logits.
// In C++, because the same selection in PyTorch takes six passes over a [rows, vocab] tensor, a sixth of the
// layer's own time; here it is two vector passes over each row, in place.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <vector>

#include "bfloat16_pairs.h"
#include "float_vec.h"

void bfloat16_products(const float* x, int64_t rows, const uint16_t* w, int64_t n, int64_t k, float* out);
torch::Tensor quantized_linear(torch::Tensor x, torch::Tensor qweight, torch::Tensor scales, torch::Tensor mins,
                               int64_t bits);

namespace {

constexpr float kInfinity = std::numeric_limits<float>::infinity();

// v as the bfloat16 vdpbf16ps reads: rounded to the nearest (ties to even) as PyTorch rounds the weight's copy,
// and zero where that is below the smallest normal, which vdpbf16ps reads as zero.
at::BFloat16 round_to_bfloat16(float v) {
  at::BFloat16 half(v);
  if ((half.x & 0x7F80) == 0) half.x &= 0x8000;
  return half;
}

// Row r's products in place -> its candidates' float32 logits (x . w[t] as dense_linear sums it), others -inf.
// bound(t) = slack[t] * scale + low_norms[t] * rounding + flush (low_norms null: the input is not rounded).
void select(float* row, const float* x, const float* weight, int64_t vocab, int64_t k, const float* slack,
            const float* low_norms, float scale, float rounding, float flush) {
  using namespace float_vec;
  const Vec vs = set1(scale), vd = set1(rounding), vf = set1(flush);
  const auto bound = [&](int64_t t) {
    return fma(load(slack + t), vs, low_norms ? fma(load(low_norms + t), vd, vf) : vf);
  };
  const auto bound_at = [&](int64_t t) {
    return slack[t] * scale + ((low_norms ? low_norms[t] * rounding : 0.f) + flush);
  };
  const int64_t whole = vocab / kLanes * kLanes;
  Vec floors = set1(-kInfinity);
  for (int64_t t = 0; t < whole; t += kLanes) floors = max(floors, sub(load(row + t), bound(t)));
  float floor = max_lanes(floors);
  for (int64_t t = whole; t < vocab; ++t) floor = std::max(floor, row[t] - bound_at(t));
  const Vec vfloor = set1(floor), minus_infinity = set1(-kInfinity);
  for (int64_t t = 0; t < whole; t += kLanes) {
    uint32_t kept = at_least(add(load(row + t), bound(t)), vfloor);
    store(row + t, minus_infinity);
    for (; kept; kept &= kept - 1) {
      const int64_t token = t + __builtin_ctz(kept);
      row[token] = dot(x, weight + token * k, k);
    }
  }
  for (int64_t t = whole; t < vocab; ++t)
    row[t] = row[t] + bound_at(t) >= floor ? dot(x, weight + t * k, k) : -kInfinity;
}

// The rows of out (the products, [rows, vocab]) -> each row's candidates with their float32 logits. Row r's
// bound scale is ||x_r|| + ||x_r - x'_r|| and its input rounding ||x_r - x'_r|| (rounding[r], before safety).
void select_rows(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& slack,
                 const float* low_norms, const std::vector<double>& rounding, double safety, double flush,
                 torch::Tensor& out) {
  const int64_t rows = x.size(0), k = x.size(1), vocab = weight.size(0);
  const float* xp = x.data_ptr<float>();
  std::vector<float> scale(rows), off(rows);
  for (int64_t r = 0; r < rows; ++r) {
    double norm = 0;
    for (int64_t i = 0; i < k; ++i) norm += static_cast<double>(xp[r * k + i]) * xp[r * k + i];
    off[r] = static_cast<float>(safety * rounding[r]);
    scale[r] = static_cast<float>(safety * std::sqrt(norm)) + off[r];
  }
  float* op = out.data_ptr<float>();
  const float *wp = weight.data_ptr<float>(), *sp = slack.data_ptr<float>();
  at::parallel_for(0, rows, 1, [&](int64_t first, int64_t last) {
    for (int64_t r = first; r < last; ++r)
      select(op + r * vocab, xp + r * k, wp, vocab, k, sp, low_norms, scale[r], off[r], static_cast<float>(flush));
  });
}

void check_screen(const torch::Tensor& x, const torch::Tensor& weight, std::initializer_list<torch::Tensor> per_token) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat32 && x.is_contiguous(), "x: contiguous [R, K] float32");
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == torch::kFloat32 && weight.is_contiguous() &&
                  weight.size(1) == x.size(1),
              "weight: contiguous [V, K] float32");
  for (const auto& t : per_token)
    TORCH_CHECK(t.scalar_type() == torch::kFloat32 && t.is_contiguous() && t.numel() == weight.size(0),
                "slack, low_norms: [V] float32");
}

}  // namespace

// x: [R, K] float32; weight: [V, K] float32; slack, low_norms: [V] float32 (greedy_screen.py); low: weight's
// bfloat16 copy with what vdpbf16ps reads as zero made zero, either [V, K] (x multiplies it in float32) or, with
// round_input (where bfloat16_dot_available()), packed by pack_bfloat16_pairs, when x is rounded to bfloat16 for
// the products and its rounding bounded. Returns [R, V]: each row's candidates with their float32 logits, every
// other token -inf.
torch::Tensor greedy_screen_logits(torch::Tensor x, torch::Tensor low, torch::Tensor weight, torch::Tensor slack,
                                   torch::Tensor low_norms, bool round_input, double safety, double flush) {
  check_screen(x, weight, {slack, low_norms});
  const int64_t rows = x.size(0), k = x.size(1), vocab = weight.size(0), pairs = (k + 1) / 2;
  TORCH_CHECK(!round_input || bfloat16_dot_available(), "this CPU does not multiply bfloat16 pairs");
  if (round_input)
    check_bfloat16_pairs(low, vocab, k);
  else
    TORCH_CHECK(low.scalar_type() == torch::kBFloat16 && low.is_contiguous() && low.sizes() == weight.sizes(),
                "low: contiguous [V, K] bfloat16");
  const float* xp = x.data_ptr<float>();
  std::vector<uint16_t> rounded(round_input ? rows * 2 * pairs : 0);  // an odd K's last pair padded with a zero
  std::vector<double> rounding(rows);
  if (round_input)
    for (int64_t r = 0; r < rows; ++r) {
      double off = 0;
      for (int64_t i = 0; i < k; ++i) {
        const float v = xp[r * k + i];
        const at::BFloat16 half = round_to_bfloat16(v);
        rounded[r * 2 * pairs + i] = half.x;
        const double d = static_cast<double>(v) - static_cast<float>(half);
        off += d * d;
      }
      rounding[r] = std::sqrt(off);
    }
  auto out = torch::empty({rows, vocab}, x.options());
  const uint16_t* lp = reinterpret_cast<const uint16_t*>(low.data_ptr<at::BFloat16>());
  if (round_input)
    bfloat16_pair_products(rounded.data(), rows, lp, vocab, pairs, out.data_ptr<float>(), true);
  else
    bfloat16_products(xp, rows, lp, vocab, k, out.data_ptr<float>());
  select_rows(x, weight, slack, low_norms.data_ptr<float>(), rounding, safety, flush, out);
  return out;
}

// The same with the layer's copy in 8-bit blocks (Q8_0's layout, float32 scales [V, K / 32]), multiplied by x in
// float32 as quantized_linear multiplies it: no input rounding to bound.
torch::Tensor greedy_screen_logits_q8(torch::Tensor x, torch::Tensor q, torch::Tensor scales, torch::Tensor weight,
                                      torch::Tensor slack, double safety) {
  check_screen(x, weight, {slack});
  TORCH_CHECK(q.scalar_type() == torch::kInt8 && q.sizes() == weight.sizes(), "q: [V, K] int8");
  auto out = quantized_linear(x, q, scales, torch::empty({0}, scales.options()), 8);
  select_rows(x, weight, slack, nullptr, std::vector<double>(x.size(0)), safety, 0.0, out);
  return out;
}
