"""/openapi.json describes the bodies the shim's routes really take, so /docs and client generators can use it."""

from __future__ import annotations

import json

import jsonschema

from tritonllm.shim.app import create_app
from tritonllm.shim.openai_protocol import ChatRequest
from tritonllm.shim.settings import ShimSettings


def test_every_post_route_documents_its_body_and_every_reference_resolves():
    schema = create_app(ShimSettings()).openapi()
    posts = {path: ops["post"] for path, ops in schema["paths"].items() if "post" in ops}
    assert set(posts) >= {"/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v2/models/{model}/generate"}
    assert "requestBody" not in posts.pop("/v1/batches/{batch_id}/cancel")  # the one POST that takes no body
    for path, op in posts.items():
        content = op["requestBody"]["content"]  # JSON, or the file upload's multipart form
        assert (content.get("application/json") or content["multipart/form-data"])["schema"]["$ref"], path
    components = schema["components"]["schemas"]
    for ref in {r.split("/")[-1] for r in _refs(schema)}:
        assert ref in components, ref


def test_the_documented_chat_body_accepts_what_the_shim_accepts():
    schema = create_app(ShimSettings()).openapi()
    body = {"model": "m", "messages": [{"role": "developer", "content": "x"}], "max_completion_tokens": 3}
    ChatRequest.model_validate(body)
    resolver = {"$ref": "#/components/schemas/ChatRequest", "components": schema["components"]}
    jsonschema.validate(body, resolver)


def _refs(node) -> list[str]:
    text = json.dumps(node)
    return [part.split('"')[0] for part in text.split('"$ref": "')[1:]]
