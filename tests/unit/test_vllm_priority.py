"""vLLM's `priority` (lower runs earlier, any integer, 0 by default) onto the engine's ranks 1 (first) .. 5 (last,
every request's default): 5 + priority, within them."""

from __future__ import annotations

import pytest

from tritonllm.shim.vllm_fields import VLLMFields


@pytest.mark.parametrize(("vllm", "rank"), [(None, None), (0, 5), (3, 5), (-1, 4), (-4, 1), (-100, 1)])
def test_vllms_priority_keeps_its_order_on_the_engines_ranks(vllm, rank):
    assert VLLMFields(priority=vllm).engine_priority == rank
