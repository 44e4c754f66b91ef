"""The names of the Triton models that serve one LLM: the repository's own for the first, `<name>-<step>` for
every other (launcher/model_set.py stages them); the shim addresses each by these."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TritonNames:
    """The Triton models that serve one LLM."""

    ensemble: str = "ensemble"
    preprocessing: str = "preprocessing"
    llm: str = "llm"
    postprocessing: str = "postprocessing"
    tensorrt_llm: str = "tensorrt_llm"  # TensorRT-LLM's ids-level face over llm (backend/tensorrt_llm_face.py)

    @classmethod
    def named(cls, ensemble: str) -> TritonNames:
        return cls(
            ensemble,
            f"{ensemble}-preprocessing",
            f"{ensemble}-llm",
            f"{ensemble}-postprocessing",
            f"{ensemble}-tensorrt_llm",
        )

    def by_folder(self) -> dict[str, str]:
        """The repository's folder of each model -> its name for this LLM."""
        return {
            "ensemble": self.ensemble,
            "preprocessing": self.preprocessing,
            "llm": self.llm,
            "postprocessing": self.postprocessing,
            "tensorrt_llm": self.tensorrt_llm,
        }


REPOSITORY_NAMES = TritonNames()  # the first LLM's
