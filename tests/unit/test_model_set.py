"""Several LLMs in one model repository (launcher/model_set.py): their names, and the staged repository in which
each has its own four models, configured with its own folder (served: tests/e2e/test_several_models.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import REPOSITORY
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from tritonllm.backend.model_parameters import ModelParameters
from tritonllm.launcher.model_set import llm_set, models_in
from tritonllm.launcher.tritonserver import stage_repository
from tritonllm.shim.direct_route import DirectRoute
from tritonllm.wire.triton_names import TritonNames


def config_of(folder: Path) -> model_config_pb2.ModelConfig:
    return text_format.Parse((folder / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())


def test_the_first_llm_keeps_the_repositorys_names_and_the_others_are_named_after_themselves(tmp_path):
    (tmp_path / "q.gguf").write_bytes(b"GGUF\x03\x00\x00\x00")
    llms = llm_set([Path("/m/SmolLM2"), Path("/m/tiny"), tmp_path / "q.gguf"], first_name="default")
    assert [(llm.name, llm.triton.ensemble, llm.triton.llm) for llm in llms] == [
        ("default", "ensemble", "llm"),
        ("tiny", "tiny", "tiny-llm"),
        ("q", "q", "q-llm"),
    ]


@pytest.mark.parametrize(
    ("paths", "refusal"),
    [
        (["/a/tiny", "/b/tiny"], "two models are served as 'tiny'"),
        (["/a/tiny", "/b/llm"], "model 'llm'.*a Triton model name"),
        (["/a/tiny", "/b/embedding"], "model 'embedding'"),
        (["/a/tiny", "/b/with space"], "model 'with space'"),
        (["/a/tiny", "/b/x", "/c/x-llm"], "model 'x-llm'"),
    ],
)
def test_names_that_cannot_be_served_side_by_side_are_refused(paths, refusal):
    with pytest.raises(ValueError, match=refusal):
        llm_set([Path(p) for p in paths])


def test_a_models_folder_serves_each_model_folder_and_gguf_file(tmp_path):
    for name in ("b", "a"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text("{}")
    (tmp_path / "notes").mkdir()
    (tmp_path / "c.gguf").write_bytes(b"GGUF\x03\x00\x00\x00")
    assert [p.name for p in models_in(tmp_path)] == ["a", "b", "c.gguf"]
    with pytest.raises(ValueError, match="holds no HF model"):
        models_in(tmp_path / "notes")


def test_each_llm_of_a_staged_repository_has_its_own_models_folder_and_steps(tmp_path, snapshot):
    first, second = tmp_path / "first", tmp_path / "second"
    names = TritonNames.named("second")
    staged = stage_repository(REPOSITORY, 2, without=("embedding",), llms=[(TritonNames(), first), (names, second)])
    try:
        expected = set(TritonNames().by_folder().values()) | set(names.by_folder().values())
        assert {p.name for p in staged.iterdir()} == expected
        for own, folder in ((TritonNames(), first), (names, second)):
            for repository_folder, name in own.by_folder().items():
                config = config_of(staged / name)
                assert config.name == name
                if repository_folder == "tensorrt_llm":  # the face relays to this LLM's own llm
                    assert config.parameters["llm_model"].string_value == own.llm
                elif repository_folder != "ensemble":
                    args = {"model_config": json.dumps({"parameters": {"model_dir": {"string_value": str(folder)}}})}
                    assert config.parameters["model_dir"].string_value == str(folder)
                    assert ModelParameters(args | {"model_repository": str(staged / name)}).get("model_dir", "") == (
                        str(folder)
                    )
                assert (staged / name / "1").resolve() == REPOSITORY / repository_folder / "1"
            steps = [step.model_name for step in config_of(staged / own.ensemble).ensemble_scheduling.step]
            assert steps == [own.preprocessing, own.llm, own.postprocessing]
            assert config_of(staged / own.llm).instance_group[0].count == 2
        # the shim's direct route reads the second LLM's ensemble under its names, and only under them
        assert DirectRoute.of(config_of(staged / "second"), snapshot, names) is not None
        assert DirectRoute.of(config_of(staged / "second"), snapshot) is None
    finally:
        shutil.rmtree(staged)


@pytest.fixture(scope="module")
def snapshot(tiny_model_dir) -> str:
    from tritonllm.tokenizer.backend_tokenizer import cached_snapshot, load_backend_tokenizer

    load_backend_tokenizer(tiny_model_dir)
    return cached_snapshot(tiny_model_dir)


def test_the_shim_names_the_models_as_serve_does(tmp_path, tiny_model_dir):
    from tritonllm.launcher import cli, models_given, shim_command
    from tritonllm.wire.triton_names import REPOSITORY_NAMES

    (tmp_path / "tiny2").symlink_to(tiny_model_dir)
    given = ["--model-dir", str(tiny_model_dir), "--models-folder", str(tmp_path), "--models-max", "1"]
    served = shim_command.shim_models(cli.build_parser().parse_args(["shim", *given]))
    llms = models_given.llms_of(cli.build_parser().parse_args(["serve", *given]))
    assert [(m.name, m.triton) for m in served] == [(llm.name, llm.triton) for llm in llms]
    assert [(m.name, m.triton) for m in served] == [("tiny", REPOSITORY_NAMES), ("tiny2", TritonNames.named("tiny2"))]
    assert {(m.tool_call_parser, m.reasoning_parser) for m in served} == {("hermes", "none")}  # from the folders
    alone = shim_command.shim_models(cli.build_parser().parse_args(["shim", "--tool-call-parser", "mistral"]))
    assert [(m.name, m.tool_call_parser) for m in alone] == [("SmolLM2-135M-Instruct", "mistral")]
