"""Postprocessing's decoder (tritonllm/tokenizer/decoder.py): after a first load through transformers, a start reads
the cached backend without importing transformers, and decodes every id sequence as transformers does."""

from __future__ import annotations

import random
import shutil
import subprocess
import sys

import pytest
from conftest import MODELS

from tritonllm.runtime.model_config import load_tokenizer
from tritonllm.tokenizer.decoder import BackendDecoder, load_decoder
from tritonllm.tokenizer.model_cache import CACHE_ENV, cache_key


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.mark.parametrize("model", ["tiny", "SmolLM2-135M-Instruct"])
def test_the_cached_backend_decodes_as_transformers(cache, tiny_model_dir, model):
    reference = load_tokenizer(MODELS / model)
    first = load_decoder(MODELS / model)
    assert not isinstance(first, BackendDecoder)  # a first start: transformers', and the cache written
    cached = load_decoder(MODELS / model)
    assert isinstance(cached, BackendDecoder)
    assert len(cached) == len(reference)
    rng = random.Random(3)
    specials = reference.all_special_ids
    for _ in range(300):
        ids = [rng.choice(specials) if rng.random() < 0.1 else rng.randrange(len(reference)) for _ in range(12)]
        for skip in (True, False):
            expected = reference.decode(ids, skip_special_tokens=skip, clean_up_tokenization_spaces=False)
            assert cached.decode(ids, skip_special_tokens=skip, clean_up_tokenization_spaces=False) == expected


def test_a_start_with_the_cache_does_not_import_transformers(cache, tiny_model_dir):
    load_decoder(tiny_model_dir)
    script = (
        "import sys; from tritonllm.tokenizer.decoder import load_decoder; "
        f"d = load_decoder({str(tiny_model_dir)!r}); d.decode([5, 6, 7]); "
        "print(type(d).__name__, 'transformers' in sys.modules, 'torch' in sys.modules)"
    )
    env = {CACHE_ENV: str(cache), "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.split() == ["BackendDecoder", "False", "False"]


def test_a_changed_tokenizer_file_is_not_served_from_the_cache(cache, tiny_model_dir, tmp_path):
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    load_decoder(model)
    before = cache_key(model)
    (model / "tokenizer.json").write_text((model / "tokenizer.json").read_text() + "\n")
    assert cache_key(model) != before
    assert not isinstance(load_decoder(model), BackendDecoder)
