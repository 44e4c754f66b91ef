"""With an API key, `serve` leaves no door open beside it: Triton's HTTP and gRPC APIs other than health ask for
the key too (header `triton-api-key`), the shim sends it, probes still get through; and beside the shim,
Triton's ports listen on loopback unless --triton-host says otherwise."""

from __future__ import annotations

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tritonllm.launcher import cli, serve_command
from tritonllm.wire.api_key import API_KEY_HEADER, GRPC_API_KEY_HEADER

from .conftest import running_serve

KEY = "s3cret-key"


def preprocessing_inputs() -> list:
    text = grpcclient.InferInput("text_input", [1, 1], "BYTES")
    text.set_data_from_numpy(np.array([[b"Hello"]], dtype=np.object_))
    return [text]


def test_the_api_key_guards_every_port(tiny_model_dir, tmp_path):
    with running_serve(tiny_model_dir, tmp_path, "--api-key", KEY) as ports:
        triton = f"http://127.0.0.1:{ports['--http-port']}"
        shim = f"http://127.0.0.1:{ports['--shim-port']}"
        body = {"text_input": "Hello", "max_tokens": 2}
        assert httpx.post(f"{triton}/v2/models/ensemble/generate", json=body).status_code in (401, 403)
        assert httpx.get(f"{triton}/v2/models/llm/config").status_code in (401, 403)
        assert httpx.post(f"{triton}/v2/repository/index", json={}).status_code in (401, 403)
        assert httpx.get(f"{triton}/v2/health/ready").status_code == 200  # probes need no key
        allowed = httpx.post(f"{triton}/v2/models/ensemble/generate", json=body, headers={API_KEY_HEADER: KEY})
        assert allowed.status_code == 200, allowed.text

        grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{ports['--grpc-port']}")
        with pytest.raises(InferenceServerException, match=GRPC_API_KEY_HEADER):
            grpc.infer("preprocessing", preprocessing_inputs())
        result = grpc.infer("preprocessing", preprocessing_inputs(), headers={GRPC_API_KEY_HEADER: KEY})
        assert result.as_numpy("input_ids").size > 0

        completion = {"model": "tiny", "prompt": "Hi", "max_tokens": 3}
        assert httpx.post(f"{shim}/v1/completions", json=completion).status_code == 401
        served = httpx.post(f"{shim}/v1/completions", json=completion, headers={"Authorization": f"Bearer {KEY}"})
        assert served.status_code == 200 and served.json()["usage"]["completion_tokens"] == 3
        message = {"model": "tiny", "max_tokens": 3, "messages": [{"role": "user", "content": "Hi"}]}
        refused = httpx.post(f"{shim}/v1/messages", json=message, headers={"x-api-key": "wrong"})
        assert refused.status_code == 401 and refused.json()["error"]["type"] == "authentication_error"
        answered = httpx.post(f"{shim}/v1/messages", json=message, headers={"x-api-key": KEY})  # Anthropic's header
        assert answered.status_code == 200 and answered.json()["usage"]["output_tokens"] == 3
        icon = httpx.get(f"{shim}/favicon.ico")  # the page's icon, like the page, without the key
        assert icon.status_code == 200 and icon.headers["content-type"].startswith("image/"), icon.text


@pytest.mark.parametrize(
    ("flags", "triton_host"),
    [
        ([], "127.0.0.1"),
        (["--host", "0.0.0.0"], "127.0.0.1"),  # the shim exposed, Triton's ports not
        (["--host", "0.0.0.0", "--triton-host", "0.0.0.0"], "0.0.0.0"),
        (["--host", "0.0.0.0", "--no-shim"], "0.0.0.0"),  # Triton alone is what --host serves
    ],
)
def test_tritons_ports_stay_on_loopback_unless_asked(flags, triton_host):
    args = cli.build_parser().parse_args(["serve", *flags])
    assert serve_command.triton_host_of(args) == triton_host
