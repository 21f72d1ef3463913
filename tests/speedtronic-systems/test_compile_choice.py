from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from speedtronic_systems.compile_choice import (
    CPU_COMPILE_BREAK_EVEN_STEPS,
    inductor_cpp_compiler,
    resolve_compile,
)


@pytest.fixture
def compiler(tmp_path, monkeypatch):
    """Give inductor a C++ compiler through CXX (an executable file), whatever this machine has."""
    path = tmp_path / "bin" / "c++-for-inductor"
    path.parent.mkdir()
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(0o755)
    monkeypatch.setenv("CXX", str(path))
    return path


@pytest.fixture
def no_compiler(tmp_path, monkeypatch):
    """A machine without a C++ compiler: CXX unset and nothing on PATH."""
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setenv("PATH", str(empty))


@pytest.mark.parametrize("requested", [True, False])
def test_an_explicit_setting_is_kept_everywhere(requested, no_compiler):
    # compile: true without a compiler still tries (2.0: a compile failure falls back to eager).
    for device in ("cpu", "cuda", "mps"):
        assert resolve_compile(requested, device, 1)[0] is requested


def test_auto_compiles_on_cuda_and_never_on_mps():
    assert resolve_compile("auto", "cuda:1", 1) == (True, "auto on CUDA")
    assert resolve_compile("auto", "mps", 10**6)[0] is False


def test_auto_on_cpu_compiles_only_runs_long_enough_to_pay_back(compiler):
    assert resolve_compile("auto", "cpu", CPU_COMPILE_BREAK_EVEN_STEPS)[0] is True
    compiled, why = resolve_compile("auto", "cpu", CPU_COMPILE_BREAK_EVEN_STEPS - 1)
    assert not compiled and f"{CPU_COMPILE_BREAK_EVEN_STEPS} it takes" in why
    assert resolve_compile("auto", "cpu", None) == (
        False,
        "auto: the run has no step target to pay back the compile time",
    )


def test_auto_on_cpu_stays_eager_without_a_cpp_compiler(no_compiler):
    # Found: auto said "on", then inductor's first compile failed (InvalidCxxCompiler) and the run
    # trained eagerly after a warning.
    compiled, why = resolve_compile("auto", "cpu", CPU_COMPILE_BREAK_EVEN_STEPS * 10)
    assert not compiled
    assert "no C++ compiler" in why and "install one or set CXX" in why
    if sys.platform == "linux":
        assert "(no g++ on PATH)" in why


def test_a_cxx_that_names_no_compiler_is_named_in_the_reason(tmp_path, monkeypatch):
    monkeypatch.setenv("CXX", str(tmp_path / "g++-13"))
    compiled, why = resolve_compile("auto", "cpu", CPU_COMPILE_BREAK_EVEN_STEPS)
    assert not compiled and f"(CXX={tmp_path / 'g++-13'} not found)" in why


def test_the_compiler_is_found_as_inductor_looks_for_it(compiler, tmp_path, monkeypatch):
    assert inductor_cpp_compiler() == str(compiler)
    monkeypatch.setenv("CXX", str(tmp_path / "missing" / "g++"))
    assert inductor_cpp_compiler() is None  # CXX names the one compiler inductor tries
    monkeypatch.setenv("CXX", compiler.name)
    monkeypatch.setenv("PATH", str(compiler.parent))
    assert inductor_cpp_compiler() == str(compiler)  # a bare name is looked up on PATH
    monkeypatch.delenv("CXX")
    (compiler.parent / "g++").symlink_to(compiler)
    gxx = str(compiler.parent / "g++")
    assert inductor_cpp_compiler() == (None if sys.platform in ("darwin", "win32") else gxx)


@pytest.mark.skipif(sys.platform != "linux", reason="inductor's default compiler is g++ on Linux")
def test_the_decision_agrees_with_inductor(tmp_path):
    # Ask torch itself, in a fresh process, which compiler its inductor would use.
    empty = tmp_path / "empty"
    empty.mkdir()
    probe = textwrap.dedent(
        """
        from speedtronic_systems.compile_choice import inductor_cpp_compiler
        try:
            from torch._inductor.cpp_builder import get_cpp_compiler
        except ImportError:
            raise SystemExit("unknown")
        try:
            torch_says = get_cpp_compiler()
        except Exception:
            torch_says = None
        print(torch_says is None, inductor_cpp_compiler() is None)
        """
    )
    for path in (str(empty), os.environ["PATH"]):
        env = {**{k: v for k, v in os.environ.items() if k != "CXX"}, "PATH": path}
        run = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True)
        if run.stderr.strip().endswith("unknown"):
            pytest.skip("this torch has no torch._inductor.cpp_builder.get_cpp_compiler to ask")
        assert run.returncode == 0, run.stderr
        torch_has_none, we_have_none = run.stdout.split()
        assert torch_has_none == we_have_none, path
