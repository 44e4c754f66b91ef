"""LoRA per request in a shared batch, against the adapter merged into the weights."""

from __future__ import annotations

import numpy as np
import pytest
from oracles import merged, random_adapter

from tritonllm.engine.layers.lora import AdapterCache, resolve
from tritonllm.engine.state.sampling_params import SamplingParams
from tritonllm.engine.state.sequence import Sequence

from .test_engine import make_engine, random_prompts, run
from .test_logits_processors import generate_ids


def test_requests_with_different_adapters_and_none_share_a_batch(tiny_model_dir, hf_model):
    engine = make_engine(tiny_model_dir, lora_cache_size=8)
    cache = AdapterCache(capacity=2)
    model = engine.runner.model
    prompts = random_prompts(3, seed=41, max_len=20)
    (w1, c1, d1), (w2, c2, d2) = random_adapter(hf_model, 1), random_adapter(hf_model, 2)
    first = resolve(cache, 101, w1, c1, model)
    second = resolve(cache, 102, w2, c2, model)
    seqs = [
        Sequence(prompts[0], SamplingParams(max_tokens=12), adapter=first),
        Sequence(prompts[1], SamplingParams(max_tokens=12), adapter=second),
        Sequence(prompts[2], SamplingParams(max_tokens=12)),
        Sequence(prompts[0], SamplingParams(max_tokens=12)),  # same prompt as the first, base weights
    ]
    run(engine, seqs)
    assert seqs[0].output_ids == generate_ids(merged(hf_model, d1), prompts[0], max_new_tokens=12, eos_token_id=None)
    assert seqs[1].output_ids == generate_ids(merged(hf_model, d2), prompts[1], max_new_tokens=12, eos_token_id=None)
    assert seqs[2].output_ids == generate_ids(hf_model, prompts[2], max_new_tokens=12, eos_token_id=None)
    assert seqs[3].output_ids == generate_ids(hf_model, prompts[0], max_new_tokens=12, eos_token_id=None)
    assert seqs[0].output_ids != seqs[3].output_ids


def test_the_cache_serves_task_ids_alone_and_evicts_the_oldest(tiny_model_dir, hf_model):
    engine = make_engine(tiny_model_dir, lora_cache_size=8)
    model, cache = engine.runner.model, AdapterCache(capacity=2)
    for task in (1, 2, 3):
        w, c, _ = random_adapter(hf_model, task)
        resolve(cache, task, w, c, model)
    assert resolve(cache, 3, None, None, model).task_id == 3
    with pytest.raises(ValueError, match="lora_task_id 1 is not cached"):
        resolve(cache, 1, None, None, model)


@pytest.mark.parametrize(
    ("config", "needle"),
    [([[0, 0, 4]], "module id 0"), ([[1, 9, 4]], "layer 9"), ([[1, 0, 999]], "adapter size 999")],
)
def test_bad_adapters_are_refused_naming_lora_config(tiny_model_dir, config, needle):
    engine = make_engine(tiny_model_dir, lora_cache_size=8)
    weights = np.zeros((1, 2048), dtype=np.float32)
    with pytest.raises(ValueError, match=needle):
        resolve(AdapterCache(2), 7, weights, np.array(config, dtype=np.int32), engine.runner.model)
