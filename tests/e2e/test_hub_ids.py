"""`serve` takes a model by its hub id, as vLLM and llama.cpp users type it, from a Hugging Face cache (offline:
the tests reach no hub), and a model missing from it is one clear line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from conftest import MODELS
from openai import OpenAI

from tests.hub_cache import cache_repo, folder_files

from .conftest import running_serve

REPO = "HuggingFaceTB/tiny-chat"


def test_serve_answers_a_hub_id_by_that_id(tmp_path, monkeypatch):
    cache = tmp_path / "hub"
    cache_repo(cache, REPO, folder_files(MODELS / "tiny"))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with running_serve(REPO, tmp_path, "--no-embedding") as ports:
        client = OpenAI(base_url=f"http://127.0.0.1:{ports['--shim-port']}/v1", api_key="unused", max_retries=0)
        assert [card.id for card in client.models.list().data] == [REPO]
        hello = [{"role": "user", "content": "Hello"}]
        reply = client.chat.completions.create(model=REPO, messages=hello, max_tokens=4, temperature=0)
        assert reply.model == REPO and reply.usage.completion_tokens >= 1


def test_a_hub_id_missing_from_the_cache_offline_is_one_line_and_exit_2(tmp_path):
    env = {"HF_HUB_CACHE": str(tmp_path / "empty"), "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
    command = [str(Path(sys.executable).parent / "tritonllm"), "serve", "--model-dir", "Qwen/Qwen2.5-0.5B-Instruct"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("[tritonllm] Qwen/Qwen2.5-0.5B-Instruct is not in the Hugging Face cache ")
    assert str(tmp_path / "empty") in lines[0] and "HF_HUB_OFFLINE" in lines[0]
