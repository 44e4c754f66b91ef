"""Which build of the native kernels a process loads: this CPU's instruction sets, or AVX2's alone where
$TRITONLLM_CPU_ISA asks for them (`make test-avx2`, `bench/peers.py --isa avx2`)."""

import pytest

from tritonllm.engine.kernels import cpu_kernels


def test_the_default_build_is_for_this_cpu(monkeypatch):
    monkeypatch.delenv(cpu_kernels.ISA_ENV, raising=False)
    assert cpu_kernels.target() == ("-march=native", cpu_kernels.NAME)


def test_an_avx2_build_targets_x86_64_v3_under_a_name_of_its_own(monkeypatch):
    monkeypatch.setenv(cpu_kernels.ISA_ENV, "avx2")
    march, name = cpu_kernels.target()
    assert march == "-march=x86-64-v3"
    # its own module and build directory: loading it never replaces the native build in the cache
    assert name != cpu_kernels.NAME


def test_a_misspelt_instruction_set_is_an_error_not_the_pytorch_paths(monkeypatch):
    monkeypatch.setenv(cpu_kernels.ISA_ENV, "avx3")
    with pytest.raises(ValueError, match=cpu_kernels.ISA_ENV):
        cpu_kernels.native.__wrapped__()  # past the cache, which holds this process's build
