"""Stateless, streaming-correct detokenization.

Decoding each new token on its own loses leading spaces and breaks characters that span tokens. Instead the
engine sends, with the new tokens, a few tokens that precede them; the text of the new tokens is
`decode(preceding + new) - decode(preceding)`. Both decodes start at the same token, so whatever that
boundary does to the text (a stripped leading space, a cut character) cancels out. A character still
incomplete at the end is held back until a later token completes it, or given as is on the final piece, so
the joined pieces equal the text of the whole generation byte for byte.

Only the last replacement character can be a character still arriving: decoding replaces each maximal invalid
byte run with one U+FFFD, and an incomplete tail is one such run. Those before it are bytes that no later byte
can mend, and go out at once; a model that writes invalid bytes for a long while still streams.
"""

from __future__ import annotations

from collections.abc import Sequence

INCOMPLETE = "\ufffd"

# Enough tokens to span a held-back character (up to 4 byte tokens) plus any boundary effect.
CONTEXT_TOKENS = 8


def text_increment(
    tokenizer, preceding_ids: Sequence[int], new_ids: Sequence[int], final: bool, skip_special_tokens: bool = True
) -> str:
    def decode(ids: Sequence[int]) -> str:
        return tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens, clean_up_tokenization_spaces=False)

    # An earlier piece emitted the preceding text up to, not including, its possibly incomplete tail.
    emitted = _without_tail(decode(preceding_ids))
    full = decode([*preceding_ids, *new_ids])
    if not final:
        full = _without_tail(full)
    if full.startswith(emitted):
        return full[len(emitted) :]
    # A tokenizer whose decode of the longer window rewrites earlier text: fall back to the common prefix.
    common = 0
    for a, b in zip(emitted, full, strict=False):
        if a != b:
            break
        common += 1
    return full[common:]


def _without_tail(text: str) -> str:
    """The text without a last replacement character, which more bytes may still turn into a character."""
    return text[:-1] if text.endswith(INCOMPLETE) else text
