// The engine's native kernels as one Python module. The GIL is released while they run, as ATen's own ops do,
// so the server's response threads go on meanwhile.
#include <torch/extension.h>

torch::Tensor paged_decode_attention(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache,
                                     torch::Tensor block_tables, torch::Tensor context_lens, double scale,
                                     int64_t window, double softcap, torch::Tensor k_scales, torch::Tensor v_scales);
torch::Tensor quantized_linear(torch::Tensor x, torch::Tensor qweight, torch::Tensor scales, torch::Tensor mins,
                               int64_t bits);
torch::Tensor quantized_linear_int8(torch::Tensor x, torch::Tensor qweight, torch::Tensor scales, torch::Tensor mins,
                                    int64_t bits);
torch::Tensor dense_linear(torch::Tensor x, torch::Tensor weight, torch::Tensor bias);
torch::Tensor panel_linear(torch::Tensor x, torch::Tensor weight, torch::Tensor bias);
torch::Tensor bfloat16_linear(torch::Tensor x, torch::Tensor weight);
torch::Tensor pack_bfloat16_pairs(torch::Tensor weight);
torch::Tensor bfloat16_pair_linear(torch::Tensor x, torch::Tensor packed, int64_t n, bool tiles);
bool bfloat16_dot_available();
bool bfloat16_tiles_available();
torch::Tensor greedy_screen_logits(torch::Tensor x, torch::Tensor low, torch::Tensor weight, torch::Tensor slack,
                                   torch::Tensor low_norms, bool round_input, double safety, double flush);
torch::Tensor greedy_screen_logits_q8(torch::Tensor x, torch::Tensor q, torch::Tensor scales, torch::Tensor weight,
                                      torch::Tensor slack, double safety);
torch::Tensor quantized_panel_linear(torch::Tensor x, torch::Tensor qweight, torch::Tensor scales, torch::Tensor mins,
                                     int64_t bits, torch::Tensor bias);
torch::Tensor dequantize(torch::Tensor qweight, torch::Tensor scales, torch::Tensor mins, int64_t bits);
torch::Tensor gguf_linear(torch::Tensor x, torch::Tensor raw, int64_t type, torch::Tensor bias, int64_t gemm_rows);
torch::Tensor gguf_dequantize(torch::Tensor raw, int64_t type, int64_t in_features);
int64_t gguf_block_values(int64_t type);
int64_t gguf_block_bytes(int64_t type);

void bind_decoder_layers(pybind11::module& m);

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  const auto no_gil = py::call_guard<py::gil_scoped_release>();
  m.def("paged_decode_attention", &paged_decode_attention, "Decode attention over a paged KV cache (CPU)", no_gil);
  m.def("quantized_linear", &quantized_linear, "x @ W^T with W in 32-value blocks of 8 or 4 bits (CPU)", no_gil);
  m.def("quantized_linear_int8", &quantized_linear_int8,
        "quantized_linear with the input rounded to 8 bits per block, integer dot products (CPU)", no_gil);
  m.def("dense_linear", &dense_linear, "x @ W^T + b for a few rows of x, W float32 (CPU)", no_gil);
  m.def("panel_linear", &panel_linear, "x @ W^T + b for many rows of x (prompts), W float32 (CPU)", no_gil);
  m.def("bfloat16_linear", &bfloat16_linear, "x @ W^T for float32 rows of x, W bfloat16, summed in float32 (CPU)",
        no_gil);
  m.def("pack_bfloat16_pairs", &pack_bfloat16_pairs, "A bfloat16 weight in panels of value pairs for vdpbf16ps (CPU)",
        no_gil);
  m.def("bfloat16_pair_linear", &bfloat16_pair_linear,
        "x @ W^T for bfloat16 rows of x and W packed by pack_bfloat16_pairs, summed in float32 (CPU); through AMX's "
        "tiles where `tiles` and they serve",
        py::arg("x"), py::arg("packed"), py::arg("n"), py::arg("tiles") = true, no_gil);
  m.attr("bfloat16_dot") = bfloat16_dot_available();  // bfloat16_pair_linear runs here
  m.attr("bfloat16_tiles") = bfloat16_tiles_available();  // and takes AMX's tiles for a K that is a multiple of 32
  m.def("greedy_screen_logits", &greedy_screen_logits,
        "A greedy step's candidate tokens with their float32 logits, every other token -inf (CPU)", no_gil);
  m.def("greedy_screen_logits_q8", &greedy_screen_logits_q8,
        "greedy_screen_logits from the output layer's copy in 8-bit blocks (CPU)", no_gil);
  bind_decoder_layers(m);
  m.def("quantized_panel_linear", &quantized_panel_linear,
        "quantized_linear for many rows of x (prompts): the blocks widened a panel at a time for the GEMM (CPU)", no_gil);
  m.def("dequantize", &dequantize, "A block-quantized weight as float32 (CPU)", no_gil);
  m.def("gguf_linear", &gguf_linear,
        "x @ W^T + bias with W in a GGUF file's own blocks, read in place; from gemm_rows rows of x a GEMM (CPU)",
        no_gil);
  m.def("gguf_dequantize", &gguf_dequantize, "A weight in a GGUF file's blocks as float32, as gguf-py gives it",
        no_gil);
  m.def("gguf_block_values", &gguf_block_values, "Values in one block of a ggml type; 0: no kernel for it");
  m.def("gguf_block_bytes", &gguf_block_bytes, "Bytes in one block of a ggml type; 0: no kernel for it");
}
