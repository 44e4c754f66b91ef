"""A Hugging Face hub cache laid out as huggingface_hub lays it out, for tests that must run offline: per repository
`models--org--name/` with `blobs/` named by the content's sha256, `snapshots/<commit>/` of relative links to
them, and `refs/<revision>` holding the commit."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path


def cache_repo(cache: Path, repo: str, files: dict[str, Path | bytes], revision: str = "main") -> str:
    """Puts `files` (a name in the repository: a file to copy, or bytes) into `cache` as one commit of `repo` at
    `revision`; returns the commit."""
    folder = cache / f"models--{repo.replace('/', '--')}"
    digests = {name: _digest(source) for name, source in files.items()}
    commit = hashlib.sha1("".join(f"{n}:{d}" for n, d in sorted(digests.items())).encode()).hexdigest()
    for name, source in files.items():
        blob = folder / "blobs" / digests[name]
        blob.parent.mkdir(parents=True, exist_ok=True)
        if not blob.exists():
            if isinstance(source, Path):
                shutil.copyfile(source, blob)
            else:
                blob.write_bytes(source)
        link = folder / "snapshots" / commit / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (folder / "refs").mkdir(parents=True, exist_ok=True)
    (folder / "refs" / revision).write_text(commit)  # no newline, as huggingface_hub writes it
    return commit


def folder_files(folder: Path) -> dict[str, Path]:
    """A local model folder's files by their names in it."""
    return {str(p.relative_to(folder)): p for p in sorted(folder.rglob("*")) if p.is_file()}


def _digest(source: Path | bytes) -> str:
    if isinstance(source, bytes):
        return hashlib.sha256(source).hexdigest()
    digest = hashlib.sha256()
    with source.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
