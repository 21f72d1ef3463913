from __future__ import annotations

import pytest

from speedtronic_systems.compile_choice import CPU_COMPILE_BREAK_EVEN_STEPS, resolve_compile


@pytest.mark.parametrize("requested", [True, False])
def test_an_explicit_setting_is_kept_everywhere(requested):
    for device in ("cpu", "cuda", "mps"):
        assert resolve_compile(requested, device, 1)[0] is requested


def test_auto_compiles_on_cuda_and_never_on_mps():
    assert resolve_compile("auto", "cuda:1", 1) == (True, "auto on CUDA")
    assert resolve_compile("auto", "mps", 10**6)[0] is False


def test_auto_on_cpu_compiles_only_runs_long_enough_to_pay_back():
    assert resolve_compile("auto", "cpu", CPU_COMPILE_BREAK_EVEN_STEPS)[0] is True
    compiled, why = resolve_compile("auto", "cpu", CPU_COMPILE_BREAK_EVEN_STEPS - 1)
    assert not compiled and f"{CPU_COMPILE_BREAK_EVEN_STEPS} it takes" in why
    assert resolve_compile("auto", "cpu", None) == (
        False,
        "auto: the run has no step target to pay back the compile time",
    )
