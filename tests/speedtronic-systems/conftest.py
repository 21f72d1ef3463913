from __future__ import annotations

import pytest

from speedtronic_systems import precision


@pytest.fixture(autouse=True)
def _fresh_fallback_log():
    """Each test sees fallbacks logged anew: the once-per-process memory is test-local."""
    precision._logged_fallbacks.clear()
    yield
    precision._logged_fallbacks.clear()


@pytest.fixture
def fake_cuda(monkeypatch):
    """Pretend to be a machine with CUDA devices; returns a setter for BF16 support and the device
    count.
    """

    state = {"bf16": True, "count": 2, "name": "NVIDIA H100 80GB HBM3"}
    monkeypatch.setattr(precision, "_cuda_available", lambda: True)
    monkeypatch.setattr(precision, "_cuda_device_count", lambda: state["count"])
    monkeypatch.setattr(precision, "_cuda_bf16_supported", lambda device: state["bf16"])
    monkeypatch.setattr(precision, "_cuda_device_name", lambda device: state["name"])
    monkeypatch.setattr(precision, "_mps_available", lambda: False)
    return state


@pytest.fixture
def fake_mps(monkeypatch):
    """Pretend to be an Apple machine: MPS present, CUDA absent."""
    monkeypatch.setattr(precision, "_cuda_available", lambda: False)
    monkeypatch.setattr(precision, "_cuda_device_count", lambda: 0)
    monkeypatch.setattr(precision, "_mps_available", lambda: True)


@pytest.fixture
def bare_cpu(monkeypatch):
    """Pretend to be a CPU-only machine, whatever this one has."""
    monkeypatch.setattr(precision, "_cuda_available", lambda: False)
    monkeypatch.setattr(precision, "_cuda_device_count", lambda: 0)
    monkeypatch.setattr(precision, "_mps_available", lambda: False)
