"""The README's performance table is the one generated from the committed benchmark results."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "tools" / "bench"
RESULTS = BENCH / "results"


@pytest.fixture
def report(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    monkeypatch.delitem(sys.modules, "report", raising=False)
    import report as module

    return module


def test_readme_report_and_results_agree(report) -> None:
    assert report.check(RESULTS) == []


def test_check_fails_on_a_hand_edited_readme(report, tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    text = (ROOT / "README.md").read_text()
    table = report.extract_table(text)
    assert table is not None and "| benchmark | command | result |" in table
    row = next(line for line in table.splitlines() if line.startswith("| trainer vs"))
    readme.write_text(text.replace(row, row.replace("**", "", 2)))
    assert any("differs" in problem for problem in report.check(RESULTS, readme=readme))


def test_check_fails_on_a_stale_package_readme(report, tmp_path: Path) -> None:
    packages = tmp_path / "packages"
    for package in report.PACKAGE_RESULTS:
        (packages / package).mkdir(parents=True)
        shutil.copy(ROOT / "packages" / package / "README.md", packages / package)
    assert report.check(RESULTS, packages=packages) == []
    readme = packages / "speedtronic-optim" / "README.md"
    readme.write_text(readme.read_text().replace("**1.", "**0.", 1))
    (problem,) = report.check(RESULTS, packages=packages)
    assert "speedtronic-optim" in problem and "--write-readme" in problem


def test_check_fails_when_results_change_after_the_report(report, tmp_path: Path) -> None:
    results = tmp_path / "results"
    shutil.copytree(RESULTS, results, ignore=shutil.ignore_patterns("quick", "*.png"))
    trainer = json.loads((results / "trainer.json").read_text())
    trainer["median_ratio"] += 0.5
    (results / "trainer.json").write_text(json.dumps(trainer))
    assert any("stale" in problem for problem in report.check(results))


def test_check_fails_when_a_measurement_contradicts_what_auto_picks(report, tmp_path) -> None:
    results = tmp_path / "results"
    shutil.copytree(RESULTS, results, ignore=shutil.ignore_patterns("quick", "*.png"))
    cpu = json.loads((results / "cpu_settings.json").read_text())
    cpu["allocator"]["caching"]["speedup_vs_default"] = 0.9
    cpu["compile"]["break_even_steps"] += 1
    (results / "cpu_settings.json").write_text(json.dumps(cpu))
    problems = report.check(results)
    assert any("auto picks caching on CPU, but" in problem for problem in problems)
    assert any("update the constant" in problem for problem in problems)


def test_steps_to_reach_interpolates_between_evaluations(monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(BENCH))
    from bench_convergence import steps_to_reach

    curve = [(0, 0, 5.0), (100, 1, 3.0), (200, 2, 2.0)]
    assert steps_to_reach(curve, 2.5) == pytest.approx(150.0)
    assert steps_to_reach(curve, 3.0) == pytest.approx(100.0)
    assert steps_to_reach(curve, 1.0) is None


def test_split_adamw_trains_the_non_matrix_parameters_at_their_own_scheduled_rate(
    monkeypatch, tmp_path: Path
) -> None:
    monkeypatch.syspath_prepend(str(BENCH))
    import torch
    from bench_convergence import split_adamw

    from speedtronic.runtime import build_runtime

    config = {
        "device": "cpu",
        "max_steps": 2,
        "output_dir": str(tmp_path),
        "model": {"vocab_size": 64, "max_seq_len": 16, "n_layer": 1, "n_head": 2, "d_model": 16},
        "data": {"num_tokens": 32, "micro_batch_size": 2, "target_batch_size": 2},
        "optimizer": {"name": "adamw", "lr": 1e-3, "weight_decay": 0.0},
        "scheduler": {"name": "constant", "warmup_steps": 0},
        "checkpoint": {"enabled": False},
        "precision": "fp32",
    }
    trainer, _ = build_runtime(config)
    split_adamw(trainer, 3e-2)
    matrices, others = trainer.optimizer.param_groups
    assert (matrices["lr"], others["lr"]) == (1e-3, 3e-2)
    assert matrices["weight_decay"] == others["weight_decay"] == 0.0
    grouped = [id(p) for group in (matrices, others) for p in group["params"]]
    assert sorted(grouped) == sorted(id(p) for p in trainer.model.parameters())
    assert len(matrices["params"]) > 0 and len(others["params"]) > 0
    before = [p.detach().clone() for p in others["params"]]
    trainer.fit()
    assert trainer.scheduler.get_last_lr() == [1e-3, 3e-2]
    assert any(not torch.equal(a, p) for a, p in zip(before, others["params"], strict=True))
    trainer.close()


def test_gpu_benchmark_runs_on_cpu_with_a_tiny_model(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.syspath_prepend(str(BENCH))
    import bench_gpu

    out = tmp_path / "gpu.json"
    args = ["--device", "cpu", "--tiny", "--steps", "3", "--no-compile", "--out", str(out)]
    assert bench_gpu.main(args) == 0
    payload = json.loads(out.read_text())
    assert payload["parameters"] > 0 and payload["tokens_per_s"] > 0
    assert payload["flops_per_token"] > 0


# CPU's rms_norm warns that a bf16 input with a float32 gain takes its unfused path.
@pytest.mark.filterwarnings("ignore:Mismatch dtype between input and weight")
def test_gpu_profile_runs_on_cpu_with_a_tiny_model(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.syspath_prepend(str(BENCH))
    import profile_gpu

    out = tmp_path / "gpu_profile.json"
    args = ["--device", "cpu", "--tiny", "--batch", "2", "--no-compile", "--out", str(out)]
    # The dtype the first block's input has in each loop: the residual stream's.
    stream_dtypes, bare_loop = [], profile_gpu._bare_loop

    def recording_bare_loop(trainer, *rest):
        block = trainer.model.blocks[0]
        if not block._forward_pre_hooks:
            block.register_forward_pre_hook(lambda _m, a: stream_dtypes.append(a[0].dtype))
        return bare_loop(trainer, *rest)

    monkeypatch.setattr(profile_gpu, "_bare_loop", recording_bare_loop)
    assert profile_gpu.main([*args, "--variants", "batch_x2", "bf16_residual"]) == 0
    monkeypatch.setattr(profile_gpu, "_bare_loop", bare_loop)
    payload = json.loads(out.read_text())
    assert payload["tokens_per_s"] > 0 and payload["profiled_ms_per_step"] > 0
    doubled, bf16 = payload["variants"]["batch_x2"], payload["variants"]["bf16_residual"]
    assert doubled["batch"] == 4 and doubled["ratio"] > 0 and not doubled["bf16_residual"]
    assert bf16["batch"] == 2 and bf16["ratio"] > 0 and bf16["bf16_residual"]
    # Plain loop, its profile and batch_x2 (8 + 30 + 5 + 8 + 30 steps) keep autocast's float32
    # stream; only bf16_residual's 38 steps start the blocks in bf16, and its hook is removed.
    assert stream_dtypes == [torch.float32] * 81 + [torch.bfloat16] * 38
    with pytest.raises(SystemExit) as refused:  # compile options need the compiled loop
        profile_gpu.main([*args, "--variants", "cuda_graphs"])
    assert refused.value.code == 2
    # A variant that fails is recorded as failed; the profile and the plain loop are kept, also
    # when the next one is stopped from outside (gpu_check.sh's time limit): written as measured.
    plain_rates, calls = profile_gpu._rates, []

    def failing_after_the_plain_loop(*rates_args):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt  # not an Exception: nothing in main() gets to write after it
        if len(calls) > 1:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory")
        return plain_rates(*rates_args)

    monkeypatch.setattr(profile_gpu, "_rates", failing_after_the_plain_loop)
    out.unlink()
    with pytest.raises(KeyboardInterrupt):
        profile_gpu.main([*args, "--variants", "batch_x2", "bf16_residual"])
    failed = json.loads(out.read_text())
    assert list(failed["variants"]) == ["batch_x2"]
    assert (
        failed["tokens_per_s"] > 0 and "OutOfMemoryError" in failed["variants"]["batch_x2"]["error"]
    )
    families = payload["ms_per_step_by_family"]
    assert families["attention"] > 0 and families["matmul"] > 0
    assert sum(families.values()) == pytest.approx(payload["profiled_ms_per_step"])
    # Beside the other results, it becomes a section of the report.
    monkeypatch.delitem(sys.modules, "report", raising=False)
    import report

    text = report.render_report({"gpu_profile": payload})
    assert "### Where its step's time goes" in text and "| batch_x2 | 4 |" in text
    assert f"| matmul | {families['matmul']:.2f} |" in text


def test_gpu_profile_chunked_loss_variants_run_on_cpu(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.syspath_prepend(str(BENCH))
    import profile_gpu

    out = tmp_path / "gpu_profile.json"
    args = ["--device", "cpu", "--tiny", "--batch", "2", "--no-compile", "--out", str(out)]
    # What each forward returned: logits for the plain loop, the loss alone for the variants.
    returned, bare_loop, models = [], profile_gpu._bare_loop, []

    def recording_bare_loop(trainer, *rest):
        if not models:
            models.append(trainer.model)
            trainer.model.register_forward_hook(lambda _m, _a, out: returned.append(sorted(out)))
        return bare_loop(trainer, *rest)

    monkeypatch.setattr(profile_gpu, "_bare_loop", recording_bare_loop)
    variants = ["chunked_loss", "chunked_loss_batch_x2"]
    assert profile_gpu.main([*args, "--variants", *variants]) == 0
    payload = json.loads(out.read_text())["variants"]
    assert [(payload[name]["batch"], payload[name]["loss_chunk_size"]) for name in variants] == [
        (2, 4096),
        (4, 4096),
    ]
    assert all(payload[name]["ratio"] > 0 for name in variants)
    # Plain loop and its profile (8 + 30 + 5 steps), then each variant's 38 steps.
    assert returned == [["logits", "loss"]] * 43 + [["loss"]] * 76
    assert models[0].config.loss_chunk_size is None  # the plain setting is back


@pytest.mark.parametrize(
    ("kernel", "expected"),
    [
        ("cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26", "attention"),
        ("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT", "matmul"),
        (
            "triton_red_fused__log_softmax__to_copy__unsafe_view_13",
            "triton (fused elementwise, norms, loss)",
        ),
        (
            "void at::native::multi_tensor_apply_kernel<FusedOptimizerTensorListMetadata>",
            "optimizer",
        ),
        ("void at::native::vectorized_elementwise_kernel<4>", "other"),
    ],
)
def test_gpu_profile_sorts_kernels_into_families(monkeypatch, kernel, expected) -> None:
    monkeypatch.syspath_prepend(str(BENCH))
    import profile_gpu

    assert profile_gpu.family(kernel) == expected


def test_parallel_row_is_built_from_the_committed_results(report) -> None:
    results = report.load(RESULTS)
    parallel = results["parallel"]
    row = next(r for r in report.table_rows(results) if r[0].startswith("data parallelism"))
    ddp = parallel["measured_training"]["ddp_world2"]["median_ratio_to_world1"]
    assert row[1] == "`python tools/bench/bench_parallel.py`"
    assert row[2].startswith(f"DDP **{ddp:.2f}x** the tokens/s (")
    # FSDP with Muon failed at 1,024 ranks: the model costs it with the counts of world 64.
    assert "FSDP2 0.41 (world 64's counts: it fails at 1,024)" in row[2]
    # parallel.json records a platform string, no CPU model: the row names its own run's load.
    assert isinstance(parallel["machine"], str)
    assert row[2].endswith("(its own run: 2 CPUs at load 16.3-21.4)")
    assert "| fsdp (world 64's counts: it fails at 256) | 0.02 | 0.73 | 0.00 |" in (
        report.render_report(results)
    )


def test_the_readme_numbers_of_generate_and_parallel_come_from_the_table(report) -> None:
    text = (ROOT / "README.md").read_text()
    prose = text.replace(report.extract_table(text), "")
    table = report.extract_table(text)
    assert "`python tools/bench/bench_generate.py`" in table and "3.0-3.6x" not in prose
    assert "`python tools/bench/bench_parallel.py`" in table and "**1.64x**" not in prose
