"""Expected outputs computed by transformers itself, independent of the engine under test."""

from __future__ import annotations

import copy

import numpy as np
import torch

from tritonllm.engine.layers.lora import MODULES
from tritonllm.tokenizer.detokenizer import CONTEXT_TOKENS, text_increment


def greedy_ids(hf_model, prompt_ids: list[int], max_new_tokens: int, eos: int | None = None) -> list[int]:
    out = hf_model.generate(
        torch.tensor([prompt_ids]), max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=eos, pad_token_id=0
    )
    return out[0, len(prompt_ids) :].tolist()


def greedy_text(hf_model, tokenizer, prompt_ids: list[int], max_new_tokens: int) -> tuple[str, list[int]]:
    """What the ensemble should answer: generate() until the tokenizer's eos, decoded after the prompt."""
    ids = greedy_ids(hf_model, prompt_ids, max_new_tokens, eos=tokenizer.eos_token_id)
    return text_increment(tokenizer, prompt_ids[-CONTEXT_TOKENS:], ids, final=True), ids


def beam_search(
    hf_model,
    prompt: list[int],
    width: int,
    max_new_tokens: int,
    end_id: int,
    length_penalty: float,
    early_stopping=True,
    bias: float = 0.0,
) -> tuple[list[list[int]], list[float]]:
    """generate(num_beams=width)'s beams (each cut after its end token) and their scores, best first.

    `bias` is added to the end token's log-prob, so that beams end at different lengths."""
    out = hf_model.generate(
        torch.tensor([prompt], device=hf_model.device),
        max_new_tokens=max_new_tokens,
        num_beams=width,
        num_return_sequences=width,
        length_penalty=length_penalty,
        early_stopping=early_stopping,
        do_sample=False,
        eos_token_id=end_id,
        pad_token_id=end_id,
        sequence_bias={(end_id,): bias} if bias else None,
        output_scores=True,
        return_dict_in_generate=True,
    )
    beams = [row[len(prompt) :].tolist() for row in out.sequences]
    return [b[: b.index(end_id) + 1] if end_id in b else b for b in beams], out.sequences_scores.tolist()


def random_adapter(model, seed: int, rank: int = 4) -> tuple[np.ndarray, np.ndarray, dict]:
    """TensorRT-LLM-format lora_weights / lora_config for q, v and down projections of every layer."""
    g = torch.Generator().manual_seed(seed)
    rows, config, deltas = [], [], {}
    for layer in range(len(model.model.layers)):
        for module_id in (1, 3, 6):
            linear = model.model.layers[layer].get_submodule(MODULES[module_id])
            a = torch.randn(rank, linear.in_features, generator=g) * 0.3
            b = torch.randn(linear.out_features, rank, generator=g) * 0.3
            rows.append(torch.cat([a.flatten(), b.flatten()]))
            config.append([module_id, layer, rank])
            deltas[(layer, MODULES[module_id])] = b @ a
    width = max(len(r) for r in rows)
    weights = torch.stack([torch.nn.functional.pad(r, (0, width - len(r))) for r in rows])
    return weights.numpy(), np.array(config, dtype=np.int32), deltas


def merged(model, deltas: dict):
    copy_ = copy.deepcopy(model)
    for (layer, name), delta in deltas.items():
        copy_.model.layers[layer].get_submodule(name).weight.data += delta
    return copy_


def prompt_tuned_greedy(hf_model, table: torch.Tensor, prompt: list[int], max_new_tokens: int) -> list[int]:
    """generate() on the embeddings p-tuning means: the table's rows for the leading virtual ids, then the rest."""
    virtual = len(table)
    with torch.no_grad():
        real = hf_model.get_input_embeddings()(torch.tensor(prompt[virtual:]))
        return hf_model.generate(
            inputs_embeds=torch.cat([table.float(), real])[None],
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )[0].tolist()


PROJECTIONS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def peft_adapter(base_dir, folder, seed: int, **settings):
    """A PEFT LoRA adapter folder for the model in `base_dir`, with random A and B (a fresh adapter's B is zero:
    it would change nothing); `settings` change LoraConfig's."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(base_dir)
    config = LoraConfig(init_lora_weights=False, **{"r": 4, "lora_alpha": 8, "target_modules": PROJECTIONS} | settings)
    get_peft_model(model, config).save_pretrained(folder)
    return folder


def peft_model(base_dir, folder):
    """PEFT's own model of the base with the adapter in `folder`: the oracle of LoRA served by name."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    return PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_dir), folder).eval()
