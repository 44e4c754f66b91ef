"""Models by their hub id, resolved offline through huggingface_hub's own functions from a cache laid out as it
lays one out: a folder model, a GGUF repository with llama.cpp's `:QUANT`, a revision, and the missing model."""

from __future__ import annotations

import argparse
import json

import pytest
from conftest import MODELS
from huggingface_hub import scan_cache_dir

from tests.hub_cache import cache_repo, folder_files
from tritonllm.formats import hub_model
from tritonllm.launcher import hub_ids, model_set
from tritonllm.launcher.hub_ids import resolve_hub_ids

GGUF_FILES = ("SmolLM2-135M-Instruct-Q4_1.gguf", "SmolLM2-135M-Instruct-Q8_0.gguf", "SmolLM2-135M-Instruct-Q4_K_S.gguf")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return tmp_path


@pytest.fixture
def gguf_repo(cache, smollm2_gguf) -> str:
    files = {name: smollm2_gguf for name in GGUF_FILES} | {"README.md": b"# GGUF\n", "mmproj-Q4_1.gguf": b"GGUF"}
    cache_repo(cache, "bartowski/SmolLM2-135M-Instruct-GGUF", files)
    return "bartowski/SmolLM2-135M-Instruct-GGUF"


def test_a_folder_model_resolves_to_its_cached_snapshot(cache):
    commit = cache_repo(cache, "HuggingFaceTB/tiny-chat", folder_files(MODELS / "tiny"))
    assert not scan_cache_dir(cache).warnings  # huggingface_hub reads the layout as its own
    folder = hub_model.resolve("HuggingFaceTB/tiny-chat")
    assert folder == cache / "models--HuggingFaceTB--tiny-chat" / "snapshots" / commit
    assert model_set.is_model(folder) and (folder / "model.safetensors").read_bytes()[:8]
    assert hub_model.repo_of(folder) == "HuggingFaceTB/tiny-chat"
    assert model_set.served_name_of(folder) == "tiny-chat"  # not the commit


def test_a_revision_picks_its_own_snapshot(cache):
    cache_repo(cache, "org/tiny", folder_files(MODELS / "tiny"))
    older = cache_repo(cache, "org/tiny", {**folder_files(MODELS / "tiny"), "README.md": b"v1"}, revision="v1")
    assert hub_model.resolve("org/tiny", revision="v1").name == older
    assert hub_model.resolve("org/tiny").name != older
    with pytest.raises(hub_model.HubModelError, match="org/tiny at revision v2 is not in the Hugging Face cache"):
        hub_model.resolve("org/tiny", revision="v2")


@pytest.mark.parametrize(("tag", "file"), [("Q4_1", GGUF_FILES[0]), ("q8_0", GGUF_FILES[1]), ("Q4_K_S", GGUF_FILES[2])])
def test_a_gguf_repository_gives_the_file_its_tag_names(gguf_repo, tag, file):
    path = hub_model.resolve(f"{gguf_repo}:{tag}")
    assert path.name == file and path.is_file() and model_set.is_model(path)
    assert model_set.served_name_of(path) == path.stem


@pytest.mark.parametrize(
    ("name", "message"),
    [
        (":Q5_K_M", "no GGUF file match 'Q5_K_M'; the repository's GGUF files: SmolLM2-135M-Instruct-Q4_1.gguf, "),
        (":Q4", "no GGUF file match 'Q4'"),  # a tag is a whole part of the name: Q4 is not Q4_1
        (":Instruct", "3 GGUF files (SmolLM2-135M-Instruct-Q4_1.gguf, SmolLM2-135M-Instruct-Q4_K_S.gguf, "),
        ("", "several GGUF files, name one as bartowski/SmolLM2-135M-Instruct-GGUF:QUANT (files: "),
    ],
)
def test_a_tag_that_matches_none_or_several_lists_the_files(gguf_repo, name, message):
    with pytest.raises(hub_model.HubModelError) as error:
        hub_model.resolve(gguf_repo + name)
    assert message in str(error.value)
    assert "mmproj" not in str(error.value)  # a projector is no model


def test_a_gguf_repository_of_one_file_needs_no_tag(cache, smollm2_gguf):
    cache_repo(cache, "org/one-gguf", {"model-Q4_1.gguf": smollm2_gguf})
    assert hub_model.resolve("org/one-gguf").name == "model-Q4_1.gguf"


def test_a_model_not_in_the_cache_while_offline_is_one_line_naming_the_cache_and_the_variable(cache):
    with pytest.raises(hub_model.HubModelError) as error:
        hub_model.resolve("Qwen/Qwen2.5-0.5B-Instruct")
    message = str(error.value)
    assert "\n" not in message
    assert f"Qwen/Qwen2.5-0.5B-Instruct is not in the Hugging Face cache {cache} " in message
    assert "HF_HUB_OFFLINE is set" in message and "HF_HUB_CACHE" in message


def test_hf_home_names_the_cache_without_hf_hub_cache(tmp_path, monkeypatch):
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    assert hub_model.cache_dir() == tmp_path / "hub"


def test_a_path_on_this_machine_is_no_hub_id(tmp_path, monkeypatch):
    monkeypatch.chdir(MODELS.parent)
    assert not hub_model.is_hub_id(f"{MODELS.name}/tiny")  # a relative folder that exists
    assert not hub_model.is_hub_id(f"{MODELS.name}/not-built-yet")  # in a folder that exists
    assert hub_model.is_hub_id("org/name") and hub_model.is_hub_id("org/name-GGUF:Q4_K_M")
    assert not hub_model.is_hub_id("/abs/path") and not hub_model.is_hub_id("a/b/c")


def test_a_demo_model_not_built_yet_stays_a_path_for_serve_to_build(tmp_path, monkeypatch):
    """`serve --model-dir models/tiny` in a fresh checkout, before models/ exists: serve builds the demo model."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(hub_ids, "DEFAULT_MODELS", tmp_path / "models")
    args = argparse.Namespace(model_dir=["models/tiny"], served_model_name=None)
    resolve_hub_ids(args)
    assert args.model_dir == ["models/tiny"] and args.served_model_name is None


def test_the_launcher_rewrites_every_flag_that_names_a_model(cache, gguf_repo):
    commit = cache_repo(cache, "org/tiny", folder_files(MODELS / "tiny"))
    snapshot = str(cache / "models--org--tiny" / "snapshots" / commit)
    args = argparse.Namespace(
        model_dir=["org/tiny", f"{gguf_repo}:Q8_0"],
        served_model_name=None,
        revision=None,
        engine_speculative_model="org/tiny",
        embedding_model_dir=None,
        rerank_model_dir="org/tiny",
        rerank_model_name=None,
        lora_modules=["a=org/tiny", json.dumps({"name": "b", "path": "org/tiny"}), f"c={MODELS / 'tiny'}"],
    )
    resolve_hub_ids(args)
    assert args.served_model_name == "org/tiny" and args.rerank_model_name == "org/tiny"  # answered by their ids
    assert args.model_dir[0] == snapshot and args.model_dir[1].endswith("/SmolLM2-135M-Instruct-Q8_0.gguf")
    assert args.engine_speculative_model == snapshot and args.rerank_model_dir == snapshot
    assert args.lora_modules[0] == f"a={snapshot}" and json.loads(args.lora_modules[1])["path"] == snapshot
    assert args.lora_modules[2] == f"c={MODELS / 'tiny'}"  # a local path stays as given
