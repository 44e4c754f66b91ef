from __future__ import annotations

import pytest

from tritonllm.tokenizer.stop_strings import StopStringMatcher


def feed_all(stops: list[str], pieces: list[str]) -> tuple[str, str | None]:
    matcher = StopStringMatcher(stops)
    out = ""
    for piece in pieces:
        out += matcher.feed(piece)
        if matcher.matched:
            return out, matcher.matched
    return out + matcher.flush(), None


@pytest.mark.parametrize(
    ("stops", "pieces", "expected", "matched"),
    [
        (["END"], ["Hello E", "N", "D and more"], "Hello ", "END"),
        (["END"], ["Hello E", "NX"], "Hello ENX", None),
        (["\n\n"], ["a\n", "\nb"], "a", "\n\n"),
        (["停止"], ["你好停", "止了"], "你好", "停止"),
        (["ab", "b"], ["xab"], "x", "ab"),
        ([], ["anything"], "anything", None),
    ],
)
def test_stop_strings_match_across_pieces(stops, pieces, expected, matched):
    assert feed_all(stops, pieces) == (expected, matched)


def test_text_that_may_start_a_stop_string_is_held_back():
    matcher = StopStringMatcher(["STOP"])
    assert matcher.feed("go ST") == "go "
    assert matcher.feed("ay") == "STay"
