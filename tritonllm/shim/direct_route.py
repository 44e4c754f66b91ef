"""The shim's short way through the model repository: the ensemble's steps run by the shim itself.

Through the `ensemble`, every streamed token crosses tritonserver twice more and the `postprocessing` stub once:
about a millisecond of CPU a token on the same cores the engine's step runs on (bench/serving_cost.py). The shim
therefore asks `preprocessing` once per request, streams from `llm` directly, and turns each llm response into
the ensemble's outputs with the function `postprocessing` runs (tritonllm.tokenizer.postprocess), on the
tokenizer `preprocessing` hands it. The routing between the steps is read from the ensemble's own config, so
the answer is the ensemble's, byte for byte. Where the ensemble is not the three known steps, or the tokenizer
is transformers' own (no snapshot to hand over), the shim goes through the ensemble as any Triton client.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from tritonllm.tokenizer.backend_tokenizer import BackendTokenizer
from tritonllm.tokenizer.postprocess import postprocess
from tritonllm.wire.triton_names import REPOSITORY_NAMES, TritonNames

Tensor = tuple[str, str, np.ndarray]  # name, Triton datatype, value


@dataclass(frozen=True)
class DirectRoute:
    preprocessing_inputs: dict[str, str]  # preprocessing's input -> the ensemble tensor it reads
    preprocessing_outputs: dict[str, str]  # preprocessing's output -> the ensemble tensor it writes
    llm_inputs: dict[str, str]  # llm's input -> the ensemble tensor it reads
    tokenizer: BackendTokenizer

    @classmethod
    def of(cls, ensemble_config, tokenizer_snapshot: str, names: TritonNames = REPOSITORY_NAMES) -> DirectRoute | None:
        """The route for an ensemble config (Triton's ModelConfig message), or None where the shim must go
        through the ensemble: other steps than the LLM's preprocessing -> llm -> postprocessing (`names`),
        postprocessing not reading the llm's outputs under their own names or not writing the ensemble's under
        theirs, or no snapshot."""
        steps = list(ensemble_config.ensemble_scheduling.step)
        # the middle step is tensorrt_llm, TensorRT-LLM's face over llm, in a unary deployment
        # (launcher/decoupled_mode.py): the shim streams from llm itself either way
        routes = [[names.preprocessing, middle, names.postprocessing] for middle in (names.llm, names.tensorrt_llm)]
        if [s.model_name for s in steps] not in routes or not tokenizer_snapshot:
            return None
        pre, llm, post = steps
        llm_output_of = {tensor: name for name, tensor in llm.output_map.items()}
        if any(llm_output_of.get(tensor) != name for name, tensor in post.input_map.items()):
            return None
        if any(name != tensor for name, tensor in post.output_map.items()):
            return None
        return cls(
            preprocessing_inputs=dict(pre.input_map),
            preprocessing_outputs=dict(pre.output_map),
            llm_inputs=dict(llm.input_map),
            tokenizer=BackendTokenizer(json.loads(tokenizer_snapshot)),
        )

    def preprocessing_request(self, tensors: list[Tensor]) -> list[Tensor]:
        """The ensemble's inputs that preprocessing reads, under preprocessing's names."""
        return _mapped(self.preprocessing_inputs, {name: (dt, value) for name, dt, value in tensors})

    def llm_request(self, tensors: list[Tensor], preprocessed: list[Tensor]) -> list[Tensor]:
        """The llm's inputs: the ensemble's own and preprocessing's outputs, under the llm's names."""
        available = {name: (dt, value) for name, dt, value in tensors}
        available.update((self.preprocessing_outputs[name], (dt, value)) for name, dt, value in preprocessed)
        return _mapped(self.llm_inputs, available)

    def outputs(self, llm_response: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One llm response -> the ensemble's outputs, as postprocessing makes them."""
        return postprocess(self.tokenizer, llm_response)


def _mapped(mapping: dict[str, str], available: dict[str, tuple[str, np.ndarray]]) -> list[Tensor]:
    return [(name, *available[tensor]) for name, tensor in mapping.items() if tensor in available]
