from __future__ import annotations

import pytest
import torch
from torch import nn
from trainer_testkit import TinyLM

from speedtronic_trainer.metrics import (
    StepMetrics,
    adamw_branch_lr,
    memory_usage_bytes,
    model_flops_per_token,
)


def plan():
    from speedtronic_systems.precision import resolve_precision

    return resolve_precision(None, torch.device("cpu"))


def test_flops_per_token_from_the_model_hook():
    model = TinyLM()
    assert model_flops_per_token(model) == 6.0 * sum(p.numel() for p in model.parameters())
    assert model_flops_per_token(nn.Linear(2, 2)) is None

    class Broken(nn.Module):
        def flops_per_token(self):
            raise NotImplementedError

    assert model_flops_per_token(Broken()) is None


def test_a_record_averages_the_logging_interval_and_names_a_probe_relative_utilization():
    metrics = StepMetrics(TinyLM(), torch.device("cpu"), plan())
    metrics.add(loss=2.0, samples=2, tokens=8, seconds=0.25)
    metrics.add(loss=1.0, samples=2, tokens=24, seconds=0.75)
    record = metrics.record(step=3, loss=1.0, lr=0.01, grad_norm=0.7)
    assert record["loss"] == (2.0 * 8 + 1.0 * 24) / 32  # token-weighted over the interval
    assert record["loss_last"] == 1.0 and record["step_time_s"] == 0.5
    assert (record["tokens_per_s"], record["samples_per_s"], record["grad_norm"]) == (32, 4, 0.7)
    # On a CPU the peak is a measured matmul probe, not a datasheet: not called MFU.
    assert "mfu" not in record and metrics.utilization_key == "mfu_vs_matmul_probe"
    if metrics.peak_flops:
        expected = metrics.flops_per_token * 32 / metrics.peak_flops
        assert record["mfu_vs_matmul_probe"] == expected
    after = metrics.record(step=4, loss=3.0, lr=0.01, grad_norm=None)  # a new, empty interval
    assert after["loss"] == 3.0 and after["tokens_per_s"] == 0.0 and "grad_norm" not in after


def test_peak_flops_probe_does_not_move_the_global_rng():
    from speedtronic_systems.precision import measured_matmul_flops

    measured_matmul_flops.cache_clear()  # make the probe really run here
    model = TinyLM()
    torch.manual_seed(0)
    expected = torch.rand(2)
    torch.manual_seed(0)
    StepMetrics(model, torch.device("cpu"), plan())
    assert torch.equal(torch.rand(2), expected)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the answer without an accelerator")
def test_memory_usage_is_none_without_an_accelerator():
    assert memory_usage_bytes() is None


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_memory_usage_counts_cuda_allocations():
    before = memory_usage_bytes()
    block = torch.empty(1 << 20, device="cuda")  # 4 MiB of float32
    assert memory_usage_bytes() >= before + block.numel() * block.element_size()


def test_the_adamw_branch_rate_is_recorded_after_lr_only_when_it_differs():
    metrics = StepMetrics(TinyLM(), torch.device("cpu"), plan())
    metrics.add(loss=1.0, samples=1, tokens=4, seconds=0.1)
    assert "lr_adamw" not in metrics.record(step=1, loss=1.0, lr=1e-3, grad_norm=None)
    metrics.add(loss=1.0, samples=1, tokens=4, seconds=0.1)
    same = metrics.record(step=2, loss=1.0, lr=1e-3, grad_norm=None, lr_adamw=1e-3)
    assert "lr_adamw" not in same
    metrics.add(loss=1.0, samples=1, tokens=4, seconds=0.1)
    own = metrics.record(step=3, loss=1.0, lr=1e-3, grad_norm=None, lr_adamw=8e-3)
    keys = list(own)
    assert keys[keys.index("lr") + 1] == "lr_adamw" and own["lr_adamw"] == 8e-3


def test_adamw_branch_lr_reads_a_hybrid_optimizer_also_under_a_wrapper():
    from types import SimpleNamespace

    def child(lr):
        return SimpleNamespace(param_groups=[{"lr": lr}])

    hybrid = SimpleNamespace(children={"muon": child(1e-3), "adamw": child(8e-3)})
    assert adamw_branch_lr(hybrid) == 8e-3
    assert adamw_branch_lr(SimpleNamespace(base=hybrid)) == 8e-3  # the cautious facade
    # Only one branch (no matrices, or no other parameters): param_groups[0] is the whole story.
    assert adamw_branch_lr(SimpleNamespace(children={"adamw": child(8e-3)})) is None
    plain = torch.optim.AdamW(TinyLM().parameters(), lr=1e-3)
    assert adamw_branch_lr(plain) is None
