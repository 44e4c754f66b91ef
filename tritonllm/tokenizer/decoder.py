"""The tokenizer's decode alone, for the postprocessing model, without transformers after the first start.

Loading a tokenizer through transformers imports transformers and torch: 4.5 s of CPU and 340 MB in every
process that does it, and at a server's start four Python models do it at once on the same cores. Where
transformers' decode is exactly its `tokenizers` backend's (a fast tokenizer; clean-up of spaces is never asked
for here), that backend is written to a cache file on the first load, and later starts read only the file with
`tokenizers` (0.15 s, 58 MB): the same object decodes, so the text is the same byte for byte. Other tokenizers
stay transformers' own. The file is kept as model_cache.py keeps it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ..runtime.model_config import load_tokenizer
from . import model_cache


class BackendDecoder:
    """What postprocessing asks of a tokenizer (`decode`, `len`), answered by the `tokenizers` backend."""

    def __init__(self, backend) -> None:
        self.backend = backend

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False, clean_up_tokenization_spaces=False) -> str:
        if clean_up_tokenization_spaces:
            raise ValueError("the backend decodes without transformers' clean-up of spaces")
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def __len__(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)


def load_decoder(model_dir: Path):
    """The model's tokenizer for decoding: from the cache file when there is one, else transformers' (and the
    cache file written for next time, where its decode is its backend's)."""
    cached = model_cache.cached_file(model_dir, "backend.json")
    if cached.is_file():
        from tokenizers import Tokenizer

        return BackendDecoder(Tokenizer.from_file(str(cached)))
    tokenizer = load_tokenizer(model_dir)
    if decodes_by_backend(tokenizer):
        model_cache.write(cached, tokenizer.backend_tokenizer.to_str())
    return tokenizer


def decodes_by_backend(tokenizer) -> bool:
    """Whether transformers' decode of this tokenizer is its backend's decode and nothing more."""
    from transformers.tokenization_utils_base import PreTrainedTokenizerBase
    from transformers.tokenization_utils_tokenizers import TokenizersBackend

    kind = type(tokenizer)
    return kind.decode is PreTrainedTokenizerBase.decode and kind._decode is TokenizersBackend._decode
