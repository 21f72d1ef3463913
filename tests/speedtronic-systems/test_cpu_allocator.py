from __future__ import annotations

import io
import logging
import os
import subprocess
import sys
import textwrap

import pytest

from speedtronic_systems import cpu_allocator
from speedtronic_systems.cpu_allocator import apply_cpu_allocator, resolve_cpu_allocator

glibc_only = pytest.mark.skipif(
    not cpu_allocator.caching_available(), reason="the caching allocator needs glibc on Linux"
)


@pytest.fixture(autouse=True)
def _caching_off(monkeypatch):
    """Each test starts as a process that has not switched malloc (restored afterwards)."""
    monkeypatch.setattr(cpu_allocator, "_enabled", False)


@pytest.fixture
def log():
    stream = io.StringIO()
    logger = logging.getLogger(f"test_cpu_allocator.{id(stream)}")
    logger.addHandler(logging.StreamHandler(stream))
    logger.setLevel(logging.INFO)
    logger.propagate = False
    return logger, stream


@pytest.fixture
def no_glibc(monkeypatch):
    monkeypatch.setattr(cpu_allocator, "caching_available", lambda: False)


@glibc_only
def test_auto_caches_for_cpu_training_only():
    assert resolve_cpu_allocator("auto", "cpu") == (True, "auto: training on CPU with glibc")
    for device in ("cuda:0", "mps"):
        wanted, why = resolve_cpu_allocator("auto", device)
        assert not wanted and device.split(":")[0] in why


@glibc_only
def test_an_explicit_choice_holds_on_every_device():
    for device in ("cpu", "cuda", "mps"):
        assert resolve_cpu_allocator("caching", device)[0] is True
        assert resolve_cpu_allocator("default", device) == (False, "set in the config")


def test_without_glibc_nothing_caches(no_glibc):
    for requested in ("auto", "caching"):
        wanted, why = resolve_cpu_allocator(requested, "cpu")
        assert not wanted and "needs glibc malloc on Linux" in why


def test_caching_asked_for_where_it_is_unavailable_warns_and_runs_default(no_glibc, log):
    logger, stream = log
    assert apply_cpu_allocator("caching", "cpu", logger) is False
    assert "run.cpu_allocator: caching is not available (needs glibc" in stream.getvalue()


@glibc_only
def test_auto_logs_its_choice_and_switches_malloc(log):
    logger, stream = log
    assert apply_cpu_allocator("auto", "cpu", logger) is True
    assert cpu_allocator.caching_enabled()
    assert "cpu_allocator: auto -> caching (auto: training on CPU with glibc)" in stream.getvalue()
    assert apply_cpu_allocator("auto", "cuda", logger) is True  # process-wide: still on
    assert "cpu_allocator: auto -> default" in stream.getvalue()


def test_default_after_caching_says_it_cannot_switch_back(monkeypatch, log):
    logger, stream = log
    monkeypatch.setattr(cpu_allocator, "_enabled", True)
    assert apply_cpu_allocator("default", "cpu", logger) is True
    assert "cannot be switched back; start a new process" in stream.getvalue()


@glibc_only
def test_a_refused_mallopt_is_a_warning_not_a_failure(monkeypatch, log):
    logger, stream = log

    def refuse():
        raise OSError("glibc mallopt(-3, 33554432) refused the setting")

    monkeypatch.setattr(cpu_allocator, "enable_caching", refuse)
    assert apply_cpu_allocator("caching", "cpu", logger) is False
    assert "refused the setting; using the default" in stream.getvalue()


# In a fresh process (the setting is process-wide): touch three 8 MiB blocks and free them, again
# and again, as a training step does with its activations. glibc's defaults trim the freed top of
# the heap, so every cycle faults all 6,144 pages in again; caching keeps them after the first.
_WORKLOAD = textwrap.dedent(
    """
    import ctypes, resource
    from speedtronic_systems.cpu_allocator import caching_enabled, enable_caching

    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    SIZE = 8 << 20

    def faults_per_cycle(cycles):
        counts = []
        for _ in range(cycles):
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            blocks = [libc.malloc(SIZE) for _ in range(3)]
            for block in blocks:
                ctypes.memset(block, 1, SIZE)
            for block in blocks:
                libc.free(block)
            counts.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
        return counts

    default = faults_per_cycle(3)
    assert not caching_enabled()
    enable_caching()
    enable_caching()  # a second call changes nothing
    print(default[-1], *faults_per_cycle(3)[1:], caching_enabled())
    """
)


@glibc_only
def test_caching_keeps_freed_blocks_that_the_defaults_give_back():
    done = subprocess.run(
        [sys.executable, "-c", _WORKLOAD], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    default, *caching, enabled = done.stdout.split()
    pages = 3 * (8 << 20) // os.sysconf("SC_PAGE_SIZE")
    assert int(default) >= pages * 0.9, done.stdout  # handed back and faulted in every cycle
    assert [int(count) for count in caching] == [0, 0], done.stdout
    assert enabled == "True"
