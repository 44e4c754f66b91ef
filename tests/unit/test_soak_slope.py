"""bench/soak.py's memory check: a process whose RSS keeps climbing after the warm-up fails the soak, however small
its growth against the start; one that only grows while it warms up passes."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import soak  # noqa: E402


def _soak(rss_at) -> soak.Soak:
    """An hour of samples every 10 s; `rss_at(minute)`: each process's RSS then."""
    run = soak.Soak(minutes=60, kv_blocks_used_idle=0, healthy_after=True)
    run.rss_mb = [(t, rss_at(t / 60)) for t in range(0, 3601, 10)]
    return run


def _slope_check(run: soak.Soak) -> tuple[str, bool]:
    return next((text, ok) for text, ok in soak.checks(run) if text.startswith("RSS slope"))


def test_a_process_that_keeps_growing_a_megabyte_a_minute_fails_though_its_end_is_within_ten_percent() -> None:
    run = _soak(lambda m: {"tritonserver": 120 + 1.0 * m, "llm stub": 3300.0})
    text, ok = _slope_check(run)
    assert not ok and "tritonserver +1.00" in text
    assert next(ok for text, ok in soak.checks(run) if text.startswith("RSS after warm-up"))  # the old bound passes


def test_growth_in_the_warm_up_alone_passes() -> None:
    run = _soak(lambda m: {"tritonserver": 60 + min(m, 20.0), "llm stub": 3300.0 + (m % 3 < 1.5)})
    text, ok = _slope_check(run)
    assert ok, text
