"""The model's dimensions that the KV cache and the engine are sized by."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tritonllm.common.unsupported_model import UnsupportedModelError
from tritonllm.engine.models import llama_model
from tritonllm.formats import multimodal_folder


@dataclass(frozen=True)
class ModelShape:
    num_layers: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    max_position_embeddings: int

    @classmethod
    def of_dir(cls, model_dir: str | Path) -> ModelShape:
        """From config.json; through transformers' config classes for the architectures not built here (theirs
        may nest or derive the fields)."""
        config = llama_model.ModelConfig.read(Path(model_dir))
        if config.architecture not in llama_model.ARCHITECTURES:
            from transformers import AutoConfig

            found = multimodal_folder.towers(multimodal_folder.read_config(model_dir))
            if found:
                raise UnsupportedModelError(
                    f"{config.model_type} is a multimodal model ({', '.join(found)}): the engine serves its language "
                    "model, split out by tritonllm.formats.multimodal_folder.language_model_dir"
                )
            config = AutoConfig.from_pretrained(model_dir)
        return cls.of(config)

    @classmethod
    def of(cls, config) -> ModelShape:
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        return cls(
            num_layers=config.num_hidden_layers,
            num_kv_heads=getattr(config, "num_key_value_heads", None) or config.num_attention_heads,
            head_dim=head_dim,
            vocab_size=config.vocab_size,
            max_position_embeddings=getattr(config, "max_position_embeddings", 1 << 31),
        )
