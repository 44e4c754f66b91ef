"""GGUF weights kept quantized: the blocks read as gguf-py reads them, the native kernel against float32 matmuls
over the same weights, and the real default model served from its Q4_1 file against transformers' generate()."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType, quants
from oracles import greedy_ids

from tritonllm.engine.engine import EngineConfig, LLMEngine
from tritonllm.engine.kernels import cpu_kernels
from tritonllm.engine.layers import quantized_linear
from tritonllm.engine.layers.quantized_linear import QuantizedEmbedding, QuantizedLinear
from tritonllm.engine.models import gguf_swap
from tritonllm.engine.state.sampling_params import SamplingParams
from tritonllm.engine.state.sequence import Sequence
from tritonllm.formats import gguf, model_cache
from tritonllm.formats.gguf_blocks import BlockQuantized, from_gguf

# Built (or loaded from the cache) here: a build that fails is this module's error, never a skip.
cpu_kernels.build()

FORMATS = ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q4_K", "Q6_K"]
INT8_FORMATS = [kind for kind in FORMATS if kind != "Q6_K"]  # a scale per 16 values keeps float32 inputs
# gguf-py cannot quantize to K-quants: random super-blocks stand for them (every bit pattern is a valid one), with
# their float16 scales drawn so that weights stay within a few units. Bytes per super-block of 256 values, where
# its float16 scales lie, and their range.
K_QUANTS = {"Q4_K": (144, slice(0, 4), (1e-3, 2e-2)), "Q6_K": (210, slice(208, 210), (1e-4, 1e-3))}


def quantized(
    kind: str, out_features: int = 96, in_features: int = 160, seed: int = 0
) -> tuple[BlockQuantized, np.ndarray]:
    """A random weight in GGUF's `kind`, as our blocks and as gguf-py dequantizes it."""
    rng = np.random.default_rng(seed)
    if kind in K_QUANTS:
        size, halves, (low, high) = K_QUANTS[kind]
        supers = -(-in_features // 256)
        raw = rng.integers(0, 256, (out_features, supers, size), dtype=np.uint8)
        d = rng.uniform(low, high, (out_features, supers, (halves.stop - halves.start) // 2)).astype(np.float16)
        raw[:, :, halves] = d.view(np.uint8)
        raw = raw.reshape(out_features, -1)
    else:
        weight = rng.standard_normal((out_features, in_features)).astype(np.float32)
        raw = quants.quantize(weight, GGMLQuantizationType[kind])
    return from_gguf(kind, raw), quants.dequantize(raw, GGMLQuantizationType[kind])


@pytest.mark.parametrize("kind", FORMATS)
def test_blocks_dequantize_exactly_as_gguf_py_does(kind):
    blocks, reference = quantized(kind)
    assert blocks.shape == reference.shape
    assert torch.equal(blocks.dequantize(), torch.from_numpy(reference))
    kernel = cpu_kernels.native().dequantize(blocks.qweight, blocks.scales, blocks.mins, blocks.bits)
    torch.testing.assert_close(kernel, torch.from_numpy(reference), rtol=1e-6, atol=1e-6)


def test_joined_layers_with_biases_compute_each_layer_as_before():
    (a, _), (b, _) = quantized("Q5_0", 64, seed=1), quantized("Q5_0", 32, seed=2)
    layers = [QuantizedLinear(w, torch.nn.Parameter(torch.randn(w.shape[0]))) for w in (a, b)]
    x = torch.randn(3, a.shape[1])
    alone = [layer(x) for layer in layers]
    joined = quantized_linear.side_by_side(layers)  # as Qwen2's q/k/v with their biases are joined
    torch.testing.assert_close(joined(x), torch.cat(alone, 1), rtol=0, atol=0)
    for layer, before in zip(layers, alone, strict=True):
        torch.testing.assert_close(layer(x), before, rtol=0, atol=0)


def test_other_formats_are_not_taken():
    assert from_gguf("Q5_K", np.zeros((4, 176), dtype=np.uint8)) is None


@pytest.mark.parametrize("kind", FORMATS)
@pytest.mark.parametrize("rows", [1, 3, 4, 8, 13, 32, 64, 200, quantized_linear.GEMM_ROWS + 5])
@pytest.mark.parametrize("out_features", [96, 1003])  # 1003: threads take a series of shrinking chunks, then a tail
def test_the_layer_equals_a_float32_linear_over_the_dequantized_weight(kind, rows, out_features):
    blocks, reference = quantized(kind, out_features)
    bias = torch.randn(blocks.shape[0])
    layer = QuantizedLinear(blocks, bias)
    x = torch.randn(2, rows, blocks.shape[1])  # leading dimensions are kept
    # Against the exact sums (float64), within float32's rounding of them: a few units of float32's epsilon times
    # the sum of the products' magnitudes (where an output cancels to near 0, its error is the terms'). The BLAS's
    # own float32 result stays within 3 of them; the K-quants' weights reach 18, where 1e-4 would fail it too.
    weight = torch.from_numpy(reference).double()
    expected = F.linear(x.double(), weight, bias.double())
    magnitude = F.linear(x.double().abs(), weight.abs(), bias.double().abs())
    error = (layer(x).double() - expected).abs()
    assert (error <= 8 * torch.finfo(torch.float32).eps * magnitude).all(), (error / magnitude).max().item()


def rounded_to_int8_blocks(x: torch.Tensor) -> torch.Tensor:
    """x with each block of 32 values rounded to int8 on a scale of max |x| / 127, as llama.cpp's Q8 inputs are
    (round half to even)."""
    blocks = x.reshape(*x.shape[:-1], -1, 32)
    scale = blocks.abs().amax(-1, keepdim=True) / 127
    inverse = torch.where(scale == 0, 0, 1 / scale)  # times the reciprocal, as the kernel rounds
    return (torch.round(blocks * inverse) * scale).reshape(x.shape)


@pytest.mark.parametrize("kind", INT8_FORMATS)
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 8, 13, 40, quantized_linear.GEMM_ROWS - 1])
def test_int8_activations_multiply_the_input_rounded_to_8_bit_blocks(kind, rows):
    blocks, reference = quantized(kind, in_features=576)
    bias = torch.randn(blocks.shape[0])
    layer = QuantizedLinear(blocks, bias, int8_activations=True)
    x = torch.randn(rows, blocks.shape[1], generator=torch.Generator().manual_seed(rows))
    x[0, :32] = 0  # an all-zero block has scale 0
    expected = F.linear(rounded_to_int8_blocks(x).double(), torch.from_numpy(reference).double(), bias.double())
    torch.testing.assert_close(layer(x).double(), expected, rtol=1e-5, atol=1e-4)
    exact = F.linear(x, torch.from_numpy(reference), bias)
    assert not torch.allclose(layer(x), exact, rtol=1e-5, atol=1e-4)  # it is the rounded input that counts


@pytest.mark.parametrize("kind", INT8_FORMATS)
def test_int8_activations_leave_prompt_chunks_in_float32(kind):
    """Past a decode step's rows the prompt GEMM takes the float32 input (faster there than the 8-bit kernel)."""
    blocks, reference = quantized(kind, in_features=576)
    layer = QuantizedLinear(blocks, None, int8_activations=True)
    x = torch.randn(quantized_linear.GEMM_ROWS, blocks.shape[1], generator=torch.Generator().manual_seed(1))
    expected = F.linear(x.double(), torch.from_numpy(reference).double()).float()
    torch.testing.assert_close(layer(x), expected, rtol=1e-5, atol=1e-4)


def test_weights_with_a_scale_per_16_values_keep_float32_inputs():
    blocks, reference = quantized("Q6_K", in_features=576)
    layer = QuantizedLinear(blocks, None, int8_activations=True)
    assert not layer.int8_activations
    x = torch.randn(3, blocks.shape[1])
    torch.testing.assert_close(layer(x), F.linear(x, torch.from_numpy(reference)), rtol=1e-5, atol=1e-4)
    with pytest.raises(RuntimeError, match="one scale per 32"):
        cpu_kernels.native().quantized_linear_int8(x, blocks.qweight, blocks.scales, blocks.mins, blocks.bits)


@pytest.fixture(scope="module")
def smollm2_q4_1(smollm2_gguf):
    return smollm2_gguf, gguf.hf_model_dir(smollm2_gguf, dequantize=True)  # the folder the blocks replace


def test_the_q4_1_model_keeps_every_layer_quantized_and_decodes_as_generate(smollm2_q4_1):
    import transformers

    file, model_dir = smollm2_q4_1
    assert gguf.source_file(model_dir) == file.resolve()
    engine = LLMEngine(EngineConfig(str(model_dir), num_kv_blocks=64, gguf_file=str(file)))
    linears = [m for m in engine.runner.model.modules() if isinstance(m, torch.nn.Linear)]
    # 7 per layer in 30 layers (Q4_1) and the output layer, tied to the embedding (Q8_0)
    assert engine.runner.quantized_layers == 211 and not linears
    assert engine.runner.decoder_stack is not None  # decode steps run the native stack over the blocks
    stack = engine.runner.decoder_stack.stack  # q/k/v and gate/up: one projection each, the weights held once
    assert all(len(qkv) == len(gate_up) == 1 for qkv, gate_up in zip(stack.qkv, stack.gate_up, strict=True))
    attention = engine.runner.model.model.layers[0].self_attn
    q, k = (getattr(p, "base", p) for p in (attention.q_proj, attention.k_proj))  # under their LoRA wrappers
    assert k.qweight.untyped_storage().data_ptr() == q.qweight.untyped_storage().data_ptr()
    # no float32 table beside the blocks: the input embedding reads the tied output layer's Q8_0 blocks
    embedding, output = engine.runner.model.get_input_embeddings(), engine.runner.model.get_output_embeddings()
    assert isinstance(embedding, QuantizedEmbedding) and embedding.qweight.data_ptr() == output.qweight.data_ptr()
    assert not [p for p in engine.runner.model.parameters() if p.numel() >= embedding.qweight.numel()]
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    prompts = [tokenizer(text).input_ids for text in ("The capital of France is", "def fibonacci(n):", "1, 2, 3,")]
    seqs = [Sequence(p, SamplingParams(max_tokens=16)) for p in prompts]
    for seq in seqs:
        engine.add(seq)
    while engine.has_work():
        engine.step()
    hf = transformers.AutoModelForCausalLM.from_pretrained(model_dir).eval()
    assert [s.output_ids for s in seqs] == [greedy_ids(hf, p, 16) for p in prompts]


@pytest.mark.parametrize("kind", ["Q8_0", "Q4_1", "Q6_K"])
def test_the_quantized_embedding_gives_the_dequantized_tables_rows(kind):
    blocks, table = quantized(kind, 50, 64)
    ids = torch.tensor([[3, 49, 0], [3, 7, 7]])
    assert torch.equal(QuantizedEmbedding(blocks)(ids), F.embedding(ids, torch.from_numpy(table)))


def test_a_layer_whose_blocks_differ_from_its_weight_stays_float32(smollm2_q4_1, monkeypatch, tmp_path):
    import transformers

    monkeypatch.setenv(model_cache.CACHE_ENV, str(tmp_path))  # no verdict of an earlier load

    file, model_dir = smollm2_q4_1
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir).eval()
    with torch.no_grad():
        model.model.layers[3].mlp.up_proj.weight[0, 0] += 1.0
    assert gguf_swap.quantize_from_gguf(model, file) == 210
    assert type(model.model.layers[3].mlp.up_proj) is torch.nn.Linear
    assert isinstance(model.model.layers[3].mlp.down_proj, QuantizedLinear)


def test_int8_activations_serve_the_q4_1_model_close_to_exact(smollm2_q4_1):
    """The opt-in reaches every block layer and the native stack, passes the load-time check, and its logits stay
    within a few percent of the exact ones (what 8-bit inputs cost; the greedy agreement is bench/peers.py's).

    Measured as each step's logits' distance over their norm (0.01-0.04; 0.2-0.7 with the native stack's output
    projection fed the wrong 8-bit input): the largest of 49152 differences over the largest logit, the measure
    before, is the tail of a noise in which a last-bit difference upstream flips an 8-bit rounding, and it read
    0.043 in the AVX-512 build and 0.054 in the AVX2 build of one Intel Xeon."""
    file, model_dir = smollm2_q4_1
    logits = {}
    for int8 in (False, True):
        engine = LLMEngine(EngineConfig(str(model_dir), num_kv_blocks=64, gguf_file=str(file), int8_activations=int8))
        layers = [m for m in engine.runner.model.modules() if isinstance(m, QuantizedLinear)]
        assert len(layers) == 211 and all(layer.int8_activations == int8 for layer in layers)
        assert engine.runner.decoder_stack is not None  # checked with float32 inputs, then serving 8-bit ones
        seq = Sequence(list(range(300, 340)), SamplingParams(max_tokens=2, return_generation_logits=True))
        engine.add(seq)
        while engine.has_work():
            engine.step()
        logits[int8] = torch.stack(seq.recorded.generation_logits)
    gap = (logits[True] - logits[False]).norm(dim=-1) / logits[False].norm(dim=-1)
    assert (gap > 0).all() and (gap < 0.1).all(), gap


def test_a_layer_whose_kernel_computes_otherwise_stays_float32(smollm2_q4_1, monkeypatch, tmp_path):
    """The load holds the kernel that will run, not only the dequantized blocks, to the float32 weight."""
    import transformers

    monkeypatch.setenv(model_cache.CACHE_ENV, str(tmp_path))  # no verdict of an earlier load

    file, model_dir = smollm2_q4_1
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir).eval()
    honest = QuantizedLinear.forward
    # off by a thousandth on gate_proj's and up_proj's shape (1536 x 576): 60 layers
    monkeypatch.setattr(
        QuantizedLinear, "forward", lambda self, x: honest(self, x) * (1.001 if self.out_features == 1536 else 1)
    )
    assert gguf_swap.quantize_from_gguf(model, file) == 211 - 60
    mlp = model.model.layers[5].mlp
    assert type(mlp.gate_proj) is torch.nn.Linear and type(mlp.up_proj) is torch.nn.Linear
    assert isinstance(mlp.down_proj, QuantizedLinear)


def test_a_later_load_of_the_same_file_reads_the_checks_verdict(smollm2_q4_1, monkeypatch, tmp_path):
    """The checks' verdict is kept for the same file, weights, code and kernel build: the second load refuses
    what the first refused without checking again, and a load of another file checks again."""
    import shutil

    import transformers

    file, model_dir = smollm2_q4_1
    monkeypatch.setenv(model_cache.CACHE_ENV, str(tmp_path))
    honest = QuantizedLinear.forward

    def load(gguf_file) -> int:
        model = transformers.AutoModelForCausalLM.from_pretrained(model_dir).eval()
        return gguf_swap.quantize_from_gguf(model, gguf_file)

    def off(self, x):  # a thousandth off on gate_proj's and up_proj's shape: 60 layers
        return honest(self, x) * (1.001 if self.out_features == 1536 else 1)

    monkeypatch.setattr(QuantizedLinear, "forward", off)
    assert load(file) == 211 - 60
    monkeypatch.setattr(QuantizedLinear, "forward", honest)
    assert load(file) == 211 - 60  # the verdict, not a new check
    assert len(list(tmp_path.glob("*.gguf_blocks_checked.json"))) == 1
    copy = shutil.copy(file, tmp_path / "copy.gguf")
    assert load(copy) == 211  # another file: checked again
