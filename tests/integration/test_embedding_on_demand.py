"""The embedding model's stub loads torch, transformers and the weights at its first request, not at load: a
server that serves no embeddings pays neither the memory nor the start for them. The load still refuses a
folder whose pipeline this embedder cannot compute."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from conftest import REPOSITORY, launch_triton

from tritonllm.backend.embedding import EMBEDDING_MODEL_DIR_ENV, embedding_model_dir
from tritonllm.launcher.tritonserver import ServerError, TritonServer


def embedding_only(tmp_path: Path) -> Path:
    repository = tmp_path / "repository"
    shutil.copytree(REPOSITORY / "embedding", repository / "embedding", ignore=shutil.ignore_patterns("__pycache__"))
    return repository


def maps_torch(pid: int) -> bool:
    return "libtorch_cpu.so" in Path(f"/proc/{pid}/maps").read_text()


def embed(server: TritonServer, texts: list[str]) -> np.ndarray:
    client = httpclient.InferenceServerClient(server.http_url.removeprefix("http://"))
    rows = httpclient.InferInput("text_input", [len(texts), 1], "BYTES")
    rows.set_data_from_numpy(np.array([[t.encode()] for t in texts], dtype=object))
    return client.infer("embedding", [rows]).as_numpy("embedding")


def test_the_first_request_loads_the_model(tiny_model_dir, tmp_path, sentence_model):
    server = launch_triton(tiny_model_dir, tmp_path, embedding_only(tmp_path))
    try:
        [stub] = server.stubs_of("embedding")
        assert not maps_torch(stub)
        texts = ["the first request loads the model", "and is answered as any other"]
        np.testing.assert_allclose(embed(server, texts), sentence_model.encode(texts), atol=2e-6)
        assert maps_torch(stub)
        np.testing.assert_allclose(embed(server, texts[:1]), sentence_model.encode(texts[:1]), atol=2e-6)
    finally:
        server.stop()


def test_a_folder_it_cannot_compute_still_fails_the_load(tiny_model_dir, tmp_path, monkeypatch):
    folder = tmp_path / "with-dense"
    shutil.copytree(embedding_model_dir(), folder)
    modules = json.loads((folder / "modules.json").read_text())
    modules.insert(2, {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"})
    (folder / "modules.json").write_text(json.dumps(modules))
    monkeypatch.setenv(EMBEDDING_MODEL_DIR_ENV, str(folder))
    with pytest.raises(ServerError, match=r"(?s)embedding: .*modules \['Transformer', 'Pooling', 'Dense'"):
        launch_triton(tiny_model_dir, tmp_path, embedding_only(tmp_path)).stop()  # stopped, should it start
