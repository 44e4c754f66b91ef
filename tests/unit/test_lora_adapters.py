"""PEFT adapter folders served by the engine (tritonllm/formats/lora_adapters.py): two adapters and the base model
in one batch, each greedy answer equal to PEFT's own PeftModel.generate() on the same weights; what the engine
would not compute as PEFT does refused at load, naming it."""

from __future__ import annotations

import json

import pytest
from oracles import peft_adapter, peft_model

from tritonllm.engine.layers.lora import AdapterCache, resolve
from tritonllm.engine.state.sampling_params import SamplingParams
from tritonllm.engine.state.sequence import Sequence
from tritonllm.formats.lora_adapters import load_peft

from .test_engine import make_engine, random_prompts, reference, run


@pytest.fixture(scope="module")
def adapters(tiny_model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("peft")
    return {
        "plain": peft_adapter(tiny_model_dir, root / "plain", 1),
        # rsLoRA's scale, a rank and an alpha of its own on some modules, only some projections
        "varied": peft_adapter(
            tiny_model_dir,
            root / "varied",
            2,
            r=8,
            lora_alpha=4,
            use_rslora=True,
            rank_pattern={"q_proj": 2},
            alpha_pattern={"layers.1.mlp.down_proj": 16},
            target_modules=["q_proj", "v_proj", "down_proj"],
        ),
    }


def test_adapters_and_the_base_in_one_batch_answer_as_peft(tiny_model_dir, hf_model, adapters):
    engine = make_engine(tiny_model_dir, lora_cache_size=8)
    cache = AdapterCache(capacity=4)
    loaded = {name: load_peft(name, folder) for name, folder in adapters.items()}
    prompts = random_prompts(3, seed=43, max_len=20)
    seqs = {}
    for name, adapter in loaded.items():
        resolved = resolve(cache, adapter.task_id, adapter.weights, adapter.config, engine.runner.model)
        seqs[name] = Sequence(prompts[0], SamplingParams(max_tokens=12), adapter=resolved)
    seqs["base"] = Sequence(prompts[0], SamplingParams(max_tokens=12))
    run(engine, list(seqs.values()))
    for name, folder in adapters.items():
        assert seqs[name].output_ids == reference(peft_model(tiny_model_dir, folder), prompts[0], 12), name
    assert seqs["base"].output_ids == reference(hf_model, prompts[0], 12)
    assert len({tuple(seq.output_ids) for seq in seqs.values()}) == 3  # each adapter changed the answer
    assert loaded["plain"].task_id != loaded["varied"].task_id
    assert load_peft("again", adapters["plain"]).task_id == loaded["plain"].task_id  # the same in every shim


@pytest.mark.parametrize(
    ("setting", "value", "needle"),
    [
        ("use_dora", True, "use_dora"),
        ("bias", "all", "bias 'all'"),
        ("modules_to_save", ["lm_head"], "modules_to_save"),
        ("peft_type", "IA3", "peft_type IA3"),
    ],
)
def test_what_peft_computes_otherwise_is_refused_naming_it(adapters, tmp_path, setting, value, needle):
    folder = tmp_path / "changed"
    folder.mkdir()
    settings = json.loads((adapters["plain"] / "adapter_config.json").read_text())
    (folder / "adapter_config.json").write_text(json.dumps({**settings, setting: value}))
    (folder / "adapter_model.safetensors").symlink_to(adapters["plain"] / "adapter_model.safetensors")
    with pytest.raises(ValueError, match=f"LoRA adapter x: {needle}"):
        load_peft("x", folder)
    with pytest.raises(ValueError, match="holds no adapter_config.json"):
        load_peft("x", tmp_path)
