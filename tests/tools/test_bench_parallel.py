"""The scaling model of tools/bench/bench_parallel.py: ring costs, the fit, the DiLoCo round."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "tools" / "bench" / "bench_parallel.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_parallel", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def test_ring_all_reduce_sends_twice_the_payload_in_the_limit(bench):
    assert bench.wire_fraction("all_reduce", 2) == 1.0
    assert bench.wire_fraction("all_reduce", 1024) == pytest.approx(2 * 1023 / 1024)
    assert bench.wire_fraction("all_gather", 8) == bench.wire_fraction("reduce_scatter", 8) == 7 / 8
    assert bench.ring_steps("all_reduce", 8) == 14 and bench.ring_steps("all_gather", 8) == 7
    assert bench.collective_time("all_reduce", 3, 1e9, 1, bench.DATACENTER) == 0.0


def test_collective_time_is_latency_plus_bandwidth(bench):
    link = bench.Link(alpha=1e-3, beta=1e9)
    # 2 all-gathers of 8 GB over 4 ranks: 2 x 3 steps of 1 ms, and 3/4 of 8 GB at 1 GB/s.
    assert bench.collective_time("all_gather", 2, 8e9, 4, link) == pytest.approx(6e-3 + 6.0)


def test_fit_recovers_latency_and_bandwidth(bench):
    a, b = 2e-4, 1 / 3e9
    points = [(x, a + b * x) for x in (1e3, 1e5, 1e7)]
    assert bench.fit_latency_bandwidth(points) == pytest.approx((a, b))
    with pytest.raises(ValueError):
        bench.fit_latency_bandwidth([(1e3, 1.0), (1e3, 2.0)])


def test_link_from_a_world_2_fit_inverts_the_ring_formulas(bench):
    link = bench.Link(alpha=1e-4, beta=2e9)
    for kind in bench.MEASURED_KINDS:
        small, large = 1e3, 1e8
        points = [(x, bench.collective_time(kind, 1, x, 2, link)) for x in (small, large)]
        fitted = bench.link_from_fit(kind, *bench.fit_latency_bandwidth(points))
        assert fitted.alpha == pytest.approx(link.alpha)
        assert fitted.beta == pytest.approx(link.beta)
    with pytest.raises(ValueError, match="no bandwidth"):
        bench.link_from_fit("all_reduce", 1e-4, -1e-12)


def test_scaling_rows_compare_the_schemes(bench):
    param_bytes = 4e6
    ddp = {"all_reduce": (2, param_bytes)}
    fsdp = {"all_gather": (10, 2 * param_bytes), "reduce_scatter": (5, param_bytes)}
    counts = {"ddp": {w: ddp for w in bench.WORLDS}, "fsdp": {w: fsdp for w in bench.WORLDS}}
    links = {"wan": {kind: bench.WAN for kind in bench.MEASURED_KINDS}}
    rows = bench.scaling_rows(counts, param_bytes, compute_s=0.5, inner_steps=500, links=links)
    by = {(row["world"], row["scheme"]): row for row in rows}
    assert len(rows) == 3 * len(bench.WORLDS)
    assert by[(8, "ddp")]["wire_bytes_per_step"] == pytest.approx(2 * 7 / 8 * param_bytes)
    assert by[(8, "diloco")]["wire_bytes_per_step"] == pytest.approx(2 * param_bytes / 500)
    for world in bench.WORLDS:
        eff = {s: by[(world, s)]["wan"]["efficiency"] for s in ("ddp", "fsdp", "diloco")}
        assert eff["diloco"] > eff["ddp"] > eff["fsdp"]
    # The master's link carries every delta: DiLoCo's cost grows with the number of nodes.
    assert by[(1024, "diloco")]["wan"]["comm_s"] > by[(8, "diloco")]["wan"]["comm_s"]
    assert bench.diloco_round_time(param_bytes, 1, bench.WAN) == 0.0


def test_counts_for_model_borrows_from_the_nearest_size_that_ran(bench):
    ran = {"all_gather": (50, 3e7)}
    counted = {"fsdp": {8: ran, 128: ran, 256: {"error": "RuntimeError: sharding"}}}
    used, notes = bench.counts_for_model(counted, worlds=(8, 16, 256, 1024))
    assert used["fsdp"][16] is ran and used["fsdp"][1024] is ran
    assert 8 not in notes["fsdp"]
    assert notes["fsdp"][16] == {"counts_from_world": 8, "error": None}
    assert notes["fsdp"][256] == {"counts_from_world": 128, "error": "RuntimeError: sharding"}
    assert notes["fsdp"][1024]["counts_from_world"] == 128
    with pytest.raises(ValueError, match="every counted world size"):
        bench.counts_for_model({"ddp": {8: {"error": "x"}}})
