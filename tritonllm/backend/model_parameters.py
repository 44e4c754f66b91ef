"""Reads the `parameters` of a Triton model's config.pbtxt, and finds the HF model directory to serve."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tritonllm.common.errors import RequestError
from tritonllm.formats import gguf

MODEL_DIR_ENV = "TRITONLLM_MODEL_DIR"
TOOL_CALL_PARSER_ENV = "TRITONLLM_TOOL_CALL_PARSER"  # overrides preprocessing's tool_call_parser parameter
# overrides the exclude_input_in_output parameter of preprocessing (the ensemble's default) and tensorrt_llm
EXCLUDE_INPUT_ENV = "TRITONLLM_EXCLUDE_INPUT_IN_OUTPUT"


class ModelParameters:
    def __init__(self, args: dict) -> None:
        self.config = json.loads(args["model_config"])
        # The folder that holds the repository, found through this model's version folder with its links followed:
        # `serve --llm-instances` runs a staged repository made of links to the real one.
        version = (Path(args["model_repository"]) / str(args.get("model_version", 1))).resolve()
        self.repository_parent = version.parents[2]
        given = {k: v.get("string_value", "") for k, v in self.config.get("parameters", {}).items()}
        # set ones only: a `${...}` placeholder, as tensorrtllm_backend's templates leave them, is unset
        self._values = {k: v for k, v in given.items() if v and not v.startswith("${")}

    @property
    def instance_count(self) -> int:
        """The model's instances in this server (instance_group), each a process with its own engine."""
        return sum(int(group.get("count", 1)) for group in self.config.get("instance_group", [])) or 1

    def values(self) -> dict[str, str]:
        """The parameters that are set."""
        return dict(self._values)

    def get(self, name: str, default: str) -> str:
        return self._values.get(name, default)

    def int(self, name: str, default: int) -> int:
        return int(self.get(name, str(default)))

    def bool(self, name: str, default: bool) -> bool:
        return self.get(name, str(default)).strip().lower() in ("1", "true", "yes", "on")

    def exclude_input_in_output(self) -> bool:
        """TensorRT-LLM's model parameter: the value of a request that sends no exclude_input_in_output tensor
        (false there when unset: a non-streaming answer starts with the prompt). `serve` sets it for both
        models that take it through the environment."""
        given = os.environ.get(EXCLUDE_INPUT_ENV) or self.get("exclude_input_in_output", "false")
        return given.strip().lower() in ("1", "true", "yes", "on")

    def model_dir(self) -> Path:
        """The `TRITONLLM_MODEL_DIR` environment variable, else the `model_dir` parameter: an HF directory, or a
        GGUF file: its config and tokenizer folder (formats/gguf.hf_model_dir), or with quantized_weights false its
        dequantized folder.

        A relative `model_dir` is taken from the folder that holds the model repository, so the repository
        works wherever the project is checked out or mounted.
        """
        path = self.path(os.environ.get(MODEL_DIR_ENV) or self.get("model_dir", "models/SmolLM2-135M-Instruct"))
        # quantized_weights false: the user asks for float32 weights, through the file dequantized into a folder
        dequantize = not self.bool("quantized_weights", True)
        path = gguf.hf_model_dir(path, dequantize=dequantize)
        if not (path / "config.json").exists():
            raise FileNotFoundError(
                f"no HF model or .gguf file at {path} (set {MODEL_DIR_ENV} or the model_dir parameter; "
                "`make model` builds the default and the demo models)"
            )
        return path

    def path(self, value: str) -> Path:
        """A path from the parameters; a relative one is taken from the folder that holds the model repository."""
        path = Path(value)
        return path if path.is_absolute() else self.repository_parent / path


def strings(array, field: str | None = None) -> list[str]:
    """A BYTES tensor's values as text; bytes that are not UTF-8 are refused, naming `field`."""
    try:
        return [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in array.reshape(-1)]
    except UnicodeDecodeError as e:
        raise RequestError(field, f"{field or 'an input'} is not UTF-8 text: {e}") from e


def json_list(raw: str, field: str) -> list:
    return _json_of(raw, field, list, "a JSON array")


def json_object(raw: str, field: str) -> dict:
    return _json_of(raw, field, dict, "a JSON object")


def _json_of(raw: str, field: str, kind: type, name: str):
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as e:
        raise RequestError(field, f"{field} is not valid JSON: {e}") from e
    if not isinstance(value, kind):
        raise RequestError(field, f"{field} must be {name}")
    return value
