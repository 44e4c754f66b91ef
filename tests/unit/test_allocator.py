"""The allocator preloaded into tritonserver and its stubs (runtime/allocator.py)."""

from __future__ import annotations

import pytest

from tritonllm.runtime.allocator import SETTING, allocator_library, with_allocator
from tritonllm.runtime.tritonserver import server_env


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
