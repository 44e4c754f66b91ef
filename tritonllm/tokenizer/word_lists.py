"""TensorRT-LLM's `[2, N]` word-list tensors (bad_words_list, stop_words_list).

Row 0 holds the words' token ids back to back; row 1 the cumulative end offset of each word, padded with -1.
Words [[1, 2], [3]] become [[1, 2, 3], [2, 3, -1]].
"""

from __future__ import annotations

import numpy as np

from tritonllm.common.errors import RequestError


def encode_word_list(words: list[list[int]]) -> np.ndarray:
    words = [w for w in words if w]
    flat = [t for w in words for t in w]
    width = max(len(flat), 1)
    out = np.full((2, width), -1, dtype=np.int32)
    if flat:
        out[0, : len(flat)] = flat
        out[1, : len(words)] = np.cumsum([len(w) for w in words])
    else:
        out[0, 0] = 0  # an empty list: no offsets
    return out


def decode_word_list(array: np.ndarray, name: str, vocab_size: int) -> list[list[int]]:
    """Parses and checks a word list; errors name the tensor."""
    if array.ndim == 3 and array.shape[0] == 1:
        array = array[0]
    if array.ndim != 2 or array.shape[0] != 2:
        raise RequestError(name, f"{name} must have shape [2, N] (ids row, offsets row), got {list(array.shape)}")
    ids, offsets = array[0].tolist(), array[1].tolist()
    padding = offsets.index(-1) if -1 in offsets else len(offsets)
    ends = offsets[:padding]
    if any(o != -1 for o in offsets[padding:]):
        raise RequestError(name, f"{name}: offsets row must be increasing offsets followed only by -1 padding")
    words, start = [], 0
    for end in ends:
        if not start < end <= len(ids):
            raise RequestError(name, f"{name}: offsets row must increase within 1..{len(ids)}, got {ends}")
        word = ids[start:end]
        bad = [t for t in word if not 0 <= t < vocab_size]
        if bad:
            raise RequestError(name, f"{name}: token ids outside [0, {vocab_size}): {bad[:5]}")
        words.append(word)
        start = end
    return words
