"""The benchmarks' methodology: run order, run selection and what a run records."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

BENCH = Path(__file__).resolve().parents[2] / "tools" / "bench"


@pytest.fixture
def bench(monkeypatch):
    """Import a benchmark module fresh from tools/bench (each test may patch it)."""
    monkeypatch.syspath_prepend(str(BENCH))

    def load(name: str):
        monkeypatch.delitem(sys.modules, name, raising=False)
        return __import__(name)

    return load


def test_trainer_bench_alternates_which_side_runs_first(bench, monkeypatch, tmp_path) -> None:
    bench_trainer = bench("bench_trainer")
    calls: list[str] = []
    monkeypatch.setattr(bench_trainer, "run_trainer", lambda *a: calls.append("T") or 2.0)
    monkeypatch.setattr(bench_trainer, "run_manual", lambda *a: calls.append("M") or 1.0)
    out = tmp_path / "trainer.json"
    bench_trainer.main(["--rounds", "4", "--steps", "1", "--out", str(out)])
    timed = calls[2:]  # after the one untimed warm-up call of each
    assert timed == ["T", "M", "M", "T", "T", "M", "M", "T"]
    assert json.loads(out.read_text())["ratio_per_round"] == [2.0] * 4


def test_convergence_sweep_never_takes_a_diverged_run_as_the_best(bench, monkeypatch) -> None:
    bench_convergence = bench("bench_convergence")
    loss = {2e-3: math.nan, 4e-3: 1.5, 8e-3: 1.6}

    def train_point(name, lr, other_lr, steps, batches, eval_every, shuffle=True):
        return {"lr": lr, "other_lr": other_lr, "final_val_loss": loss[lr], "tokens_per_s": 1.0}

    monkeypatch.setattr(bench_convergence, "train_point", train_point)
    runs = bench_convergence.sweep({"muon": (2e-3, 4e-3, 8e-3)}, (8,), 10, [], 5)
    assert runs["muon"][-1]["lr"] == 4e-3  # the non-matrix sweep ran at the best finite lr
    assert bench_convergence.best_run(runs["muon"])["lr"] == 4e-3


def test_the_best_of_runs_that_all_diverged_is_named_as_such(bench) -> None:
    benchlib = bench("benchlib")
    with pytest.raises(ValueError, match="every run diverged"):
        benchlib.best_run([{"final_val_loss": math.nan}, {"final_val_loss": math.inf}])


def test_a_rerun_benchmark_keeps_the_commit_each_result_was_measured_at(
    bench, monkeypatch, tmp_path
) -> None:
    run_all = bench("run_all")
    monkeypatch.setattr(run_all, "ensure_corpus", lambda: None)
    monkeypatch.setattr(run_all.subprocess, "run", lambda *a, **k: SimpleNamespace(returncode=0))
    for commit, name in (("aaa1111", "trainer"), ("bbb2222", "data")):
        monkeypatch.setattr(run_all, "git_commit", lambda commit=commit: commit)
        assert run_all.main(["--only", name, "--results", str(tmp_path)]) == 0
    run = json.loads((tmp_path / "run.json").read_text())
    assert run["benchmarks"]["trainer"]["commit"] == "aaa1111"
    assert run["benchmarks"]["data"]["commit"] == "bbb2222"
    assert run["commits"] == ["aaa1111", "bbb2222"]


def test_a_rerun_on_another_machine_keeps_the_tables_machine(bench, monkeypatch, tmp_path) -> None:
    run_all = bench("run_all")
    monkeypatch.setattr(run_all, "ensure_corpus", lambda: None)
    monkeypatch.setattr(run_all.subprocess, "run", lambda *a, **k: SimpleNamespace(returncode=0))
    monkeypatch.setattr(run_all, "git_commit", lambda: "aaa1111")
    for cpu in ("Xeon", "EPYC"):
        monkeypatch.setattr(run_all, "machine_info", lambda cpu=cpu: {"cpu": cpu})
        assert run_all.main(["--only", "data", "--results", str(tmp_path)]) == 0
    assert json.loads((tmp_path / "run.json").read_text())["machine"] == {"cpu": "Xeon"}
    # data.json names no CPU (its "machine" is the architecture): its row still names EPYC
    (tmp_path / "data.json").write_text((BENCH / "results" / "data.json").read_text())
    report = bench("report")
    row = next(r for r in report.table_rows(report.load(tmp_path)) if "build_dataloader" in r[0])
    assert row[2].endswith(" (on EPYC, ? CPUs)")


@pytest.fixture
def results(tmp_path):
    """A copy of the committed results to edit."""
    import shutil

    copy = tmp_path / "results"
    shutil.copytree(BENCH / "results", copy, ignore=shutil.ignore_patterns("quick", "*.png"))
    return copy


def test_peers_row_shows_the_spread_of_the_paired_rounds(bench, results) -> None:
    report = bench("report")
    peers = json.loads((results / "peers.json").read_text())
    ours = peers["frameworks"]["speedtronic"]["steady_per_round"]
    lightning = peers["frameworks"]["lightning"]
    paired = (0.9, 1.1, 1.0, 1.0)
    lightning["steady_per_round"] = [v / r for v, r in zip(ours, paired, strict=True)]
    (results / "peers.json").write_text(json.dumps(peers))
    row = report._peers_row(report.load(results)["peers"])[2]
    assert "lightning" in row and "rounds 0.90-1.10" in row


def test_convergence_row_reads_the_tokens_per_step_from_the_runs(bench, results) -> None:
    report = bench("report")
    convergence = json.loads((results / "convergence.json").read_text())
    for runs in convergence["runs"].values():
        for run in runs:
            run["tokens"] = run["steps"] * 4096
    (results / "convergence.json").write_text(json.dumps(convergence))
    row = report._convergence_row(report.load(results)["convergence"])
    assert "400 steps x 4k tokens" in row[0]


def test_precision_bench_alternates_which_precision_runs_first(bench, monkeypatch) -> None:
    import torch

    bench_precision = bench("bench_precision")
    order: list[bool] = []

    def run(fn, bf16):
        order.append(bf16)
        return 1.0, torch.ones(1)

    monkeypatch.setattr(bench_precision, "run", run)
    bench_precision.measure("case", lambda: torch.ones(1), 4)
    assert order[2:] == [False, True, True, False, False, True, True, False]


def test_peers_count_speedtronic_close_end_to_end_not_in_steady_state(bench, monkeypatch) -> None:
    bench_peers = bench("bench_peers")
    ticks = iter([0.0, 1.0, 2.0, 100.0, 101.0])  # start, warm, last step, inside close(), end
    monkeypatch.setattr(bench_peers.time, "perf_counter", lambda: next(ticks))

    class Trainer:
        def fit(self, steps):
            return None

        def close(self):
            bench_peers.time.perf_counter()  # a teardown that takes 98 s of the fake clock

    monkeypatch.setattr(bench_peers, "build_runtime", lambda config: (Trainer(), None))
    clock = bench_peers.run_speedtronic({}, [], 60, record=False)
    result = clock.result(60, tokens_per_step=10)
    assert result["steady_tokens_per_s"] == (60 - bench_peers.WARMUP) * 10 / 1.0
    assert result["end_to_end_tokens_per_s"] == 60 * 10 / 101.0
    assert result["teardown_s"] == 99.0


def test_a_row_measured_on_another_cpu_names_it(bench, results) -> None:
    report = bench("report")
    loaded = report.load(results)
    table_cpu = loaded["run"]["machine"]["cpu"]
    head = {
        "machine": {"cpu": table_cpu, "cpus": 2},
        "rows": 4096,
        "d_model": 768,
        "vocab": 50257,
        "rounds": 5,
        "results": {
            "fp32 plain": {"ms": 100.0, "time_vs_plain": 1.0, "peak_mib": 2366.0},
            "fp32 1024": {"ms": 140.0, "time_vs_plain": 1.4, "peak_mib": 758.0},
            "fp32 4096": {"ms": 110.0, "time_vs_plain": 1.1, "peak_mib": 2000.0},
            "bf16 plain": {"ms": 80.0, "time_vs_plain": 1.0, "peak_mib": 2435.0},
            "bf16 1024": {"ms": 93.0, "time_vs_plain": 1.16, "peak_mib": 922.0},
        },
    }
    loaded["loss_head"] = head
    row = next(r for r in report.table_rows(loaded) if "loss_chunk_size" in r[0])
    assert "loss_chunk_size` 1024" in row[0] and "4096 rows x 768 -> 50257" in row[0]
    assert row[2] == (
        "fp32: peak **758 MiB** instead of 2,366 at **1.40x** the time; "
        "bf16: peak **922 MiB** instead of 2,435 at **1.16x** the time"
    )
    head["machine"] = {"cpu": "AMD EPYC", "cpus": 2}
    row = next(r for r in report.table_rows(loaded) if "loss_chunk_size" in r[0])
    assert row[2].endswith(" the time (on AMD EPYC, 2 CPUs)")
    assert "| fp32 | chunk 4096 | 110.0 | 1.10x | 2,000 |" in report.render_report(loaded)


def _chosen(run_all, monkeypatch, tmp_path, *argv: str) -> dict[str, list[str]]:
    """Return the benchmarks run_all runs for argv, each with its arguments (nothing runs)."""
    commands: list[list[str]] = []

    def run(command, **kwargs):
        commands.append(command)
        return SimpleNamespace(returncode=0)

    monkeypatch.setattr(run_all, "ensure_corpus", lambda: None)
    monkeypatch.setattr(run_all, "git_commit", lambda: "aaa1111")
    monkeypatch.setattr(run_all.subprocess, "run", run)
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)  # also on a GPU machine
    assert run_all.main([*argv, "--results", str(tmp_path)]) == 0
    return {Path(c[1]).stem.removeprefix("bench_"): c[2:] for c in commands if "bench_" in c[1]}


def test_the_long_benchmarks_run_only_when_named(bench, monkeypatch, tmp_path) -> None:
    run_all = bench("run_all")
    full = _chosen(run_all, monkeypatch, tmp_path)
    assert "generate" in full and not {"diloco", "parallel", "gpu"} & set(full)
    quick = _chosen(run_all, monkeypatch, tmp_path, "--quick")
    assert quick["generate"][:4] == ["--new-tokens", "32", "--rounds", "2"]
    assert not {"diloco", "parallel"} & set(quick)
    alone = _chosen(run_all, monkeypatch, tmp_path, "--only", "parallel")
    assert alone == {"parallel": ["--output", str(tmp_path / "parallel.json")]}
    assert _chosen(run_all, monkeypatch, tmp_path, "--only", "generate")["generate"] == [
        "--threads",
        "1",
        "--out",
        str(tmp_path / "generate.json"),
    ]
