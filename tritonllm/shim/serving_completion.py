"""Completions served: the pieces of each prompt's generations rendered as text_completion chunks or a whole
response (echo, log-probs by text offset, suffix)."""

from __future__ import annotations

from tritonllm.shim.generation import Piece
from tritonllm.shim.openai_protocol import CompletionRequest
from tritonllm.shim.serving_base import OPENAI_FINISH, Choice, Render, usage_of
from tritonllm.shim.settings import ShimSettings
from tritonllm.shim.triton_responses import TokenLogprob


class CompletionRender(Render):
    object_whole, object_chunk, prefix = "text_completion", "text_completion", "cmpl"

    def __init__(self, body: CompletionRequest, settings: ShimSettings) -> None:
        super().__init__(body, settings)
        self.whole_only = bool(body.use_beam_search)
        self.per = body.n or 1
        # max_tokens 0 with echo: the prompt and its log-probabilities alone (how lm-eval scores a continuation);
        # the engine generates one token, which no one sees
        self.prompt_only = body.max_tokens == 0
        self.offsets: dict[int, int] = {}  # per choice: where its next logprobs token starts in its text
        self.echoed: set[int] = set()

    def echo_of(self, index: int, prompt_text: str | None) -> str:
        """The prompt of choice `index` as text; one given as token ids comes back as text from the engine."""
        prompt = self.body.prompt[index // self.per]
        return prompt if isinstance(prompt, str) else prompt_text or ""

    def generated(self, text: str, tokens: list[TokenLogprob]) -> tuple[str, list[TokenLogprob]]:
        return ("", []) if self.prompt_only else (text, tokens)

    def events(self, index: int, piece: Piece, choice: Choice) -> list[dict]:
        text, tokens = self.generated(piece.text, piece.delta.logprobs)
        first = index not in self.echoed
        self.echoed.add(index)
        if self.body.echo and first:
            text, tokens = self.echo_of(index, piece.delta.prompt_text) + text, piece.delta.prompt_logprobs + tokens
        if piece.finish_reason and self.body.suffix:
            text += self.body.suffix
        if self.full_text:
            text = (self.echo_of(index, choice.prompt_text) if self.body.echo else "") + self.generated(
                choice.text, []
            )[0]
        token_ids = [] if self.prompt_only or not self.body.return_token_ids else piece.delta.token_ids
        if not text and not piece.finish_reason and not token_ids and not (first and self.body.return_token_ids):
            return []
        out = {
            "index": index,
            "text": text,
            "logprobs": self.logprobs(index, tokens),
            "finish_reason": self.finish_reason(piece.finish_reason) if piece.finish_reason else None,
            "stop_reason": piece.stop,
        }
        if self.body.return_token_ids:
            out |= {"prompt_token_ids": choice.prompt_ids if first else None, "token_ids": token_ids}
        extra = {"usage": self.usage([choice])} if piece.finish_reason and self.usage_on_finish() else {}
        return [self.envelope(self.object_chunk, [out], **extra)]

    def vllm_extras(self, choice: Choice) -> dict:
        """A whole choice's prompt_logprobs and token ids, where the request asked for them; null where it did not,
        as vLLM sends them (the SDK then reads them as None)."""
        extras: dict = {"prompt_logprobs": None, "prompt_token_ids": None, "token_ids": None}
        if self.body.prompt_logprobs is not None:
            extras["prompt_logprobs"] = self.body.prompt_logprobs_of(choice.prompt_logprobs)
        if self.body.return_token_ids:
            extras |= {"prompt_token_ids": choice.prompt_ids, "token_ids": [] if self.prompt_only else choice.token_ids}
        return extras

    def finish_reason(self, reason: str) -> str:
        return "length" if self.prompt_only else OPENAI_FINISH[reason]

    def usage(self, choices: list[Choice]) -> dict:
        longest = max(choices, key=lambda c: len(c.batch_sizes))
        counts = usage_of(choices, len(self.body.prompt))
        if self.prompt_only:
            counts = {**counts, "completion_tokens": 0, "total_tokens": counts["prompt_tokens"]}
        return {
            **counts,
            "batch_size": longest.batch_sizes,
            "queue_wait_time": longest.queue_waits,
        }

    def logprobs(self, index: int, tokens) -> dict | None:
        if self.body.logprobs is None:
            return None
        offset = self.offsets.get(index, 0)  # with echo, the tokens start with the prompt's
        offsets = []
        for t in tokens:
            offsets.append(offset)
            offset += len(t.token)
        self.offsets[index] = offset
        tokens = self.body.named(tokens)
        return {
            "text_offset": offsets,
            "token_logprobs": [t.logprob for t in tokens],
            "tokens": [t.token for t in tokens],
            # the prompt's first token has no log-probability, nor alternatives
            "top_logprobs": [None if t.logprob is None else self.top_of(t) for t in tokens],
        }

    def top_of(self, token: TokenLogprob) -> dict[str, float]:
        """The `logprobs` likeliest tokens and the sampled one, which OpenAI always adds (up to logprobs + 1)."""
        return {**dict(token.top[: self.body.logprobs]), token.token: token.logprob}

    def whole(self, choices: list[Choice]) -> dict:
        n, per_prompt = self.body.n or 1, len(choices) // len(self.body.prompt)
        chosen = []
        for p in range(len(self.body.prompt)):
            group = choices[p * per_prompt : (p + 1) * per_prompt]
            if per_prompt > n:  # best_of: the n with the highest cumulative log-probability
                group = sorted(group, key=lambda c: -c.cum_logprob)[:n]
            chosen += group
        out = []
        for index, choice in enumerate(chosen):
            text, tokens = self.generated(choice.text, choice.logprobs)
            if self.body.echo:
                text, tokens = self.echo_of(index, choice.prompt_text) + text, choice.prompt_logprobs + tokens
            out.append(
                {
                    "index": index,
                    "text": text + (self.body.suffix or ""),
                    "logprobs": self.logprobs(index, tokens),
                    "finish_reason": self.finish_reason(choice.finish_reason),
                    "stop_reason": choice.stop,
                    **self.vllm_extras(choice),
                }
            )
        return self.envelope(self.object_whole, out, usage=self.usage(chosen), **self.timings(chosen[0]))
