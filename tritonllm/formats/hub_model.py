"""Models named by their Hugging Face Hub id (`org/name`, or llama.cpp's `org/name:QUANT` for one file of a GGUF
repository), resolved by huggingface_hub with its own conventions: the cache of $HF_HUB_CACHE (else $HF_HOME/hub,
else ~/.cache/huggingface/hub), $HF_HUB_OFFLINE for the cache alone, $HF_TOKEN for gated and private repositories,
and a revision (a branch, tag or commit). Online, what is missing is downloaded with huggingface_hub's progress
bars; offline, the cache answers or the error names the cache folder and the variable.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

HUB_ID = re.compile(r"(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)(?::(?P<tag>[\w.-]+))?")
# What a folder model (an LLM, a sentence-transformers or cross-encoder folder, a LoRA adapter) is served from:
# configs, weights, tokenizers and chat templates, not a repository's other formats (ONNX, GGUF, PyTorch pickles
# beside safetensors).
FOLDER_FILES = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja", "*.tiktoken"]
DEFAULT_GGUF_TAG = "Q4_K_M"  # llama.cpp's choice when `-hf` names no quantization
OFFLINE_VALUES = {"1", "ON", "YES", "TRUE"}


class HubModelError(ValueError):
    """A hub id that cannot be served: not in the cache while offline, not on the hub, or no file that fits."""


def is_hub_id(name: str) -> bool:
    """An `org/name[:QUANT]` that is not a path on this machine: neither it nor its first part (`models/` of
    `models/foo`, a folder here) exists."""
    if HUB_ID.fullmatch(name) is None:
        return False
    return not Path(name).exists() and not Path(name.split("/", 1)[0]).is_dir()


def cache_dir() -> Path:
    """The hub cache huggingface_hub uses, read from the environment now (its constants are read at import)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache") / "huggingface"
    return Path(home).expanduser() / "hub"


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").upper() in OFFLINE_VALUES


def repo_of(path: Path) -> str | None:
    """`org/name` of a path inside a hub cache's snapshot (`models--org--name/snapshots/<commit>/...`), else None."""
    parts = path.parts
    for place in range(len(parts) - 2):
        if parts[place].startswith("models--") and parts[place + 1] == "snapshots":
            return parts[place][len("models--") :].replace("--", "/", 1)
    return None


def served_name(path: Path) -> str | None:
    """The name a model resolved from the hub is served by beside the first: its repository's name (a snapshot
    folder is named by its commit), or a GGUF file's stem; None outside a hub cache."""
    repo = repo_of(path)
    if repo is None:
        return None
    return path.stem if path.suffix == ".gguf" else repo.split("/", 1)[1]


def resolve(name: str, revision: str | None = None) -> Path:
    """The local folder (or .gguf file) of hub id `name` at `revision`, downloaded first when online and missing."""
    from huggingface_hub import errors

    found = HUB_ID.fullmatch(name)
    if found is None:
        raise HubModelError(f"{name!r} is not a hub id (org/name, or org/name:QUANT for a GGUF repository)")
    repo, tag = found.group("repo"), found.group("tag")
    try:
        files = _files(repo, revision)
        ggufs = [f for f in files if f.endswith(".gguf") and "mmproj" not in Path(f).name.lower()]
        if tag is not None or ("config.json" not in files and ggufs):
            return _download(repo, revision, filename=pick_gguf(name, ggufs, tag))
        if "config.json" not in files:
            raise HubModelError(f"{name}: the repository holds no config.json and no .gguf file ({', '.join(files)})")
        patterns = FOLDER_FILES if any(f.endswith(".safetensors") for f in files) else [*FOLDER_FILES, "*.bin"]
        return _download(repo, revision, allow_patterns=patterns)
    except errors.LocalEntryNotFoundError as e:
        raise HubModelError(_not_cached(name, revision)) from e
    except (errors.RepositoryNotFoundError, errors.GatedRepoError) as e:
        raise HubModelError(f"{name}: no such repository on the hub, or it is gated or private (HF_TOKEN)") from e
    except errors.RevisionNotFoundError as e:
        raise HubModelError(f"{name}: no revision {revision!r} on the hub") from e


def pick_gguf(name: str, ggufs: list[str], tag: str | None) -> str:
    """The GGUF file `tag` names (llama.cpp's `:QUANT`, matched as a whole part of the file's name, any case);
    without a tag the only file, else Q4_K_M's. A clear error listing the files when none or several match."""
    listed = ", ".join(ggufs) or "none"
    if tag is None:
        if len(ggufs) == 1:
            return ggufs[0]
        chosen = [f for f in ggufs if _tagged(f, DEFAULT_GGUF_TAG)]
        if len(chosen) == 1:
            return chosen[0]
        raise HubModelError(f"{name}: several GGUF files, name one as {name}:QUANT (files: {listed})")
    chosen = [f for f in ggufs if _tagged(f, tag)]
    if len(chosen) != 1:
        which = "no GGUF file" if not chosen else f"{len(chosen)} GGUF files ({', '.join(chosen)})"
        raise HubModelError(f"{name}: {which} match {tag!r}; the repository's GGUF files: {listed}")
    return chosen[0]


def _tagged(filename: str, tag: str) -> bool:
    return re.search(rf"(?<![A-Za-z0-9]){re.escape(tag)}(?![A-Za-z0-9_])", Path(filename).name, re.I) is not None


def _files(repo: str, revision: str | None) -> list[str]:
    """The repository's files: the hub's list online (the cached snapshot's when the hub cannot be reached),
    the cached snapshot's offline."""
    from huggingface_hub import HfApi, errors, snapshot_download

    if not offline():
        try:
            return HfApi().list_repo_files(repo, revision=revision)
        except (errors.RepositoryNotFoundError, errors.GatedRepoError, errors.RevisionNotFoundError):
            raise
        except Exception:  # no network: the cache may still hold it
            pass
    folder = Path(snapshot_download(repo, revision=revision, cache_dir=cache_dir(), local_files_only=True))
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def _download(repo: str, revision: str | None, filename: str | None = None, allow_patterns=None) -> Path:
    """One file, or a snapshot of the files that match; from the cache alone when offline."""
    from huggingface_hub import hf_hub_download, snapshot_download

    where = {"revision": revision, "cache_dir": cache_dir(), "local_files_only": offline()}
    if filename is not None:
        return Path(hf_hub_download(repo, filename, **where))
    return Path(snapshot_download(repo, allow_patterns=allow_patterns, **where))


def _not_cached(name: str, revision: str | None) -> str:
    at = f" at revision {revision}" if revision else ""
    how = (
        "HF_HUB_OFFLINE is set: download it once online (`hf download` or a run without HF_HUB_OFFLINE)"
        if offline()
        else "the hub cannot be reached"
    )
    return (
        f"{name}{at} is not in the Hugging Face cache {cache_dir()} (HF_HUB_CACHE, else HF_HOME/hub) and {how}, "
        f"or give a local folder or .gguf file"
    )
