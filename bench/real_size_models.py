"""Real-size model files for benches and tests, with random weights (speed and memory depend on the shape, not on
the values), built once and cached under the peers' cache:

- a folder per shape from transformers (random init, bfloat16 safetensors) with SmolLM2's tokenizer;
- GGUF files from it by llama.cpp's own `convert_hf_to_gguf.py` (bf16) and `llama-quantize` (Q4_K_M, Q5_K_M, Q8_0,
  IQ4_XS, ...), both from the sources the pinned llama-cpp-python sdist vendors;
- for the 8B shape, a Q4_K_M file written by gguf-py directly (random blocks, sane float16 scales, the tensor types
  llama-quantize gives Q4_K_M), so that no 16 GB folder is needed.

    .venv/bin/python bench/real_size_models.py --shape 1b --types Q4_K_M Q5_K_M Q8_0 IQ4_XS
    .venv/bin/python bench/real_size_models.py --shape 8b --types Q4_K_M
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
from peers import CACHE, MODEL, llama_cpp_sources, llama_cpp_tool

# transformers' LlamaConfig fields of each shape (Llama-3.2-1B, Llama-3.2-3B, Llama-3.1-8B), SmolLM2's vocabulary
SHAPES = {
    "1b": {"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32},
    "3b": {"hidden_size": 3072, "intermediate_size": 8192, "num_hidden_layers": 28, "num_attention_heads": 24},
    "8b": {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32},
}
COMMON = {"num_key_value_heads": 8, "rope_theta": 500000.0, "max_position_embeddings": 8192, "rms_norm_eps": 1e-5}
TIED = {"1b": True, "3b": True, "8b": False}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")
FOLDER = CACHE / "real-size"


def hf_folder(shape: str) -> Path:
    """The shape's HF folder: random weights (seed 0, std 0.02) in bfloat16, SmolLM2's tokenizer."""
    folder = FOLDER / f"llama-{shape}"
    if (folder / "config.json").exists():
        return folder
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = json.loads((MODEL / "config.json").read_text())
    config = LlamaConfig(
        **SHAPES[shape],
        **COMMON,
        vocab_size=tokenizer["vocab_size"],
        bos_token_id=tokenizer.get("bos_token_id"),
        eos_token_id=tokenizer.get("eos_token_id"),
        tie_word_embeddings=TIED[shape],
        torch_dtype="bfloat16",
    )
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    model = LlamaForCausalLM(config)
    partial = folder.with_name(folder.name + ".partial")
    model.save_pretrained(partial)
    for name in TOKENIZER_FILES:
        if (MODEL / name).exists():
            shutil.copy(MODEL / name, partial / name)
    partial.rename(folder)
    return folder


def gguf_file(shape: str, kind: str) -> Path:
    """The shape's GGUF file of type `kind` (BF16: convert_hf_to_gguf.py's; others llama-quantize's from it)."""
    out = FOLDER / f"llama-{shape}-{kind}.gguf"
    if out.exists():
        return out
    if shape == "8b" and kind == "Q4_K_M":
        return random_q4_k_m(shape, out)
    sources = llama_cpp_sources()
    partial = out.with_suffix(".partial")
    if kind == "BF16":
        env = {**os.environ, "PYTHONPATH": str(sources / "gguf-py")}
        command = [sys.executable, str(sources / "convert_hf_to_gguf.py"), str(hf_folder(shape))]
        subprocess.run([*command, "--outtype", "bf16", "--outfile", str(partial)], check=True, env=env)
    else:
        quantize = llama_cpp_tool("llama-quantize")
        subprocess.run([str(quantize), str(gguf_file(shape, "BF16")), str(partial), kind], check=True)
    partial.rename(out)
    return out


def q4_k_m_type(name: str, layer: int, layers: int) -> str:
    """The type llama-quantize gives a Llama tensor in a Q4_K_M file (llama-quant.cpp: Q6_K for the output layer,
    and for attn_v and ffn_down in the first and last eighth of the layers and every third between; Q4_K else)."""
    if name == "output":
        return "Q6_K"
    if name in ("attn_v", "ffn_down"):
        eighth = layers // 8
        if layer < eighth or layer >= layers - eighth or (layer - eighth) % 3 == 2:
            return "Q6_K"
    return "Q4_K"


def random_q4_k_m(shape: str, out: Path) -> Path:
    """A Q4_K_M file of the shape written by gguf-py: every block random bits with its float16 d and dmin set to
    small random values, the metadata and tokenizer those of the 1B file."""
    import gguf as gguf_py

    template = gguf_py.GGUFReader(gguf_file("1b", "Q8_0"))
    shape_of = {**SHAPES[shape], **COMMON}
    hidden, layers = shape_of["hidden_size"], shape_of["num_hidden_layers"]
    heads, kv_heads = shape_of["num_attention_heads"], shape_of["num_key_value_heads"]
    head_dim = hidden // heads
    writer = gguf_py.GGUFWriter(str(out.with_suffix(".partial")), "llama")
    overrides = {
        "llama.block_count": layers,
        "llama.embedding_length": hidden,
        "llama.feed_forward_length": shape_of["intermediate_size"],
        "llama.attention.head_count": heads,
        "llama.attention.head_count_kv": kv_heads,
        "llama.rope.dimension_count": head_dim,
        "llama.attention.key_length": head_dim,
        "llama.attention.value_length": head_dim,
        "general.file_type": gguf_py.LlamaFileType.MOSTLY_Q4_K_M,
        "general.name": f"llama-{shape} (random Q4_K_M blocks)",
    }
    for field in template.fields.values():
        if field.name.startswith("GGUF.") or field.name in ("general.architecture", "general.alignment"):
            continue
        value = overrides.get(field.name, field.contents())
        kind = field.types[0]
        if kind == gguf_py.GGUFValueType.ARRAY:
            writer.add_array(field.name, value)
        else:
            writer.add_key_value(field.name, value, kind)
    vocab = template.fields["tokenizer.ggml.tokens"].contents().__len__()
    rng = np.random.default_rng(0)
    tensors = [("token_embd", "Q4_K", (vocab, hidden)), ("output_norm", "F32", (hidden,))]
    if not TIED[shape]:
        tensors.append(("output", "Q6_K", (vocab, hidden)))
    for i in range(layers):
        for name, rows, cols in (
            ("attn_q", hidden, hidden),
            ("attn_k", kv_heads * head_dim, hidden),
            ("attn_v", kv_heads * head_dim, hidden),
            ("attn_output", hidden, hidden),
            ("ffn_gate", shape_of["intermediate_size"], hidden),
            ("ffn_up", shape_of["intermediate_size"], hidden),
            ("ffn_down", hidden, shape_of["intermediate_size"]),
        ):
            tensors.append((f"blk.{i}.{name}", q4_k_m_type(name, i, layers), (rows, cols)))
        tensors += [(f"blk.{i}.attn_norm", "F32", (hidden,)), (f"blk.{i}.ffn_norm", "F32", (hidden,))]
    for name, kind, dims in tensors:
        kind_id = gguf_py.GGMLQuantizationType[kind]
        writer.add_tensor(f"{name}.weight", random_blocks(rng, kind, dims), raw_dtype=kind_id)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file(progress=True)
    writer.close()
    out.with_suffix(".partial").rename(out)
    return out


# each block type's float16 fields (d, dmin) by byte offset
HALVES = {"Q4_K": (0, 2), "Q6_K": (208,)}


def random_blocks(rng: np.random.Generator, kind: str, dims: tuple[int, ...]) -> np.ndarray:
    import gguf as gguf_py

    if kind == "F32":
        return np.ones(dims, dtype=np.float32)
    block, size = gguf_py.GGML_QUANT_SIZES[gguf_py.GGMLQuantizationType[kind]]
    rows, cols = dims
    blocks = rng.integers(0, 256, (rows, cols // block, size), dtype=np.uint8)
    for at in HALVES[kind]:
        blocks[:, :, at : at + 2] = (rng.random((rows, cols // block, 1)) * 2e-3).astype(np.float16).view(np.uint8)
    return blocks.reshape(rows, -1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=sorted(SHAPES), required=True)
    parser.add_argument("--types", nargs="+", default=["Q4_K_M"], help="llama-quantize's type names, or BF16")
    args = parser.parse_args()
    for kind in args.types:
        path = gguf_file(args.shape, kind)
        print(f"{path} {path.stat().st_size / 2**20:.0f} MiB", flush=True)


if __name__ == "__main__":
    main()
