"""The tools people point at a server, run as they ship: lm-eval (log-likelihood and generation, against
transformers through lm-eval's own `hf` model), aiperf with its defaults, and genai-perf's tensorrtllm format.

They live in their own venv (`make clients`; tests/clients/requirements.txt), as they need numpy 2.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from conftest import PROJECT_ROOT

from .conftest import MODEL, SMOLLM2, run_tool

TASKS = PROJECT_ROOT / "tests" / "clients" / "lm_eval_tasks"


def lm_eval(out: Path, model: str, model_args: str, task: str, *extra: str) -> dict[int, list]:
    """Runs one lm-eval task; each document's responses, by document id."""
    args = ["run", "--model", model, "--model_args", model_args, "--tasks", task, "--include_path", str(TASKS)]
    run_tool("lm-eval", [*args, "--output_path", str(out), "--log_samples", *extra], cwd=TASKS, timeout=600)
    (samples,) = out.glob(f"*/samples_{task}_*.jsonl")
    return {doc["doc_id"]: doc for doc in map(json.loads, samples.read_text().splitlines())}


@pytest.fixture(scope="module")
def hf(smollm2_dir, tmp_path_factory):
    """lm-eval's own transformers model on the same weights: the reference a served model must match."""
    args = f"pretrained={smollm2_dir},dtype=float32"
    mc = lm_eval(tmp_path_factory.mktemp("hf-mc"), "hf", args, "tritonllm_facts_mc", "--device", "cpu")
    generation = lm_eval(
        tmp_path_factory.mktemp("hf-gen"), "hf", args, "tritonllm_facts_gen", "--device", "cpu", "--apply_chat_template"
    )
    return {"mc": mc, "gen": generation}


def accuracy(docs: dict[int, dict], metric: str) -> float:
    return sum(doc[metric] for doc in docs.values()) / len(docs)


@pytest.mark.parametrize("tokenized", [True, False])
def test_lm_eval_loglikelihood_equals_transformers(smollm2_url, hf, tmp_path, tokenized):
    """local-completions with nothing but the URL: the tokenizer is the server's own (/tokenizer_info,
    /tokenize), prompts go as token ids or as text, scored from echo + logprobs."""
    args = f"model={SMOLLM2},base_url={smollm2_url}/v1/completions,num_concurrent=4,tokenized_requests={tokenized}"
    served = lm_eval(tmp_path, "local-completions", args, "tritonllm_facts_mc")
    reference = hf["mc"]
    assert served.keys() == reference.keys()
    for doc_id, doc in served.items():
        ours = [float(r[0][0]) for r in doc["resps"]]
        theirs = [float(r[0][0]) for r in reference[doc_id]["resps"]]
        assert ours == pytest.approx(theirs, abs=1e-3), doc["doc"]["question"]
    assert accuracy(served, "acc") == accuracy(reference, "acc") > 0.5


def test_lm_eval_chat_generation_equals_transformers(smollm2_url, hf, tmp_path):
    args = f"model={SMOLLM2},base_url={smollm2_url}/v1/chat/completions,num_concurrent=4"
    served = lm_eval(tmp_path, "local-chat-completions", args, "tritonllm_facts_gen", "--apply_chat_template")
    reference = hf["gen"]
    assert {i: d["resps"] for i, d in served.items()} == {i: d["resps"] for i, d in reference.items()}
    assert accuracy(served, "contains_answer") == accuracy(reference, "contains_answer") > 0.3


def test_aiperf_with_its_defaults_against_streaming_chat(shim_url, tiny_model_dir, tmp_path):
    """aiperf's default payload (max_completion_tokens, stream_options, its synthetic prompts); only the request
    count is bounded."""
    args = ["profile", "--model", MODEL, "--url", shim_url, "--endpoint-type", "chat", "--streaming"]
    # seeded: aiperf counts an answer without text as an error, and the random demo model gave one to a prompt once
    args += ["--tokenizer", str(tiny_model_dir), "--request-count", "8", "--concurrency", "4", "--random-seed", "7"]
    run_tool("aiperf", [*args, "--artifact-dir", str(tmp_path)], cwd=tmp_path, timeout=300, offline=False)
    report = json.loads((tmp_path / "profile_export_aiperf.json").read_text())
    assert report["request_count"]["avg"] == 8 and report["error_summary"] == []
    assert report["output_token_throughput"]["avg"] > 0 and report["time_to_first_token"]["count"] == 8


def test_genai_perf_tensorrtllm_format_against_the_ensemble(triton, tiny_model_dir, tmp_path):
    """genai-perf's kserve endpoint with the tensorrtllm backend, through the perf_analyzer `tritonllm
    perf-analyzer` provides."""
    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "perf_analyzer").write_text(
        f'#!/bin/sh\nexec "{Path(sys.executable).parent / "tritonllm"}" perf-analyzer "$@"\n'
    )
    (shim / "perf_analyzer").chmod(0o755)
    args = ["profile", "-m", "ensemble", "--endpoint-type", "kserve", "--backend", "tensorrtllm", "--streaming"]
    args += ["--url", triton.grpc_url, "--tokenizer", str(tiny_model_dir), "--concurrency", "2"]
    args += ["--num-prompts", "8", "--request-count", "8", "--synthetic-input-tokens-mean", "32"]
    args += ["--output-tokens-mean", "16", "--output-tokens-mean-deterministic"]
    run_tool(
        "genai-perf", [*args, "--artifact-dir", str(tmp_path / "out")], cwd=tmp_path, timeout=300, path_prefix=shim
    )
    (report,) = (tmp_path / "out").glob("*/profile_export_genai_perf.json")
    metrics = json.loads(report.read_text())
    assert metrics["request_count"]["avg"] == 8 and metrics["output_token_throughput"]["avg"] > 0
