"""Llama-family models built without transformers' model code (engine/models/llama_model.py): the llm process never
imports it, answers as transformers' generate() does, and a model this code would build wrongly is loaded through
transformers instead (the other families, rope types and paths: test_architectures.py)."""

from __future__ import annotations

import json
import subprocess
import sys

import torch
from conftest import PROJECT_ROOT

from tritonllm.engine.models import llama_model
from tritonllm.engine.state.sampling_params import SamplingParams
from tritonllm.engine.state.sequence import Sequence

from .test_engine import make_engine, random_prompts, reference, run

LOAD_AND_ANSWER = """
import json, sys
from tritonllm.engine.config import EngineConfig
from tritonllm.engine.engine import LLMEngine
from tritonllm.engine.state.sampling_params import SamplingParams
from tritonllm.engine.state.sequence import Sequence

engine = LLMEngine(EngineConfig(sys.argv[1], num_kv_blocks=64, block_size=8))
seq = Sequence(json.loads(sys.argv[2]), SamplingParams(max_tokens=12))
engine.add(seq)
while engine.has_work():
    engine.step()
imported = sorted(m for m in sys.modules if m.startswith("transformers"))
print(json.dumps({"output": seq.output_ids, "transformers": engine.runner.transformers, "imported": imported}))
"""


def test_the_llm_process_answers_without_importing_transformers(tiny_model_dir, hf_model):
    prompt = random_prompts(1, seed=3)[0]
    done = subprocess.run(
        [sys.executable, "-c", LOAD_AND_ANSWER, str(tiny_model_dir), json.dumps(prompt)],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    assert answer["transformers"] is False
    assert answer["imported"] == []  # not even the package: its model code alone is 130 MB an llm process
    assert answer["output"] == reference(hf_model, prompt, 12)


IMPORT_THE_LLM_MODEL = """
import sys, types

class Backend(types.ModuleType):  # the Python backend's module, which only Triton's stub provides
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return 0

sys.modules["triton_python_backend_utils"] = Backend("triton_python_backend_utils")
sys.path.insert(0, sys.argv[1])
import model
print(sorted(m for m in sys.modules if m.startswith("transformers")))
"""


def test_the_llm_models_own_imports_leave_out_transformers():
    done = subprocess.run(
        [sys.executable, "-c", IMPORT_THE_LLM_MODEL, str(PROJECT_ROOT / "model_repository" / "llm" / "1")],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_a_model_this_code_builds_wrongly_loads_through_transformers(tiny_model_dir, hf_model, monkeypatch):
    """The load check holds the model built here to transformers' logits: a final norm off by a little is found,
    and the engine loads the model through transformers, answering exactly."""
    forward = llama_model.RMSNorm.forward
    monkeypatch.setattr(llama_model.RMSNorm, "forward", lambda self, hidden: forward(self, hidden) * 1.01)
    engine = make_engine(tiny_model_dir)
    assert engine.runner.transformers is True
    prompts = random_prompts(3, seed=4)
    seqs = [Sequence(p, SamplingParams(max_tokens=10)) for p in prompts]
    run(engine, seqs)
    assert [s.output_ids for s in seqs] == [reference(hf_model, p, 10) for p in prompts]


def test_the_model_built_here_holds_transformers_weights(tiny_model_dir, hf_model):
    engine = make_engine(tiny_model_dir)
    assert engine.runner.transformers is False
    ours = engine.runner.model
    assert torch.equal(ours.model.norm.weight, hf_model.model.norm.weight)
    assert torch.equal(ours.model.rotary_emb.inv_freq, hf_model.model.rotary_emb.inv_freq)
