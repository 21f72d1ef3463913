"""tools/bench/bench_loss_head.py runs, times both heads and sees the chunked one's smaller peak."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "tools" / "bench"


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="peak memory needs Linux")
def test_loss_head_benchmark_measures_time_and_peak_memory(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.syspath_prepend(str(BENCH))
    import bench_loss_head

    out = tmp_path / "loss_head.json"
    shape = ["--rows", "1024", "--vocab", "8192", "--d-model", "64", "--chunks", "128"]
    args = [*shape, "--rounds", "1", "--precisions", "fp32", "--threads", "1", "--out", str(out)]
    assert bench_loss_head.main(args) == 0
    results = json.loads(out.read_text())["results"]
    assert list(results) == ["fp32 plain", "fp32 128"]
    plain, chunked = results["fp32 plain"], results["fp32 128"]
    assert plain["time_vs_plain"] == 1.0 and chunked["time_vs_plain"] > 0
    # Plain: three (1024, 8192) float32 tensors, 32 MiB each, live at once; chunked: a few of
    # (128, 8192), 4 MiB each, and the head's 2 MiB gradient.
    assert plain["peak_mib"] > 64 and chunked["peak_mib"] < plain["peak_mib"] / 2
