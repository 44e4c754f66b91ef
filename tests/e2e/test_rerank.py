"""/v1/rerank and /v1/score through `serve --rerank-model-dir` on the real tritonserver: scores equal to
sentence-transformers' CrossEncoder.predict on the same folder (a small random cross-encoder: no real one can be
had offline), vLLM's, Jina's and Cohere's shapes, and errors that name the field."""

from __future__ import annotations

import httpx
import pytest
from conftest import MODELS
from sentence_transformers import CrossEncoder

from .conftest import running_serve

QUERY = "what is the capital of France?"
DOCUMENTS = ["Bananas are yellow.", "Paris is the capital of France.", "France borders Spain.", "x"]


@pytest.fixture(scope="module")
def url(cross_encoder_dir, tmp_path_factory):
    flags = ("--rerank-model-dir", str(cross_encoder_dir), "--rerank-model-name", "ranker", "--no-embedding")
    with running_serve(MODELS / "tiny", tmp_path_factory.mktemp("rerank"), *flags) as ports:
        yield f"http://127.0.0.1:{ports['--shim-port']}"


def post(url: str, route: str, **body) -> httpx.Response:
    return httpx.post(f"{url}{route}", json=body, timeout=60)


def test_rerank_orders_the_documents_by_cross_encoder_score(url, cross_encoder_dir):
    expected = CrossEncoder(str(cross_encoder_dir), device="cpu").predict([(QUERY, d) for d in DOCUMENTS])
    order = sorted(range(len(DOCUMENTS)), key=lambda i: -expected[i])
    documents = [DOCUMENTS[0], {"text": DOCUMENTS[1]}, *DOCUMENTS[2:]]  # Jina's and Cohere's objects too
    answer = post(url, "/v1/rerank", model="ranker", query=QUERY, documents=documents).json()
    assert [r["index"] for r in answer["results"]] == order
    assert [r["relevance_score"] for r in answer["results"]] == pytest.approx([expected[i] for i in order], abs=1e-6)
    assert [r["document"]["text"] for r in answer["results"]] == [DOCUMENTS[i] for i in order]
    assert answer["model"] == "ranker" and answer["usage"]["total_tokens"] > 4 * 3
    top = post(url, "/rerank", model="ranker", query=QUERY, documents=DOCUMENTS, top_n=2, return_documents=False)
    assert [(r["index"], "document" in r) for r in top.json()["results"]] == [(i, False) for i in order[:2]]
    assert "ranker" in [m["id"] for m in httpx.get(f"{url}/v1/models").json()["data"]]


def test_score_pairs_one_to_many_and_pairwise(url, cross_encoder_dir):
    model = CrossEncoder(str(cross_encoder_dir), device="cpu")
    many = post(url, "/v1/score", model="ranker", text_1=QUERY, text_2=DOCUMENTS).json()
    assert [d["index"] for d in many["data"]] == list(range(len(DOCUMENTS)))
    assert [d["score"] for d in many["data"]] == pytest.approx(model.predict([(QUERY, d) for d in DOCUMENTS]), abs=1e-6)
    firsts = ["a", "b", "c", "d"]
    pairwise = post(url, "/score", model="ranker", text_1=firsts, text_2=DOCUMENTS).json()
    expected = model.predict(list(zip(firsts, DOCUMENTS, strict=True)))
    assert [d["score"] for d in pairwise["data"]] == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize(
    ("route", "body", "status", "param"),
    [
        ("/v1/rerank", {"model": "nope", "query": "q", "documents": ["d"]}, 404, "model"),
        ("/v1/rerank", {"model": "tiny", "query": "q", "documents": ["d"]}, 400, "model"),
        ("/v1/rerank", {"model": "ranker", "query": "q", "documents": ["d", "word " * 300]}, 400, "documents[1]"),
        ("/v1/rerank", {"model": "ranker", "query": "q", "documents": []}, 400, "documents"),
        ("/v1/score", {"model": "ranker", "text_1": ["a", "b"], "text_2": ["c", "d", "e"]}, 400, "text_2"),
    ],
)
def test_bad_requests_name_the_field(url, route, body, status, param):
    answer = post(url, route, **body)
    assert answer.status_code == status, answer.text
    assert answer.json()["error"]["param"] == param
