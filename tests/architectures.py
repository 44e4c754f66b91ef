"""Tiny random models of the architecture families users serve, built locally (no hub), for the engine's oracles.

Each shares the demo tokenizer's vocabulary. Models with sliding-window attention get a short window (WINDOW),
so prompts of a few dozen tokens already cross it; Gemma 3 interleaves windowed and global layers.
"""

from __future__ import annotations

from pathlib import Path

WINDOW = 16

# A wide init spreads the logits of random weights, so greedy argmax stays far from ties (see demo_model.py).
TINY_SIZES = dict(  # the sizes of every tiny model, multimodal_models.py's language models too
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    initializer_range=0.25,
)

# family -> (config class name in transformers, settings beyond TINY_SIZES)
ARCHITECTURES: dict[str, tuple[str, dict]] = {
    "llama": ("LlamaConfig", {}),
    "llama_biased": ("LlamaConfig", {"attention_bias": True}),  # biases on q/k/v and o
    # Llama 3.1's rope: frequencies scaled by band, as transformers' rope function computes them
    "llama3_rope": (
        "LlamaConfig",
        {
            "rope_parameters": {
                "rope_type": "llama3",
                "rope_theta": 10000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 32,
            }
        },
    ),
    # tables recomputed past max_position_embeddings: built by transformers, not llama_model.py
    "llama_dynamic_rope": (
        "LlamaConfig",
        {"rope_parameters": {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}},
    ),
    "mistral": ("MistralConfig", {"sliding_window": WINDOW}),
    "qwen2": ("Qwen2Config", {"use_sliding_window": True, "sliding_window": WINDOW, "max_window_layers": 1}),
    "qwen2_full": ("Qwen2Config", {}),  # every layer global; biases on q/k/v only
    "qwen3": ("Qwen3Config", {"head_dim": 32}),
    "qwen3_moe": (
        "Qwen3MoeConfig",
        {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 64, "decoder_sparse_step": 1},
    ),
    "mixtral": ("MixtralConfig", {"num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": WINDOW}),
    "gemma": ("GemmaConfig", {"head_dim": 16}),
    "gemma2": (
        "Gemma2Config",
        {"head_dim": 16, "sliding_window": WINDOW, "attn_logit_softcapping": 5.0, "query_pre_attn_scalar": 24},
    ),
    "gemma3_text": (
        "Gemma3TextConfig",
        {"head_dim": 16, "sliding_window": WINDOW, "sliding_window_pattern": 2, "query_pre_attn_scalar": 24},
    ),
    "phi3": ("Phi3Config", {"sliding_window": WINDOW}),
    "olmo2": ("Olmo2Config", {}),
    "granite": ("GraniteConfig", {"attention_multiplier": 0.2, "embedding_multiplier": 2.0, "logits_scaling": 2.0}),
    "gpt_neox": ("GPTNeoXConfig", {"rotary_pct": 0.5}),
    "gpt2": ("GPT2Config", {}),
    "opt": ("OPTConfig", {}),
    "gptj": ("GPTJConfig", {"rotary_dim": 8}),  # rotary on part of each head, interleaved pairs
}

# Architectures whose configs name their sizes differently.
_RENAMED = {
    "gpt2": {
        "hidden_size": "n_embd",
        "num_hidden_layers": "n_layer",
        "num_attention_heads": "n_head",
        "intermediate_size": "n_inner",
        "max_position_embeddings": "n_positions",
    },
    "opt": {"intermediate_size": "ffn_dim"},
}
_RENAMED["gptj"] = _RENAMED["gpt2"]
_NO_GQA = {"gpt_neox", "gpt2", "opt", "gptj"}


def build_architecture(family: str, tokenizer, out_dir: Path) -> Path:
    """Writes a tiny random `family` model with the given tokenizer into out_dir/family."""
    import torch
    import transformers

    class_name, extra = ARCHITECTURES[family]
    settings = dict(TINY_SIZES)
    if family in _NO_GQA:
        del settings["num_key_value_heads"]
    for ours, theirs in _RENAMED.get(family, {}).items():
        settings[theirs] = settings.pop(ours)
    settings.update(extra)
    config = getattr(transformers, class_name)(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
        **settings,
    )
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    target = out_dir / family
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    return target
