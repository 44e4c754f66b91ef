"""Several LLMs in one tritonserver, through `serve`: each answers by name with the openai SDK as transformers'
generate() does on its weights, Triton clients reach each by its ensemble's name, and with `--models-max` a model
not loaded is loaded at its first request while the least recently used one is unloaded, its processes ended."""

from __future__ import annotations

import json
import os
import re
import subprocess
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
from conftest import MODELS
from oracles import greedy_text
from transformers import AutoModelForCausalLM, AutoTokenizer
from triton_helpers import pause_llm, wait_for

from .conftest import running_serve

MESSAGES = [{"role": "user", "content": "Name a fruit"}]


def expected(model_dir) -> str:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    prompt = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, return_dict=True)["input_ids"]
    return greedy_text(model, tokenizer, list(prompt), 12)[0]


def chat(client: openai.OpenAI, model: str) -> str:
    answer = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=12, temperature=0)
    assert answer.model == model
    return answer.choices[0].message.content


def ready(ports: dict, model: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{ports['--http-port']}/v2/models/{model}/ready") as answer:
            return answer.status == 200
    except OSError:
        return False


def stubs(ports: dict) -> dict[str, int]:
    """The served models' processes: model name -> pid."""
    server = subprocess.run(["pgrep", "-P", str(ports["pid"])], capture_output=True, text=True).stdout.split()
    found = {}
    for pid in subprocess.run(["pgrep", "-P", server[0]], capture_output=True, text=True).stdout.split():
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            found[f.read().split(b"\0")[1].decode().split("/")[-3]] = int(pid)
    return found


def rss_mb(pids) -> int:
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/status") as f:
            total += next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) // 1024
    return total


@pytest.fixture(scope="module")
def models_folder(tmp_path_factory, tiny_model_dir, small_model_dir):
    """small and a second name for tiny (tiny2), as a models folder."""
    folder = tmp_path_factory.mktemp("models")
    for name, target in (("small", small_model_dir), ("tiny2", tiny_model_dir)):
        (folder / name).symlink_to(target.resolve())
    return folder


def test_several_llms_answer_by_name_and_load_on_demand(models_folder, tmp_path):
    answers = {name: expected(MODELS / name) for name in ("small", "tiny")}
    assert answers["small"] != answers["tiny"]
    flags = ("--models-folder", str(models_folder), "--models-max", "2", "--no-embedding")
    with running_serve(MODELS / "tiny", tmp_path, *flags) as ports:
        url = f"http://127.0.0.1:{ports['--shim-port']}"
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        assert [m.id for m in client.models.list()] == ["tiny", "small", "tiny2"]
        # the first two load at start; the first keeps the repository's names, the others are named after them
        assert ready(ports, "ensemble") and ready(ports, "small") and not ready(ports, "tiny2")
        assert chat(client, "tiny") == answers["tiny"]
        assert chat(client, "small") == answers["small"]
        body = {"model": "small", "prompt": "Once", "max_tokens": 6, "temperature": 0, "stream": True}
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as streamed:
            lines = [line[6:] for line in streamed.iter_lines() if line.startswith("data: {")]
        whole = httpx.post(f"{url}/v1/completions", json={**body, "stream": False}, timeout=60).json()
        assert "".join(json.loads(line)["choices"][0]["text"] for line in lines) == whole["choices"][0]["text"]
        triton = {"text_input": "Once", "max_tokens": 6, "exclude_input_in_output": True}  # else the prompt first
        generated = httpx.post(f"http://127.0.0.1:{ports['--http-port']}/v2/models/small/generate", json=triton)
        assert generated.json()["text_output"] == whole["choices"][0]["text"]
        spec = {"text_input": "Once", "parameters": {"max_new_tokens": 6}}  # the shim's generate_stream spec
        with httpx.stream("POST", f"{url}/v2/models/small/generate_stream", json=spec, timeout=60) as streamed:
            events = [json.loads(line[5:]) for line in streamed.iter_lines() if line.startswith("data:")]
        assert "".join(e["text_output"] for e in events) == whole["choices"][0]["text"]

        before = stubs(ports)
        rss_before = rss_mb(before.values())
        # tiny2 loads at its first request; tiny, used less recently than small, makes room
        assert chat(client, "tiny2") == answers["tiny"]
        assert ready(ports, "tiny2") and ready(ports, "small") and not ready(ports, "ensemble")
        assert wait_for(lambda: not os.path.exists(f"/proc/{before['llm']}"), timeout=30)
        after = stubs(ports)
        assert set(after) == {"small-preprocessing", "small-llm", "small-postprocessing"} | {
            f"tiny2-{part}" for part in ("preprocessing", "llm", "postprocessing")
        }
        assert rss_mb(after.values()) < rss_before * 1.1  # tiny's memory went with it
        # tiny again: small is now the least recently used
        assert chat(client, "tiny") == answers["tiny"]
        assert ready(ports, "ensemble") and ready(ports, "tiny2") and not ready(ports, "small")
        assert httpx.get(f"{url}/health").json() == {"status": "ok"}
        with pytest.raises(openai.NotFoundError, match="'nope' does not exist.*'tiny2'"):
            chat(client, "nope")


def test_a_model_in_use_is_not_unloaded_and_the_router_routes(models_folder, tmp_path):
    answers = {name: expected(MODELS / name) for name in ("small", "tiny")}
    flags = ("--models-folder", str(models_folder), "--models-max", "2", "--no-embedding")
    with running_serve(MODELS / "tiny", tmp_path, *flags) as ports, ThreadPoolExecutor(2) as pool:
        url = f"http://127.0.0.1:{ports['--shim-port']}"
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        # tiny's request waits in its paused engine: tiny is in use, and used less recently than small
        pause_llm(f"127.0.0.1:{ports['--grpc-port']}", True)
        try:
            waiting = pool.submit(chat, client, "tiny")
            assert wait_for(lambda: waiting_in(ports, "llm_0_0") == 1, timeout=30)
            assert chat(client, "small") == answers["small"]
            loading = pool.submit(chat, client, "tiny2")
            # small, not tiny, makes room
            assert wait_for(lambda: not ready(ports, "small"), timeout=60)
            assert ready(ports, "ensemble") and not waiting.done()
        finally:
            pause_llm(f"127.0.0.1:{ports['--grpc-port']}", False)
        assert waiting.result(timeout=60) == answers["tiny"]
        assert loading.result(timeout=60) == answers["tiny"]

        # llama.cpp's router routes
        def states() -> dict:
            return {m["id"]: m["status"]["value"] for m in httpx.get(f"{url}/models").json()["data"]}

        assert states() == {"tiny": "loaded", "small": "unloaded", "tiny2": "loaded"}
        assert httpx.post(f"{url}/models/unload", json={"model": "tiny2"}, timeout=60).json() == {"success": True}
        assert states() == {"tiny": "loaded", "small": "unloaded", "tiny2": "unloaded"}
        assert httpx.post(f"{url}/models/load", json={"model": "small"}, timeout=60).json() == {"success": True}
        assert states() == {"tiny": "loaded", "small": "loaded", "tiny2": "unloaded"}
        refused = httpx.post(f"{url}/models/load", json={"model": "nope"}, timeout=60)
        assert refused.status_code == 404 and refused.json()["error"]["param"] == "model"


def waiting_in(ports: dict, instance: str) -> float:
    text = httpx.get(f"http://127.0.0.1:{ports['--metrics-port']}/metrics").text
    found = re.search(rf'^tritonllm_requests_waiting{{instance="{instance}"}} (\S+)$', text, re.M)
    return float(found.group(1)) if found else -1.0
