"""Several LLMs in one tritonserver, each served by name (llama.cpp's router mode, on Triton's model repository).

Each LLM is the repository's five models under names of its own: the first keeps the repository's names
(`ensemble`, `preprocessing`, `llm`, `postprocessing`, `tensorrt_llm`), so Triton clients and perf_analyzer reach
it as before; every other is the ensemble named after it (`tiny`) with its steps beside it (`tiny-preprocessing`,
`tiny-llm`, `tiny-postprocessing`, `tiny-tensorrt_llm`). The staged repository holds a copy of each config.pbtxt
with those names and the model's folder written in, and links to everything else.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from tritonllm.formats import gguf, hub_model
from tritonllm.wire.triton_names import TritonNames

TRITON_NAME = re.compile(r"[A-Za-z0-9_.-]+")


@dataclass(frozen=True)
class ServedLLM:
    name: str  # what clients put in `model`
    path: Path  # an HF folder or a .gguf file, as given
    triton: TritonNames


def is_model(path: Path) -> bool:
    return (path / "config.json").exists() or gguf.is_gguf(path)


def models_in(folder: Path) -> list[Path]:
    """A models folder's LLMs: each subfolder with a config.json and each .gguf file, by name."""
    if not folder.is_dir():
        raise ValueError(f"--models-folder {folder}: not a folder")
    found = sorted(p for p in folder.iterdir() if is_model(p))
    if not found:
        raise ValueError(f"--models-folder {folder}: holds no HF model folder (config.json) or .gguf file")
    return found


def served_name_of(path: Path) -> str:
    """A folder's name or a .gguf file's stem; for a hub cache's snapshot, the repository's name."""
    return hub_model.served_name(path) or (path.stem if gguf.is_gguf(path) else path.name)


def llm_set(paths: list[Path], first_name: str | None = None) -> list[ServedLLM]:
    """The LLMs to serve, the first under the repository's own names; ValueError for names served twice or that
    cannot be Triton model names. `first_name`: the first one's served name (--served-model-name)."""
    served: list[ServedLLM] = []
    taken = set(TritonNames().by_folder().values()) | {"embedding"}
    for place, path in enumerate(paths):
        name = first_name if place == 0 and first_name else served_name_of(path)
        if any(s.name == name for s in served):
            raise ValueError(
                f"two models are served as {name!r}: {[str(s.path) for s in served if s.name == name]}"
                f" and {path}; rename a folder or file"
            )
        if place == 0:
            served.append(ServedLLM(name, path, TritonNames()))
            continue
        if not TRITON_NAME.fullmatch(name) or name in taken:
            raise ValueError(
                f"model {name!r} ({path}): a served name beside the first must be a Triton model name "
                f"(letters, digits, _ . -) other than {sorted(taken)}"
            )
        names = TritonNames.named(name)
        if taken & set(names.by_folder().values()):
            raise ValueError(f"model {name!r} ({path}): its Triton models' names are taken")
        taken |= set(names.by_folder().values())
        served.append(ServedLLM(name, path, names))
    return served


def renamed_config(config: str, names: TritonNames, model_dir: Path) -> str:
    """A model's config.pbtxt for one LLM of the set: its own name, its ensemble's steps and its model folder."""
    config = re.sub(r'^name: "(\w+)"', lambda m: f'name: "{names.by_folder()[m.group(1)]}"', config, flags=re.M)
    config = re.sub(r'model_name: "(\w+)"', lambda m: f'model_name: "{names.by_folder()[m.group(1)]}"', config)
    config = re.sub(r'(key: "llm_model" value: \{ string_value: )"\w+"', lambda m: f'{m.group(1)}"{names.llm}"', config)
    return re.sub(r'(key: "model_dir" value: \{ string_value: )"[^"]*"', lambda m: f'{m.group(1)}"{model_dir}"', config)
