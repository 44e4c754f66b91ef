"""`serve --no-embedding`: tritonserver loads no embedding model, /v1/models lists only the served model, and
/v1/embeddings is a 404 that says why, while generation works as before."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tritonllm.runtime.tritonserver import free_port


def test_serve_without_the_embedding_model(tiny_model_dir, tmp_path):
    ports = {flag: free_port() for flag in ("--http-port", "--grpc-port", "--metrics-port", "--shim-port")}
    command = [str(Path(sys.executable).parent / "tritonllm"), "serve", "--model-dir", str(tiny_model_dir)]
    command += ["--no-embedding", *(str(v) for pair in ports.items() for v in pair)]
    log = (tmp_path / "serve.log").open("w")
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    shim = f"http://127.0.0.1:{ports['--shim-port']}"
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            assert process.poll() is None, (tmp_path / "serve.log").read_text()
            try:
                if httpx.get(f"{shim}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.3)
        triton = f"http://127.0.0.1:{ports['--http-port']}"
        assert httpx.get(f"{triton}/v2/models/llm/ready").status_code == 200
        assert httpx.get(f"{triton}/v2/models/embedding/ready").status_code != 200
        index = httpx.post(f"{triton}/v2/repository/index", json={}).json()
        assert "embedding" not in {model["name"] for model in index}

        assert [m["id"] for m in httpx.get(f"{shim}/v1/models").json()["data"]] == ["tiny"]
        refused = httpx.post(f"{shim}/v1/embeddings", json={"model": "all-MiniLM-L6-v2", "input": "hi"})
        assert refused.status_code == 404
        error = refused.json()["error"]
        assert error["param"] == "model" and "serves no embedding model" in error["message"]

        completion = httpx.post(f"{shim}/v1/completions", json={"model": "tiny", "prompt": "Hi", "max_tokens": 4})
        assert completion.status_code == 200 and completion.json()["usage"]["completion_tokens"] == 4
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(60)
        log.close()
