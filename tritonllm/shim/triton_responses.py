"""A generation's Triton responses, decoded: each one's new text, token log-probs and counters."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from tritonllm.shim.direct_route import Tensor


@dataclass
class TokenLogprob:
    token: str
    logprob: float | None  # None: the prompt's first token, which nothing predicts
    top: list[tuple[str, float]]  # the best alternatives, best first
    token_id: int | None = None  # where known: the token's id, and its alternatives'
    top_ids: list[int] = field(default_factory=list)
    rank: int | None = None  # a prompt token's: its place among the vocabulary by log-probability (1: the likeliest)

    def as_token_ids(self) -> TokenLogprob:
        """vLLM's return_tokens_as_token_ids: each token named `token_id:<id>`, as text may not tell them apart."""
        named = [(f"token_id:{i}", lp) for i, (_, lp) in zip(self.top_ids, self.top, strict=True)]
        return dataclasses.replace(self, token=f"token_id:{self.token_id}", top=named)


@dataclass
class ResponseDelta:
    """One ensemble response: the new text of one sample (or every beam's whole text), and its counters."""

    texts: list[str]  # one per beam; a sample's is texts[0]
    finish_reason: str  # "" until the sample's last delta
    index: int  # which sample
    num_input_tokens: int
    num_output_tokens: int
    batch_size: int
    queue_wait_us: int
    num_tokens: int  # tokens in this delta
    stop_token: int  # the stop_token_ids entry that ended it, else -1
    accepted_prediction_tokens: int  # with a prediction: its tokens kept as drafts so far, and the rest of them
    rejected_prediction_tokens: int
    logprobs: list[TokenLogprob]
    arrived: float  # time.monotonic()
    token_texts: list[str] = field(default_factory=list)  # each new token's own text (decoded alone)
    token_ids: list[int] = field(default_factory=list)  # the new tokens (the first beam's)
    prompt_ids: list[int] | None = None  # asked for by return_prompt_ids, in a sample's first delta
    # asked for by return_prompt_log_probs, in a sample's first delta: the prompt as text, and its tokens' log-probs
    prompt_text: str | None = None
    prompt_logprobs: list[TokenLogprob] = field(default_factory=list)  # the first one's logprob is None

    @property
    def text(self) -> str:
        return self.texts[0]

    @classmethod
    def from_outputs(cls, output: Callable[[str], np.ndarray | None]) -> ResponseDelta:
        """From the ensemble's outputs, each read by name with `output` (None for one the response left out:
        postprocess.CONDITIONAL)."""

        def scalar(name: str, missing=None):
            value = output(name)
            return missing if value is None else value.reshape(-1)[0]

        def strings(name: str) -> list[str]:
            return [b.decode("utf-8", "replace") for b in output(name).reshape(-1)]

        tokens = strings("token_texts")
        ids = output("output_ids").reshape(-1).tolist()
        return cls(
            texts=[b.decode("utf-8") for b in output("text_output").reshape(-1)],
            finish_reason=scalar("finish_reason").decode(),
            index=int(scalar("sequence_index")),
            num_input_tokens=int(scalar("num_input_tokens")),
            num_output_tokens=int(scalar("num_output_tokens")),
            batch_size=int(scalar("batch_size")),
            queue_wait_us=int(scalar("queue_wait_us")),
            num_tokens=len(ids),
            stop_token=int(scalar("stop_token", -1)),
            accepted_prediction_tokens=int(scalar("accepted_prediction_tokens", 0)),
            rejected_prediction_tokens=int(scalar("rejected_prediction_tokens", 0)),
            logprobs=_token_log_probs(output, tokens, ids),
            arrived=time.monotonic(),
            token_texts=tokens,
            token_ids=ids,
            prompt_ids=None if (prompt := output("prompt_ids")) is None else prompt.reshape(-1).tolist(),
            **_prompt_log_probs(scalar("prompt_log_probs_json", b"")),
        )


def _token_log_probs(output: Callable[[str], np.ndarray | None], tokens: list[str], ids: list[int]) -> list:
    """Each token's TokenLogprob, where the response carries log-probs."""
    sent = output("output_log_probs")  # tritonclient's as_numpy decodes the tensor at each call: once here
    if sent is None:
        return []
    log_probs = sent.reshape(-1).tolist()
    top, top_texts, top_ids = output("top_log_probs")[0], output("top_token_texts")[0], output("top_token_ids")[0]
    return [
        TokenLogprob(
            tokens[i],
            log_probs[i],
            [(t.decode("utf-8", "replace"), float(v)) for t, v in zip(top_texts[i], top[i], strict=True)]
            if i < len(top)
            else [],
            ids[i],
            top_ids[i].tolist() if i < len(top_ids) else [],
        )
        for i in range(len(log_probs))
    ]


def _prompt_log_probs(raw: bytes) -> dict:
    """ResponseDelta's prompt fields from postprocessing's JSON (b"" where a response has none: all but the first)."""
    if not raw:
        return {}
    parsed = json.loads(raw)
    tokens = [
        TokenLogprob(
            t["token"],
            t["logprob"],
            [(text, lp) for text, lp, _ in t["top"]],
            t["id"],
            [i for *_, i in t["top"]],
            t.get("rank"),
        )
        for t in parsed["tokens"]
    ]
    return {"prompt_text": parsed["text"], "prompt_logprobs": tokens}


def ensemble_delta(result) -> ResponseDelta:
    return ResponseDelta.from_outputs(result.as_numpy)


def all_outputs(result) -> dict[str, np.ndarray]:
    return {output.name: result.as_numpy(output.name) for output in result.get_response().outputs}


def output_tensor(result, name: str) -> Tensor:
    return name, result.get_output(name).datatype, result.as_numpy(name)


def string_output(result, name: str) -> str:
    return result.as_numpy(name).reshape(-1)[0].decode("utf-8")
