"""The allocator preloaded into tritonserver and its stubs (launcher/allocator.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tritonllm.launcher.allocator import SETTING, allocator_library, with_allocator
from tritonllm.launcher.tritonserver import server_env


def test_tcmalloc_goes_in_front_of_a_preload_already_there(monkeypatch):
    library = allocator_library({})
    assert library is not None, "libtcmalloc-minimal4 is missing: `make install` installs it"
    env = with_allocator({"LD_PRELOAD": "/opt/a.so:/opt/b.so"})
    assert env["LD_PRELOAD"] == f"{library} /opt/a.so /opt/b.so"
    assert with_allocator(env) == env  # not twice
    monkeypatch.delenv(SETTING, raising=False)
    assert server_env()["LD_PRELOAD"].split()[0] == str(library)


def test_system_keeps_glibc_and_a_path_is_preloaded_as_given(tmp_path):
    assert with_allocator({SETTING: "system", "LD_PRELOAD": "/opt/a.so"})["LD_PRELOAD"] == "/opt/a.so"
    assert "LD_PRELOAD" not in with_allocator({SETTING: "system"})
    own = tmp_path / "libown.so"
    own.write_bytes(b"")
    assert with_allocator({SETTING: str(own)})["LD_PRELOAD"] == str(own)


def test_a_missing_library_is_an_error_naming_the_setting(tmp_path):
    with pytest.raises(FileNotFoundError, match=SETTING):
        with_allocator({SETTING: str(tmp_path / "nothing.so")})


RELEASE_SCRIPT = """
import sys
from tritonllm.common.memory import release_free_memory

def rss_mb():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20

buffers = [bytearray(8 << 20) for _ in range(40)]  # 320 MB in pieces, as a model's load frees them
del buffers
held = rss_mb()
if sys.argv[1] == "release":
    release_free_memory()
print(held, rss_mb())
"""


@pytest.mark.parametrize("allocator", ["tcmalloc", "system"])
def test_what_a_load_freed_goes_back_to_the_system(allocator):
    env = with_allocator({**os.environ, SETTING: allocator})
    run = [sys.executable, "-c", RELEASE_SCRIPT, "release"]
    held, after = map(float, subprocess.run(run, env=env, capture_output=True, text=True, check=True).stdout.split())
    assert after < held - 250 or held < 100, (held, after)  # glibc hands large blocks back by itself
    assert after < 200, after


def test_serve_refuses_a_missing_allocator_before_starting_anything(tiny_model_dir, tmp_path, monkeypatch, capfd):
    from tritonllm.launcher import cli

    monkeypatch.setenv(SETTING, str(tmp_path / "nothing.so"))
    assert cli.main(["serve", "--model-dir", str(tiny_model_dir)]) == 2
    err = capfd.readouterr().err
    assert f"{SETTING}={tmp_path / 'nothing.so'}: no such library" in err and "starting tritonserver" not in err


LOAD_SCRIPT = """
import ctypes, sys
from tritonllm.engine.scheduling.block_manager import BlockManager
from tritonllm.engine.execution.model_runner import ModelRunner

runner = ModelRunner(sys.argv[1], BlockManager(16, 8, prefix_caching=False), "float32", "cpu")
held = ctypes.c_size_t()
ctypes.CDLL(None).MallocExtension_GetNumericProperty(b"tcmalloc.pageheap_free_bytes", ctypes.byref(held))
print(held.value)
"""


def test_a_model_load_hands_back_what_it_freed_under_tcmalloc(tiny_model_dir):
    """Every process that loads a model (the llm's, each tensor-parallel rank's) releases through the allocator it
    runs on: glibc's malloc_trim alone left tcmalloc holding what the load freed (4 MB on the demo model; a rank's
    dropped shards on a real one)."""
    env = with_allocator({**os.environ, SETTING: "tcmalloc"})
    run = [sys.executable, "-c", LOAD_SCRIPT, str(tiny_model_dir)]
    held = int(subprocess.run(run, env=env, capture_output=True, text=True, check=True).stdout.split()[-1])
    assert held < 2 << 20, f"tcmalloc holds {held / 2**20:.1f} MB of freed pages after the load"
