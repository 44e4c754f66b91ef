"""`serve --no-embedding`: tritonserver loads no embedding model, /v1/models lists only the served model, and
/v1/embeddings is a 404 that says why (as /v1/rerank without a reranker), while generation works as before."""

from __future__ import annotations

import httpx

from .conftest import running_serve


def test_serve_without_the_embedding_model(tiny_model_dir, tmp_path):
    with running_serve(tiny_model_dir, tmp_path, "--no-embedding") as ports:
        triton = f"http://127.0.0.1:{ports['--http-port']}"
        shim = f"http://127.0.0.1:{ports['--shim-port']}"
        assert httpx.get(f"{triton}/v2/models/llm/ready").status_code == 200
        assert httpx.get(f"{triton}/v2/models/embedding/ready").status_code != 200
        index = httpx.post(f"{triton}/v2/repository/index", json={}).json()
        assert "embedding" not in {model["name"] for model in index}

        assert [m["id"] for m in httpx.get(f"{shim}/v1/models").json()["data"]] == ["tiny"]
        refused = httpx.post(f"{shim}/v1/embeddings", json={"model": "all-MiniLM-L6-v2", "input": "hi"})
        assert refused.status_code == 404
        error = refused.json()["error"]
        assert error["param"] == "model" and "serves no embedding model" in error["message"]
        # nor a reranker, which is served only when asked for
        assert "reranker" not in {model["name"] for model in index}
        refused = httpx.post(f"{shim}/v1/rerank", json={"model": "tiny", "query": "q", "documents": ["d"]})
        assert refused.status_code == 404 and "serves no reranker" in refused.json()["error"]["message"]

        completion = httpx.post(f"{shim}/v1/completions", json={"model": "tiny", "prompt": "Hi", "max_tokens": 4})
        assert completion.status_code == 200 and completion.json()["usage"]["completion_tokens"] == 4
