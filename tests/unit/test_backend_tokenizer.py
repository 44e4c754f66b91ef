"""The preprocessing and postprocessing models' tokenizer (tritonllm/tokenizer/backend_tokenizer.py): after a first
load through transformers, a start reads a snapshot without importing torch or transformers' tokenizer and model
code, and encodes, renders chats, decodes and names tokens as transformers does."""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys

import pytest
from conftest import MODELS

from tritonllm.formats.hf_folder import load_tokenizer
from tritonllm.formats.model_cache import CACHE_ENV, cache_key
from tritonllm.tokenizer.backend_tokenizer import BackendTokenizer, load_backend_tokenizer, snapshot
from tritonllm.tokenizer.info import tokenizer_info

TEXTS = [
    "Hello world",
    "",
    " ",
    "  two leading spaces, trailing ones  ",
    "tabs\tand\nnew\n\nlines\r\n",
    "éèà ñ 中文字 日本語 한국어 🙂👍🏽",
    "<|im_start|>user\nan added token inside text<|im_end|>",
    "<s>bos</s> <pad> <unk>",
    "code: def f(x):\n    return x ** 2  # comment",
    "numbers 1234567890 3.14159 -42",
]
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
CONVERSATIONS = [
    [{"role": "user", "content": "Hi"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "éè 中文 🙂"}],
    [
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "<|im_end|> and again"},
    ],
    [{"role": "user", "content": "Weather?"}, {"role": "assistant", "content": None, "tool_calls": None}],
]

# A template of the request's own reading a variable the request sets, and the model's under other variables.
OWN_TEMPLATE = "{% for m in messages %}[{{ m.role }}|{{ m.content }}]{% endfor %}{{ greeting | default('none') }}"
TEMPLATE_REQUESTS = [
    {"add_generation_prompt": True, "enable_thinking": False, "eos_token": "<END>"},
    {"chat_template": OWN_TEMPLATE, "greeting": "hello"},
    {"chat_template": "default"},  # a name of one of the model's templates
    {"continue_final_message": True},
    {"continue_final_message": True, "add_generation_prompt": True},  # an error in both
]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


def variant(tmp_path, base, name: str, **config) -> object:
    """A copy of the model's tokenizer with its tokenizer_config.json changed."""
    model = tmp_path / name
    shutil.copytree(base, model, ignore=shutil.ignore_patterns("*.safetensors"))
    settings = json.loads((model / "tokenizer_config.json").read_text())
    (model / "tokenizer_config.json").write_text(json.dumps({**settings, **config}))
    return model


def model_dirs(tmp_path, tiny) -> list:
    template = (tiny / "chat_template.jinja").read_text()
    return [
        tiny,
        MODELS / "SmolLM2-135M-Instruct",
        variant(tmp_path, tiny, "bos_added", add_bos_token=True, add_eos_token=True),
        variant(tmp_path, tiny, "split_special", split_special_tokens=True),
        # several templates by name, as some models ship them: tool_use is picked when tools are given
        variant(tmp_path, tiny, "named_templates", chat_template={"default": template, "tool_use": "T{{ tools }}"}),
    ]


def outcome(call, *args, **kwargs) -> object:
    """What the call returns, or the kind of error it raises (a template may reject a conversation)."""
    try:
        return call(*args, **kwargs)
    except Exception as e:
        return type(e)


def test_the_snapshot_serves_every_request_as_transformers(cache, tmp_path, tiny_model_dir):
    for model in model_dirs(tmp_path, tiny_model_dir):
        reference = load_tokenizer(model)
        first = load_backend_tokenizer(model)
        assert not isinstance(first, BackendTokenizer), model  # a first start: transformers', the snapshot written
        cached = load_backend_tokenizer(model)
        assert isinstance(cached, BackendTokenizer), model
        assert len(cached) == len(reference)
        assert tokenizer_info(cached, 100) == tokenizer_info(reference, 100)
        for name in ("eos_token_id", "pad_token_id", "bos_token_id", "unk_token_id"):
            assert getattr(cached, name) == getattr(reference, name), (model, name)
        for text in TEXTS:
            for special in (True, False):
                expected = reference.encode(text, add_special_tokens=special)
                assert cached.encode(text, add_special_tokens=special) == expected, (model, text, special)
            ids = reference.encode(text)
            assert cached.convert_ids_to_tokens(ids) == reference.convert_ids_to_tokens(ids)
        for conversation in CONVERSATIONS:
            for tools in (None, [TOOL]):
                for prompt in (True, False):
                    kwargs = {"tools": tools, "add_generation_prompt": prompt}
                    expected = outcome(reference.apply_chat_template, conversation, tokenize=False, **kwargs)
                    assert outcome(cached.apply_chat_template, conversation, tokenize=False, **kwargs) == expected
                    ids = outcome(reference.apply_chat_template, conversation, return_dict=False, **kwargs)
                    got = outcome(cached.apply_chat_template, conversation, return_dict=False, **kwargs)
                    assert got == ids, (model, conversation, tools, prompt)
            # what a request may add: variables for the template, its own template, the last message continued
            for kwargs in TEMPLATE_REQUESTS:
                expected = outcome(reference.apply_chat_template, conversation, tokenize=False, **kwargs)
                assert outcome(cached.apply_chat_template, conversation, tokenize=False, **kwargs) == expected, (
                    model,
                    conversation,
                    kwargs,
                )


@pytest.mark.parametrize("model", ["tiny", "SmolLM2-135M-Instruct"])
def test_the_snapshot_decodes_as_transformers(cache, tiny_model_dir, model):
    reference = load_tokenizer(MODELS / model)
    load_backend_tokenizer(MODELS / model)
    cached = load_backend_tokenizer(MODELS / model)
    assert isinstance(cached, BackendTokenizer)
    rng = random.Random(3)
    specials = reference.all_special_ids
    for _ in range(300):
        ids = [rng.choice(specials) if rng.random() < 0.1 else rng.randrange(len(reference)) for _ in range(12)]
        for skip in (True, False):
            expected = reference.decode(ids, skip_special_tokens=skip, clean_up_tokenization_spaces=False)
            assert cached.decode(ids, skip_special_tokens=skip, clean_up_tokenization_spaces=False) == expected


def test_a_start_with_the_snapshot_imports_neither_torch_nor_transformers_tokenizers(cache, tiny_model_dir):
    load_backend_tokenizer(tiny_model_dir)
    script = (
        "import sys; from tritonllm.tokenizer.backend_tokenizer import load_backend_tokenizer; "
        f"t = load_backend_tokenizer({str(tiny_model_dir)!r}); t.decode([5, 6, 7]); t.encode('hi'); "
        "t.apply_chat_template([{'role': 'user', 'content': 'hi'}], add_generation_prompt=True); "
        "heavy = ('torch', 'transformers.tokenization_utils_base', 'transformers.modeling_utils'); "
        "print(type(t).__name__, *(name in sys.modules for name in heavy))"
    )
    env = {CACHE_ENV: str(cache), "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.split() == ["BackendTokenizer", "False", "False", "False"]


def test_a_start_with_the_snapshot_keeps_only_the_tokenizer_resident(cache):
    """Parsing SmolLM2's tokenizer from its JSON frees about 25 MB that glibc would keep (resident growth 47 MB
    where the tokenizer holds about 24): handed back, each of preprocessing, postprocessing and the shim is smaller."""
    model = MODELS / "SmolLM2-135M-Instruct"
    load_backend_tokenizer(model)
    script = (
        "import psutil, tokenizers; from tritonllm.tokenizer.backend_tokenizer import load_backend_tokenizer; "
        "rss = psutil.Process().memory_info().rss; "
        f"t = load_backend_tokenizer({str(model)!r}); "
        "print(type(t).__name__, (psutil.Process().memory_info().rss - rss) // 2**20)"
    )
    env = {CACHE_ENV: str(cache), "PATH": "/usr/bin:/bin"}
    name, grown_mb = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True
    ).stdout.split()
    assert name == "BackendTokenizer" and int(grown_mb) < 36


def test_a_tokenizer_class_that_overrides_encoding_gets_no_snapshot(tiny_model_dir):
    tokenizer = load_tokenizer(tiny_model_dir)
    assert snapshot(tokenizer) is not None

    class Custom(type(tokenizer)):
        def _encode_plus(self, *args, **kwargs):
            return super()._encode_plus(*args, **kwargs)

    tokenizer.__class__ = Custom
    assert snapshot(tokenizer) is None


def test_a_snapshot_that_encodes_differently_is_not_written(cache, tmp_path, tiny_model_dir, monkeypatch):
    monkeypatch.setattr(BackendTokenizer, "encode", lambda self, text, add_special_tokens=True: [0])
    load_backend_tokenizer(tiny_model_dir)
    assert not isinstance(load_backend_tokenizer(tiny_model_dir), BackendTokenizer)


def test_a_changed_tokenizer_file_is_not_served_from_the_snapshot(cache, tiny_model_dir, tmp_path):
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    load_backend_tokenizer(model)
    before = cache_key(model)
    (model / "tokenizer.json").write_text((model / "tokenizer.json").read_text() + "\n")
    assert cache_key(model) != before
    assert not isinstance(load_backend_tokenizer(model), BackendTokenizer)
