"""The llm's settings: one declaration each (engine/config.py), from which config.pbtxt's values, the checks and
`tritonllm serve`'s flags follow."""

from __future__ import annotations

import json
import re

import pytest
from conftest import REPOSITORY

from tritonllm.engine.config import AUTO_KV_SHARE, OVERRIDES_ENV, EngineConfig, available_memory, environment_overrides
from tritonllm.engine.engine import LLMEngine
from tritonllm.launcher import cli, options


def pbtxt_parameters() -> dict[str, str]:
    text = (REPOSITORY / "llm" / "config.pbtxt").read_text()
    return dict(re.findall(r'\{ key: "(\w+)" value: \{ string_value: "([^"]*)" \} \}', text))


def test_config_pbtxt_names_every_setting_with_its_declared_default():
    shipped = pbtxt_parameters()
    for setting in EngineConfig.settings():
        assert setting.name in shipped, f"llm/config.pbtxt lacks the parameter {setting.name}"
    # parsed from the file, the settings equal the declared defaults
    assert EngineConfig.from_parameters("m", shipped) == EngineConfig("m")


def test_serve_has_a_flag_for_every_setting_and_hands_them_over_checked(monkeypatch):
    parser_args = ["serve", "--max-num-seqs", "8", "--no-enable-prefix-caching", "--kv-cache-memory", "64MiB"]
    args = build_serve_args(parser_args)
    overrides = options.engine_overrides(args)
    assert overrides == {"max_num_seqs": "8", "enable_prefix_caching": "false", "kv_cache_memory": "64MiB"}
    monkeypatch.setenv(OVERRIDES_ENV, json.dumps(overrides))
    config = EngineConfig.from_parameters("m", {**pbtxt_parameters(), **environment_overrides()})  # flags win
    assert (config.max_num_seqs, config.enable_prefix_caching, config.kv_cache_memory) == (8, False, "64MiB")
    for setting in EngineConfig.settings():
        assert f"--{setting.name.replace('_', '-')}" in serve_help()
    with pytest.raises(ValueError, match="max_num_seqs"):
        options.engine_overrides(build_serve_args(["serve", "--max-num-seqs", "0"]))


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"max_num_seqs": "0"}, "max_num_seqs"),
        ({"dtype": "float64"}, "dtype"),
        ({"device": "gpu"}, "device"),
        ({"enable_prefix_caching": "maybe"}, "enable_prefix_caching"),
        ({"num_kv_blocks": "many"}, "num_kv_blocks"),
        ({"prefill_slowdown": "0.5"}, "prefill_slowdown"),
        ({"engine_nice": "-30"}, "engine_nice"),
        ({"stream_interval": "0"}, "stream_interval"),
        ({"kv_cache_memory": "lots"}, "kv_cache_memory"),
    ],
)
def test_a_bad_value_is_refused_naming_the_setting(values, named):
    with pytest.raises(ValueError, match=named):
        EngineConfig.from_parameters("m", values)


def test_placeholders_and_unknown_parameters_leave_the_defaults():
    assert EngineConfig.from_parameters("m", {"max_num_seqs": " ", "tool_call_parser": "auto"}) == EngineConfig("m")


def test_the_kv_cache_can_be_sized_by_memory(tiny_model_dir):
    by_blocks = LLMEngine(EngineConfig(str(tiny_model_dir), num_kv_blocks=40, block_size=8))
    cache = by_blocks.runner.cache
    per_block = sum(t.numel() * t.element_size() for t in (*cache.key, *cache.value)) // 40
    by_memory = LLMEngine(EngineConfig(str(tiny_model_dir), kv_cache_memory=str(per_block * 40), block_size=8))
    assert by_memory.blocks.num_blocks == 40
    assert EngineConfig("m", kv_cache_memory="1MiB").kv_blocks(1024, 8192) == 1024
    assert 0 < EngineConfig("m", kv_cache_memory="0.01").kv_blocks(1 << 20, 8192)  # a share of the free memory
    with pytest.raises(ValueError, match="kv_cache_memory"):
        EngineConfig("m", kv_cache_memory="1KiB").kv_blocks(4096, 8192)


def test_by_default_the_kv_cache_holds_max_num_seqs_whole_contexts_within_a_tenth_of_memory():
    config = EngineConfig("m", max_num_seqs=8, block_size=16)
    assert config.num_kv_blocks == 0
    assert config.kv_blocks(1024, 1000) == 500  # 8 x 1000 tokens in blocks of 16
    assert config.kv_blocks(1024, 1001) == 501  # a block more for the last tokens
    available = available_memory("cpu")
    huge = config.kv_blocks(1 << 20, 1 << 40)  # more than memory holds: a tenth of what is available
    assert abs(huge - AUTO_KV_SHARE * available / (1 << 20)) < 0.01 * huge + 2
    assert EngineConfig("m", num_kv_blocks=7).kv_blocks(1024, 1000) == 7


def build_serve_args(argv: list[str]):
    parser = cli.build_parser()
    return parser.parse_args(argv)


def serve_help() -> str:
    return cli.build_parser()._subparsers._group_actions[0].choices["serve"].format_help()
