"""The engine's weights live in its own memory, not in the mapped checkpoint file (engine/models/weight_memory.py): each
live weight is resident once, and shared weights stay shared."""

from __future__ import annotations

import torch

from tritonllm.engine.engine import EngineConfig, LLMEngine
from tritonllm.engine.models.weight_memory import copy_out_of_files, file_mappings


def in_a_file(tensor: torch.Tensor, ranges: list[tuple[int, int]]) -> bool:
    address = tensor.untyped_storage().data_ptr()
    return any(start <= address < end for start, end in ranges)


def test_no_engine_weight_points_into_the_checkpoint_file(tiny_model_dir):
    model = LLMEngine(EngineConfig(str(tiny_model_dir), num_kv_blocks=64)).runner.model
    ranges = file_mappings()
    weights = [*model.parameters(), *model.buffers()]
    assert weights and not [t for t in weights if in_a_file(t, ranges)]


def test_the_copy_keeps_values_and_shared_storage(hf_model):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(hf_model.name_or_path)
    embedding = model.get_input_embeddings().weight
    assert in_a_file(embedding, file_mappings())  # loaded from the mapped file, as transformers does
    # a second weight viewing part of the first, as a fused projection's parts view the fused weight
    model.register_parameter("view", torch.nn.Parameter(embedding[2:5], requires_grad=False))
    before = {name: t.clone() for name, t in model.state_dict().items()}

    copied = copy_out_of_files(model)

    ranges = file_mappings()
    assert copied >= embedding.nbytes and not [t for t in model.parameters() if in_a_file(t, ranges)]
    assert model.view.untyped_storage().data_ptr() == embedding.untyped_storage().data_ptr()
    assert model.get_output_embeddings().weight is embedding  # tied as before
    for name, t in model.state_dict().items():
        assert torch.equal(t, before[name]), name
