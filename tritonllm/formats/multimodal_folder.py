"""A multimodal model's folder seen as two parts: the media towers (served by the multimodal_encoders model) and
the language model (served by the llm like any text model, with every fast path).

The llm reads its language model from a folder derived once and cached: config.json is the composite config's
`text_config` as a causal LM's, and the weights are the language model's tensors under a causal LM's names
(`model.layers.0...`, `lm_head.weight`), which is how transformers' own conversion maps them. The other files
(tokenizer, generation config) are linked, not copied. A family not listed here is refused at load by name.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from tritonllm.common.unsupported_model import UnsupportedModelError
from tritonllm.formats.model_cache import cache_dir

MEDIA_TOWERS = ("vision_config", "audio_config", "speech_config", "video_config")


@dataclass(frozen=True)
class Layout:
    """Where a family keeps its language model's tensors, oldest checkpoint format first, and what it takes."""

    text_prefixes: tuple[str, ...]  # prefixes of the language model's decoder tensors -> "model."
    head_prefixes: tuple[str, ...]  # prefixes of its output layer -> "lm_head."
    media: frozenset[str]  # the media kinds the family's encoders take
    tower_prefixes: tuple[str, ...] = ()  # the towers' tensors where a text prefix would take them too


_LEGACY_AND_V5 = dict(
    text_prefixes=("language_model.model.", "model.language_model."),
    head_prefixes=("language_model.lm_head.", "lm_head."),
)
LAYOUTS = {
    "llava": Layout(**_LEGACY_AND_V5, media=frozenset({"image"})),
    "idefics3": Layout(("model.text_model.",), ("lm_head.",), frozenset({"image"})),
    "qwen2_audio": Layout(**_LEGACY_AND_V5, media=frozenset({"audio"})),
    "qwen2_vl": Layout(
        ("model.language_model.", "model."),
        ("lm_head.",),
        frozenset({"image", "video"}),
        tower_prefixes=("model.visual.",),
    ),
    # images only: a video's M-RoPE positions follow its frames' timing (second_per_grid_ts), not kept here yet
    "qwen2_5_vl": Layout(
        ("model.language_model.", "model."), ("lm_head.",), frozenset({"image"}), tower_prefixes=("model.visual.",)
    ),
}
# multimodal families refused at load, and why (any other is refused as one without an encoder here)
REFUSED = {
    "smolvlm": "SmolVLM2's processor needs transformers' video processor, which needs a torchvision that does not "
    "load with this torch (SmolVLM, model_type idefics3, is served)",
}
# a language model's model_type -> the causal LM served for it, under its own type
TEXT_ARCHITECTURES = {
    "llama": ("LlamaForCausalLM", "llama"),
    "mistral": ("MistralForCausalLM", "mistral"),
    "qwen2": ("Qwen2ForCausalLM", "qwen2"),
    # Qwen2 with M-RoPE: the same tensors; the rope sections kept as mrope_section, which the engine applies
    "qwen2_vl_text": ("Qwen2ForCausalLM", "qwen2"),
    "qwen2_5_vl_text": ("Qwen2ForCausalLM", "qwen2"),
}


def read_config(model_dir: Path) -> dict:
    return json.loads((Path(model_dir) / "config.json").read_text())


def towers(config: dict) -> list[str]:
    """The media towers a config.json names (none for a text model)."""
    return [name for name in MEDIA_TOWERS if config.get(name)]


def is_multimodal(model_dir: Path) -> bool:
    return bool(towers(read_config(model_dir)))


def text_config(config: dict) -> dict:
    """The language model's config: the composite config's text_config, or the whole config of a text model."""
    return config.get("text_config") or config


def media_kinds(model_dir: Path) -> frozenset[str]:
    """The media a model takes: none for a text model."""
    config = read_config(model_dir)
    return layout(config).media if towers(config) else frozenset()


def why_not(config: dict) -> str | None:
    """None when this folder's language model can be split out and served; else what stands in the way."""
    family = config.get("model_type")
    if family in REFUSED:
        return f"{family}: {REFUSED[family]}"
    if family not in LAYOUTS:
        return f"{family} is a multimodal family this server has no encoder for (served: {sorted(LAYOUTS)})"
    text_type = text_config(config).get("model_type", "llama")
    if text_type not in TEXT_ARCHITECTURES:
        return f"{family}'s language model is {text_type}, not one of {sorted(TEXT_ARCHITECTURES)}"
    return None


def layout(config: dict) -> Layout:
    reason = why_not(config)
    if reason:
        raise UnsupportedModelError(reason)
    return LAYOUTS[config["model_type"]]


def language_model_dir(model_dir: Path) -> Path:
    """The folder the llm loads: `model_dir` itself for a text model, else its language model, derived once."""
    model_dir = Path(model_dir)
    config = read_config(model_dir)
    if not towers(config):
        return model_dir
    family = layout(config)
    target = cache_dir().parent / "language-models" / _identity(model_dir)
    if not (target / "config.json").exists():
        _derive(model_dir, config, family, target)
    return target


def _identity(model_dir: Path) -> str:
    """Names the derived folder: the source folder and its files' sizes and times."""
    model_dir = model_dir.resolve()
    files = sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in model_dir.iterdir() if p.is_file())
    return hashlib.sha256(json.dumps([str(model_dir), files]).encode()).hexdigest()[:32]


def _derive(model_dir: Path, config: dict, family: Layout, target: Path) -> None:
    from safetensors import safe_open  # noqa: PLC0415 - only a multimodal model's first load needs it
    from safetensors.torch import save_file  # noqa: PLC0415

    partial = target.with_name(f"{target.name}.{os.getpid()}.tmp")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    text = dict(text_config(config))
    architecture, text["model_type"] = TEXT_ARCHITECTURES[text.get("model_type", "llama")]
    text["architectures"] = [architecture]
    text.setdefault("tie_word_embeddings", config.get("tie_word_embeddings", False))
    rope = dict(text.get("rope_parameters") or text.get("rope_scaling") or {})
    if "mrope_section" in rope:
        text["mrope_section"] = rope.pop("mrope_section")
        rope["rope_type"] = "default" if rope.get("rope_type") in (None, "mrope") else rope["rope_type"]
        rope.pop("type", None)
        text["rope_parameters"] = rope
        text.pop("rope_scaling", None)
    (partial / "config.json").write_text(json.dumps(text, indent=2))
    tensors = {}
    for weights in sorted(model_dir.glob("*.safetensors")):
        with safe_open(weights, "pt") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                renamed = _renamed(name, family)
                if renamed is not None:
                    tensors[renamed] = f.get_tensor(name)
    if not tensors:
        raise FileNotFoundError(f"{model_dir} holds no safetensors weights of its language model")
    save_file(tensors, partial / "model.safetensors", metadata={"format": "pt"})
    for path in model_dir.iterdir():
        if path.is_file() and path.name != "config.json" and not path.name.endswith((".safetensors", ".json.index")):
            (partial / path.name).symlink_to(path.resolve())
    try:
        partial.replace(target)
    except OSError:  # another process derived it first
        shutil.rmtree(partial, ignore_errors=True)


def _renamed(name: str, family: Layout) -> str | None:
    if name.startswith(family.tower_prefixes):
        return None
    for prefix in family.text_prefixes:
        if name.startswith(prefix):
            return "model." + name[len(prefix) :]
    for prefix in family.head_prefixes:
        if name.startswith(prefix):
            return "lm_head." + name[len(prefix) :]
    return None
