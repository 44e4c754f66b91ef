"""A bug inside a model is the server's fault, not the client's. On the real tritonserver, with a ValueError planted
in the llm's own request parsing (as a bug deep in the engine would raise one): a Triton client gets an internal
error naming its request, an OpenAI client a 500 naming it, neither the exception's words nor a 400; the traceback
goes to the server's log, and the llm keeps serving."""

from __future__ import annotations

import httpx
import tritonclient.grpc as grpcclient
from conftest import REPOSITORY, launch_triton
from triton_helpers import tensor

from tritonllm.shim.settings import ShimSettings

from .conftest import running_shim

PLANTED_SEED = 4242
# the real llm model, its request parsing made to fail on one seed the way a bug would
BUGGY_LLM = f'''
import importlib.util

from tritonllm.engine.state import inference_request

parse = inference_request.parse


def buggy_parse(get, *args, **kwargs):
    for name in ("seed", "random_seed"):
        seed = get(name)
        if seed is not None and int(seed.reshape(-1)[0]) == {PLANTED_SEED}:
            int("planted bug")  # ValueError: invalid literal for int() with base 10: 'planted bug'
    return parse(get, *args, **kwargs)


inference_request.parse = buggy_parse
spec = importlib.util.spec_from_file_location("real_llm", "{REPOSITORY / "llm" / "1" / "model.py"}")
real = importlib.util.module_from_spec(spec)
spec.loader.exec_module(real)
TritonPythonModel = real.TritonPythonModel
'''


def test_a_bug_inside_the_llm_is_an_internal_error_naming_the_request(tiny_model_dir, tmp_path):
    repository = tmp_path / "repository"
    repository.mkdir()
    for model in REPOSITORY.iterdir():
        if model.name != "llm":
            (repository / model.name).symlink_to(model)
    (repository / "llm" / "1").mkdir(parents=True)
    (repository / "llm" / "config.pbtxt").symlink_to(REPOSITORY / "llm" / "config.pbtxt")
    (repository / "llm" / "1" / "model.py").write_text(BUGGY_LLM)
    server = launch_triton(tiny_model_dir, tmp_path, repository=repository)
    try:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        answers = []
        client.start_stream(callback=lambda result, error: answers.append(error))
        inputs = [
            tensor("input_ids", [[5, 6, 7]], "INT32"),
            tensor("input_lengths", [[3]], "INT32"),
            tensor("request_output_len", [[3]], "INT32"),
            tensor("random_seed", [[PLANTED_SEED]], "UINT64"),
        ]
        client.async_stream_infer("llm", inputs, request_id="bug-1")
        client.stop_stream()
        assert len(answers) == 1 and answers[0] is not None
        message = answers[0].message()
        assert "[internal:] internal error serving request bug-1" in message and "planted" not in message

        settings = ShimSettings(triton_grpc_url=server.grpc_url, served_model_name="tiny", default_max_tokens=3)
        with running_shim(settings) as shim:
            body = {"model": "tiny", "prompt": "Hi", "max_tokens": 3, "seed": PLANTED_SEED}
            answer = httpx.post(f"{shim}/v1/completions", json=body, timeout=60)
            assert answer.status_code == 500, answer.text
            error = answer.json()["error"]
            assert error["type"] == "server_error" and error["param"] is None
            assert "internal server error (request " in error["message"] and "planted" not in error["message"]
            again = httpx.post(f"{shim}/v1/completions", json={**body, "seed": 1}, timeout=60)
            assert again.status_code == 200 and again.json()["usage"]["completion_tokens"] == 3
    finally:
        server.stop()
    log = (tmp_path / "tritonserver.log").read_text()
    assert "internal error serving request bug-1" in log and "Traceback" in log
    assert "invalid literal for int() with base 10: 'planted bug'" in log
